"""One device slot of a plan, hosting a :class:`RoleWorker` for every role placed there.

On Ray it is the body of one actor per slot; the LocalExecutor holds one per
pool in its own process (:meth:`SlotWorker.setup_local`: no process groups,
one device per pool, and a cross-pool weight sync is a copy through an
in-process mailbox). Both executors call the same methods.

Lifecycle on Ray: the executor creates the actor in its pool's placement group, asks
it where it computes (:meth:`SlotWorker.probe`: CUDA when Ray gave it a GPU that
torch can see, else CPU; optionally pinned to cores), then calls
:meth:`SlotWorker.setup` on every slot at once: each joins the
``torch.distributed`` world (gloo, with the configured collective timeout, so a
dead peer raises instead of hanging), creates the topology's process groups in
the same order (NCCL for groups of CUDA slots, gloo otherwise), seeds torch
identically (so models built from a seed are identical replicas), and builds
its engines. Afterwards every method returns ``(result, (start, end))`` with
wall-clock times, from which the executor draws one trace track per worker.
"""
from __future__ import annotations

import datetime
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist

from ..errors import ExecutionError
from ..batch import Batch
from .engines.lora import synced_weights
from .roles import RoleSpec
from .weight_sync import DEFAULT_BUCKET_BYTES, SyncStats, broadcast_receive, broadcast_send, stream_into, tensor_specs
from .worker import RoleWorker
from .slot_engines import build_slot_engines
from .topology import Slot, pool_group

__all__ = ["SlotWorker"]

SEED_STRIDE = 1_000_003
"""Rank r of a data-parallel rollout samples with ``seed + r * SEED_STRIDE``: ranks draw independent noise."""


class SlotWorker:
    """One slot (see the module docstring); ``specs`` holds a RoleSpec for each role the slot hosts."""

    def __init__(self, slot: Slot, specs: Mapping[str, RoleSpec], *, timeout_s: float = 60.0,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, seed: int = 0):
        self.slot = slot
        self.specs = dict(specs)
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.bucket_bytes = bucket_bytes
        self.seed = seed
        self.groups: dict[str, Any] = {}
        self.group_devices: dict[str, torch.device] = {}
        self.worker: RoleWorker | None = None
        self.device = "cpu"
        self.mailbox: dict[str, list] | None = None
        """Local slots: cross-pool weight syncs in this process (sync group -> the sender's tensors)."""

    # -- set-up ------------------------------------------------------------------------------
    def probe(self, use_gpu: bool, cpus: Sequence[int] = (), threads: int | None = None) -> str:
        """Pin this process to ``cpus`` (if any) and say where it computes: 'cuda:0' or 'cpu'.

        torch threads: one per pinned core, else ``threads`` (the slot's CPU share from its bundle) when given.
        """
        if cpus:
            os.sched_setaffinity(0, set(cpus))
            torch.set_num_threads(len(cpus))
        elif threads:
            torch.set_num_threads(threads)
        self.device = "cuda:0" if use_gpu and torch.cuda.is_available() else "cpu"
        if self.device.startswith("cuda"):
            torch.cuda.set_device(0)
        return self.device

    def rendezvous(self) -> str:
        """Where the world meets (asked of the global rank-0 slot): ``tcp://<this node's IP>:<a port free here>``.

        The rank-0 process hosts the rendezvous store on that port, so every slot, on any node, can reach it.
        """
        from .ray.cluster import free_port, node_ip

        ip = node_ip()
        host = f"[{ip}]" if ":" in ip else ip
        return f"tcp://{host}:{free_port(ip)}"

    def setup(self, init_method: str, world_size: int, groups: Mapping[str, tuple[Sequence[int], str]]) -> dict:
        """Join the world, create the groups (name -> (global ranks, backend)), build the engines.

        The world's default backend is gloo on CPU slots and gloo (CPU tensors) + NCCL (CUDA tensors) on CUDA
        slots. Returns this process's pid, host, node (IP and Ray id), device and Ray GPU ids.
        """
        backend = "cpu:gloo,cuda:nccl" if self.device.startswith("cuda") else "gloo"
        dist.init_process_group(backend, init_method=init_method, rank=self.slot.global_rank, world_size=world_size,
                                timeout=self.timeout)
        for name, (ranks, backend) in groups.items():  # every process creates every group, in the same order
            group = dist.new_group(list(ranks), timeout=self.timeout, backend=backend)
            if self.slot.global_rank in ranks:
                self.groups[name] = group
                self.group_devices[name] = torch.device(self.device if backend == "nccl" else "cpu")
        torch.manual_seed(self.seed)
        mesh = None
        if any(r.dp > 1 for r in self.slot.roles):
            from torch.distributed.device_mesh import DeviceMesh

            pool = pool_group(self.slot.pool)
            mesh = DeviceMesh.from_group(self.groups[pool], self.group_devices[pool].type)
        engines = build_slot_engines(self.slot.roles, self.specs, self.device, mesh)
        self.worker = RoleWorker.from_engines(self.device, engines)
        import ray

        context = ray.get_runtime_context()
        return {"pid": os.getpid(), "host": os.uname().nodename, "node_ip": ray.util.get_node_ip_address(),
                "node_id": context.get_node_id(), "device": self.device,
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "cpus": sorted(os.sched_getaffinity(0))}

    def setup_local(self, device: str, mailbox: dict[str, list]) -> None:
        """Build the engines in this process on ``device`` (the LocalExecutor's slots: one per pool, dp 1)."""
        wide = [r.role for r in self.slot.roles if r.dp > 1]
        if wide:
            raise ExecutionError(f"pool {self.slot.pool!r} spreads roles {wide} over {max(r.dp for r in self.slot.roles)} "
                                 "data-parallel ranks; the local executor runs one device per pool. Use executor='ray' "
                                 "(one process per slot, FSDP2) or compile with one device per pool (cpu_slots=1)")
        self.device, self.mailbox = device, mailbox
        if self.seed is not None:
            torch.manual_seed(self.seed)
        self.worker = RoleWorker.from_engines(device, build_slot_engines(self.slot.roles, self.specs, device))

    def ping(self) -> int:
        return os.getpid()

    # -- work ----------------------------------------------------------------------------------
    def run(self, method: str, role: str, batch: Batch, args: tuple = ()) -> tuple[Any, tuple[float, float]]:
        """``RoleWorker.<method>(role, batch, *args)`` on this slot's slice of the batch."""
        start = time.time()
        if method == "generate" and self.slot.rank:
            args = (self._rank_seed(role, dict(args[0])),) + tuple(args[1:])
        result = getattr(self.worker, method)(role, batch, *args)
        return result, (start, time.time())

    def _rank_seed(self, role: str, overrides: dict) -> dict:
        seed = overrides.get("seed")
        if seed is None:
            seed = self.worker.engines[role].rollout.sampling.seed
        if seed is not None:
            overrides["seed"] = seed + self.slot.rank * SEED_STRIDE
        return overrides

    def sync_weights(self, role: str) -> tuple[SyncStats, tuple[float, float]]:
        """Hybrid engine: stream the train engine's full tensors into this slot's rollout engine in buckets."""
        start = time.time()
        stats = self.worker.sync_weights(role, bucket_bytes=self.bucket_bytes)
        return stats, (start, time.time())

    def send_weights(self, role: str, group: str, src: int) -> tuple[SyncStats, tuple[float, float]]:
        """Train pool side of a cross-pool sync (every train rank gathers; pool rank 0 broadcasts)."""
        start = time.time()
        train = self.worker.engines_for(role, "train").train
        if self.mailbox is not None:  # local: hand the tensors to the receiving slot of this process
            named = [(name, tensor.detach()) for name, tensor in train.named_weights()]
            self.mailbox[group] = named
            moved = sum(t.numel() * t.element_size() for _, t in named)
            return SyncStats(len(named), moved, 1, 0, time.time() - start), (start, time.time())
        specs = tensor_specs(dict(synced_weights(train.module, train.module.state_dict().items())))
        stats = broadcast_send(train.named_weights(), specs, group=self.groups.get(group), src=src,
                               is_src=self.slot.global_rank == src, device=self.group_devices.get(group, torch.device("cpu")),
                               bucket_bytes=self.bucket_bytes)
        return stats, (start, time.time())

    def receive_weights(self, role: str, group: str, src: int) -> tuple[SyncStats, tuple[float, float]]:
        """Generation pool side of a cross-pool sync."""
        start = time.time()
        rollout = self.worker.engines_for(role, "rollout").rollout
        if self.mailbox is not None:
            if group not in self.mailbox:
                raise ExecutionError(f"slot {self.slot.describe()}: weight sync {group!r} received before it was sent")
            stats = stream_into(rollout, self.mailbox.pop(group), bucket_bytes=self.bucket_bytes)
            return stats, (start, time.time())
        stats = broadcast_receive(rollout, group=self.groups[group], src=src, device=self.group_devices[group],
                                  bucket_bytes=self.bucket_bytes)
        return stats, (start, time.time())

    def offload(self, role: str, items: Sequence[str]) -> tuple[None, tuple[float, float]]:
        start = time.time()
        self.worker.offload(role, items)
        return None, (start, time.time())

    def onload(self, role: str, items: Sequence[str]) -> tuple[None, tuple[float, float]]:
        start = time.time()
        self.worker.onload(role, items)
        return None, (start, time.time())

    # -- checkpoints: this slot's shard of its train engines (see train_state) ----------------------
    def save_train_states(self, roles: Sequence[str], folder: str) -> tuple[dict[str, Any], dict[str, dict]]:
        """Write this slot's shard of each role's train engine to ``<folder>/<role>`` (with the pool's other slots).

        Returns the roles' JSON state and, from the pool's rank 0 (after DCP's last step: every rank's file is
        written), the manifest entries of those folders (paths relative to ``folder``)."""
        from .dcp_files import folder_manifest
        from .train_state import save_train_state

        group = self.groups.get(pool_group(self.slot.pool))
        states = {role: save_train_state(self._part(role, "train"), Path(folder) / role, role=role, group=group)
                  for role in roles}
        manifest = {}
        if self.slot.rank == 0:
            for role in roles:
                manifest.update(folder_manifest(Path(folder) / role, relative_to=Path(folder)))
        return states, manifest

    def load_train_states(self, roles: Sequence[str], folder: str, saved: Mapping[str, Any]) -> None:
        """Load each role's train engine from ``<folder>/<role>`` (written at any data-parallel size)."""
        from .train_state import load_train_state

        group = self.groups.get(pool_group(self.slot.pool))
        for role in roles:
            load_train_state(self._part(role, "train"), Path(folder) / role, saved[role], role=role, group=group)

    # -- engine access for the controller (validation, checkpoints; see remote_engines) ------------
    def _resolve(self, role: str, part: str, path: str) -> Any:
        value = self._part(role, part)
        for name in filter(None, path.split(".")):
            value = getattr(value, name)
        return value

    def engine_describe(self, role: str, part: str, path: str) -> tuple[str, Any]:
        """What ``engines[role].<part>.<path>`` is: a method, a module (stays here), a dict, or a plain value."""
        value = self._resolve(role, part, path)
        if isinstance(value, torch.nn.Module):
            return "object", None
        if isinstance(value, dict):
            return "mapping", value
        if callable(value) and hasattr(value, "__self__"):
            return "method", None
        return "value", value

    def engine_call(self, role: str, part: str, path: str, args: tuple, kwargs: dict) -> Any:
        """``engines[role].<part>.<path>(*args, **kwargs)``."""
        return self._resolve(role, part, path)(*args, **kwargs)

    def engine_setitem(self, role: str, part: str, path: str, key: Any, value: Any) -> None:
        self._resolve(role, part, path)[key] = value

    def engine_kinds(self) -> dict[str, dict[str, Any]]:
        """Role -> its engines' kind and which parts (train, rollout, reward) this slot holds."""
        return {role: {"kind": e.kind, **{part: getattr(e, part) is not None for part in ("train", "rollout", "reward")}}
                for role, e in self.worker.engines.items()}

    def set_engines(self, role: str, engines) -> None:
        self.worker.install(role, engines)

    def _part(self, role: str, part: str):
        engines = self.worker.engines.get(role)
        value = getattr(engines, part, None) if engines is not None else None
        if value is None:
            raise ExecutionError(f"slot {self.slot.describe()} holds no {part} engine of role {role!r}")
        return value

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
