"""The worker: one device slot of a plan, hosting the engines of every role placed there, one method per op kind.

A worker is what a device slot is in a plan; colocated roles share it (one process, one device).
Everything the controller asks of it is an op of a plan, and :meth:`Worker.run` runs one the way
torch.fx's ``Interpreter.run_node`` does: ``getattr(self, kind)(*args)``, timed. The methods:

* node kinds, by the node's method — :meth:`~Worker.generate`, :meth:`~Worker.logprob`,
  :meth:`~Worker.values`, :meth:`~Worker.score`, :meth:`~Worker.update` (``(role, batch, *args)``:
  this slot's data-parallel slice of the node's batch);
* transitions — :meth:`~Worker.sync_weights` (hybrid engine), :meth:`~Worker.send_weights` /
  :meth:`~Worker.receive_weights` (the two sides of a cross-pool sync), :meth:`~Worker.stage_weights` /
  :meth:`~Worker.load_weights` (the two halves of a staged one, :mod:`.staged_sync`), :meth:`~Worker.offload`,
  :meth:`~Worker.onload` (``(role, items)``);
* control kinds (:data:`hybridflow.compiler.plan.CONTROL_KINDS`, ``(role, items, argument)``, the
  argument given when the plan is run) — :meth:`~Worker.save_state`, :meth:`~Worker.load_state`,
  :meth:`~Worker.set_reward`, :meth:`~Worker.export`, :meth:`~Worker.describe`.

Both executors host this class and differ only in how an op reaches it: the LocalExecutor holds
one per pool in its own process (:meth:`Worker.setup_local`: no process groups, one device per
pool, a cross-pool weight sync a copy through an in-process mailbox); the RayExecutor one Ray
actor per slot. Lifecycle on Ray: the executor creates the actor in its pool's placement group,
asks it where it computes (:meth:`Worker.probe`: CUDA when Ray gave it a GPU that torch can see,
else CPU; optionally pinned to cores), then calls :meth:`Worker.setup` on every slot at once:
each joins the ``torch.distributed`` world (gloo, with the configured collective timeout, so a
dead peer raises instead of hanging), creates the topology's process groups in the same order
(NCCL for groups of CUDA slots, gloo otherwise), seeds torch identically (so models built from a
seed are identical replicas), and builds its engines.

**State.** :meth:`~Worker.save_state` returns what this slot holds of a role as checkpoint
sections (``engines``: the train engine's JSON, from the pool's rank 0, beside the DCP shards
every rank writes; ``rollout_rng``: the sampler's RNG, from every rank that samples), and
:meth:`~Worker.load_state` takes the same sections back: a new piece of a role's state is one
entry in each.
"""
from __future__ import annotations

import copy
import datetime
import os
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.distributed as dist

from ..errors import AgentError, ExecutionError
from ..batch import Batch
from .engines import SamplingParams
from .engines.agent_loop import AgentParams
from .engines.lora import adapter_names, is_lora, merged_model, synced_weights
from .roles import RoleEngines, RoleSpec, build_engines
from .slot_engines import build_slot_engines
from .topology import Slot, pool_group
from .watchdog import thread_stacks
from .policy_version import VERSION_SUFFIX, policy_version, set_weight_version, with_policy_version
from .weight_sync import DEFAULT_BUCKET_BYTES, StagedWeights, SyncStats, broadcast_receive, broadcast_send, stream_into, tensor_specs

__all__ = ["Worker", "SEED_STRIDE"]

SEED_STRIDE = 1_000_003
"""Rank r of a data-parallel rollout samples with ``seed + r * SEED_STRIDE``: ranks draw independent noise."""


class Worker:
    """One slot (see the module docstring); ``specs`` holds a RoleSpec for each role the slot hosts."""

    def __init__(self, slot: Slot, specs: Mapping[str, RoleSpec], *, timeout_s: float = 60.0,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, seed: int | None = 0):
        self.slot = slot
        self.specs = dict(specs)
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.bucket_bytes = bucket_bytes
        self.seed = seed
        self.groups: dict[str, Any] = {}
        self.group_devices: dict[str, torch.device] = {}
        self.device = "cpu"
        self.engines: dict[str, RoleEngines] = {}
        self.offloaded: dict[str, set[str]] = {}
        self.mailbox: dict[str, list] | None = None
        """Local slots: cross-pool weight syncs in this process (sync group -> the sender's tensors)."""
        self.env_hosts: dict[str, Any] = {}
        """Role -> where its multi-turn rollouts' environments live (an agent_loop.EnvHost; none: in this process)."""

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
        self.host(build_slot_engines(self.slot.roles, self.specs, self.device, mesh))
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
        self.host(build_slot_engines(self.slot.roles, self.specs, device))

    def host(self, engines: Mapping[str, RoleEngines]) -> None:
        """Host ``engines`` (role -> its engines, built in this process), resident, replacing any the role had."""
        for role, role_engines in engines.items():
            self.engines[role] = role_engines
            self.offloaded.setdefault(role, set())

    def ping(self) -> int:
        return os.getpid()

    def stacks(self) -> dict[str, str]:
        """This process's Python stacks but the caller's (thread -> stack): where a busy op is (the hang watchdog)."""
        return thread_stacks(skip_current=True)

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    # -- the one entry: an op of a plan -------------------------------------------------------------
    def run(self, kind: str, *args) -> tuple[Any, tuple[float, float]]:
        """``self.<kind>(*args)`` with its wall-clock (start, end): how every op reaches this worker."""
        start = time.time()
        result = getattr(self, kind)(*args)
        return result, (start, time.time())

    def run_stream(self, kind: str, *args) -> Iterator[tuple[Any, tuple[float, float]]]:
        """``self.<kind>(*args)``, a generator, one ``(piece, (start, end))`` per piece it yields: each piece timed
        from the end of the one before (the streamed ops of :mod:`.streaming`)."""
        start = time.time()
        for piece in getattr(self, kind)(*args):
            end = time.time()
            yield piece, (start, end)
            start = time.time()

    def engines_for(self, role: str, need: str) -> RoleEngines:
        """``role``'s engines, which must include a ``need`` engine (train, rollout, reward) and be resident
        (not offloaded); an ExecutionError naming the role otherwise."""
        return self._part(role, need, resident=True)

    def _role(self, role: str) -> RoleEngines:
        engines = self.engines.get(role)
        if engines is None:
            raise ExecutionError(f"slot {self.slot.describe()} hosts no role {role!r}; it hosts {', '.join(self.engines)}")
        return engines

    def _part(self, role: str, need: str, *, resident: bool = False) -> RoleEngines:
        """``role``'s engines, which must include a ``need`` engine; ``resident``: and not be offloaded."""
        engines = self._role(role)
        if getattr(engines, need) is None:
            raise ExecutionError(f"role {role!r} ({engines.kind}) on {self.slot.describe()} has no {need} engine")
        if resident and self.offloaded[role]:
            raise ExecutionError(f"role {role!r} on {self.slot.describe()} is offloaded "
                                 f"({', '.join(sorted(self.offloaded[role]))}); the plan must onload it before this op")
        return engines

    # -- node kinds ------------------------------------------------------------------
    def generate(self, role: str, prompts: Batch, overrides: Mapping[str, object],
                 agent: Mapping[str, object] | None = None, partial: Mapping[str, object] | None = None) -> Batch:
        """Responses to ``prompts``; with ``agent`` (a node's env settings), multi-turn trajectories. Rank r of a
        data-parallel pool samples with ``seed + r * SEED_STRIDE``.

        ``partial`` (partial rollouts, :mod:`.partial`): ``{"segment_tokens": S, "resume": bool}``: decode at most
        S positions (returning the partial state), and with ``resume`` continue ``prompts``, a partial rollout this
        rank returned, under the weights it holds now (:mod:`.engines.segments`)."""
        rollout = self.engines_for(role, "rollout").rollout
        params = self._sampling(rollout, overrides)
        if partial is not None:
            if agent is not None:
                raise AgentError(f"role {role!r}: partial rollouts cut single-turn generations; a rollout with "
                                 f"env={agent.get('env')!r} runs whole (partial_rollouts: finish)")
            return with_policy_version(rollout.generate(prompts, params, segment_tokens=partial.get("segment_tokens"),
                                                        resume=bool(partial.get("resume", False))), rollout)
        if agent is None:
            return with_policy_version(rollout.generate(prompts, params), rollout)
        if not hasattr(rollout, "generate_agentic"):
            raise AgentError(f"role {role!r}: a rollout with env={agent.get('env')!r} needs a rollout engine with an "
                             f"agent loop (hf, vllm); {type(rollout).__name__} has none")
        host = {"envs": self.env_hosts[role]} if role in self.env_hosts else {}
        out = rollout.generate_agentic(prompts, params, AgentParams.model_validate(dict(agent)), **host)
        return with_policy_version(out, rollout)

    def _sampling(self, rollout: Any, overrides: Mapping[str, object]) -> SamplingParams:
        """The engine's sampling with a node's ``overrides`` on top (rank r: ``seed + r * SEED_STRIDE``)."""
        overrides = dict(overrides)
        seed = overrides.get("seed")
        if seed is None:
            seed = rollout.sampling.seed
        if seed is not None and self.slot.rank:
            overrides["seed"] = seed + self.slot.rank * SEED_STRIDE
        params = rollout.sampling.model_copy(update={k: v for k, v in overrides.items() if v is not None})
        return SamplingParams.model_validate(params.model_dump())

    def generate_stream(self, role: str, prompts: Batch, overrides: Mapping[str, object]) -> Iterator[tuple[torch.Tensor, Batch]]:
        """:meth:`generate` in pieces as prompt groups finish (a plan op with ``stream``; the engine's
        ``generate_stream``): yields ``(rows, piece)``, ``rows`` the rows of this slot's whole result in ``piece``."""
        rollout = self.engines_for(role, "rollout").rollout
        if not hasattr(rollout, "generate_stream"):
            raise ExecutionError(f"role {role!r}: streamed generation (stream_rollouts) needs a rollout engine that "
                                 f"yields finished groups (hf); {type(rollout).__name__} has none. Set stream_rollouts=false")
        for rows, piece in rollout.generate_stream(prompts, self._sampling(rollout, overrides)):
            yield rows, with_policy_version(piece, rollout)

    def attach_envs(self, role: str, host: Any) -> None:
        """Run ``role``'s environments where ``host`` (an agent_loop.EnvHost: the plan's environment pool) puts them."""
        self.env_hosts[role] = host

    def logprob(self, role: str, batch: Batch) -> torch.Tensor:
        return self.engines_for(role, "train").train.compute_log_probs(batch)

    def values(self, role: str, batch: Batch) -> torch.Tensor:
        return self.engines_for(role, "train").train.compute_values(batch)

    def score(self, role: str, batch: Batch):
        return self.engines_for(role, "reward").reward.score(batch)

    def update(self, role: str, batch: Batch, terms: Sequence[tuple[str, float, dict]]) -> dict[str, float]:
        return self.engines_for(role, "train").train.update(batch, terms)

    # -- transitions -------------------------------------------------------------------
    def sync_weights(self, role: str) -> SyncStats:
        """Hybrid engine: stream the train engine's full tensors into the rollout engine in buckets; nothing moves
        (all-zero stats) when the two share one module."""
        engines = self.engines_for(role, "rollout")
        if engines.train is not None:
            set_weight_version(engines.rollout, policy_version(engines.train))
        if engines.train is None or engines.rollout.shares_weights_with(engines.train):
            return SyncStats(0, 0, 0, 0, 0.0)
        return stream_into(engines.rollout, engines.train.named_weights(), bucket_bytes=self.bucket_bytes)

    def send_weights(self, role: str, group: str, src: int) -> SyncStats:
        """Train pool side of a cross-pool sync (every train rank gathers; pool rank 0 broadcasts)."""
        start = time.time()
        train = self.engines_for(role, "train").train
        if self.mailbox is not None:  # local: hand the tensors to the receiving slot of this process
            named = [(name, tensor.detach()) for name, tensor in train.named_weights()]
            self.mailbox[group] = named
            self.mailbox[group + VERSION_SUFFIX] = policy_version(train)
            moved = sum(t.numel() * t.element_size() for _, t in named)
            return SyncStats(len(named), moved, 1, 0, time.time() - start)
        specs = tensor_specs(dict(synced_weights(train.module, train.module.state_dict().items())))
        device, is_src = self.group_devices.get(group, torch.device("cpu")), self.slot.global_rank == src
        stats = broadcast_send(train.named_weights(), specs, group=self.groups.get(group), src=src, is_src=is_src,
                               device=device, bucket_bytes=self.bucket_bytes)
        if is_src:  # the weights' version follows them: the receivers' rollout engines record it
            dist.broadcast(torch.tensor([policy_version(train)], dtype=torch.int64, device=device), src=src,
                           group=self.groups.get(group))
        return stats

    def receive_weights(self, role: str, group: str, src: int) -> SyncStats:
        """Generation pool side of a cross-pool sync."""
        rollout = self.engines_for(role, "rollout").rollout
        if self.mailbox is not None:
            if group not in self.mailbox:
                raise ExecutionError(f"slot {self.slot.describe()}: weight sync {group!r} received before it was sent")
            stats = stream_into(rollout, self.mailbox.pop(group), bucket_bytes=self.bucket_bytes)
            set_weight_version(rollout, self.mailbox.pop(group + VERSION_SUFFIX))
            return stats
        stats = broadcast_receive(rollout, group=self.groups[group], src=src, device=self.group_devices[group],
                                  bucket_bytes=self.bucket_bytes)
        version = torch.zeros(1, dtype=torch.int64, device=self.group_devices[group])
        dist.broadcast(version, src=src, group=self.groups[group])
        set_weight_version(rollout, int(version.item()))
        return stats

    def stage_weights(self, role: str) -> StagedWeights | None:
        """Train pool side of a staged sync (:mod:`.staged_sync`): every rank gathers the full tensors (the gathers
        are collective); pool rank 0 copies them to host memory and leaves them in the staging buffer
        (:meth:`stash`). Rank 0 returns what the rollout pool loads; the other ranks None. No rollout worker takes part."""
        start = time.time()
        train = self.engines_for(role, "train").train
        if self.slot.rank:
            for _ in train.named_weights():
                pass
            return None
        named = [(name, tensor.detach().to("cpu", copy=True)) for name, tensor in train.named_weights()]
        moved = sum(t.numel() * t.element_size() for _, t in named)
        stats = SyncStats(len(named), moved, 1, moved, time.time() - start)
        return StagedWeights(weights=self.stash(named), version=policy_version(train), stats=stats)

    def stash(self, named: list[tuple[str, torch.Tensor]]) -> Any:
        """Leave ``named`` (host tensors) in the staging buffer and return what :meth:`load_weights` is given for it:
        the list itself here (one process); the Ray worker puts it in the object store and returns the ObjectRef,
        which Ray resolves into the list on the rollout worker that loads it."""
        return named

    def load_weights(self, role: str, named: Sequence[tuple[str, torch.Tensor]], version: int) -> SyncStats:
        """Rollout pool side of a staged sync: load the staged tensors of policy ``version`` into the rollout engine
        bucket by bucket and record the version (each token it samples next carries it)."""
        rollout = self.engines_for(role, "rollout").rollout
        own = rollout.weight_shapes()
        for name, tensor in named:
            target = own.get(name)
            if target is None or tuple(target) != tuple(tensor.shape):
                found = "missing" if target is None else f"shape {tuple(target)}"
                raise ExecutionError(f"staged weight sync: the trainer staged {name!r} {tuple(tensor.shape)} but the "
                                     f"rollout model has it {found}; both pools must load the same architecture")
        stats = stream_into(rollout, named, bucket_bytes=self.bucket_bytes)
        set_weight_version(rollout, version)
        return stats

    def offload(self, role: str, items: Sequence[str]) -> None:
        self._move(role, items, torch.device("cpu"))
        # the transformers rollout engine allocates its KV cache per generate call and frees it after: offloading
        # it leaves nothing resident, and the role's other engines stay usable
        self.offloaded[role].update(item for item in items if item != "kv_cache")

    def onload(self, role: str, items: Sequence[str]) -> None:
        self.offloaded[role].difference_update(items)
        self._move(role, items, torch.device(self.device))

    def _move(self, role: str, items: Sequence[str], device: torch.device) -> None:
        engines = self.engines[role]
        train, rollout = engines.train, engines.rollout
        if train is not None:
            train.move_states(items, device)
        if rollout is not None and "params" in items and not (train is not None and rollout.shares_weights_with(train)):
            rollout.sleep() if device.type == "cpu" else rollout.wake()

    # -- control kinds: (role, items, the argument given when the plan runs) --------------------------
    def save_state(self, role: str, items: Sequence[str], folder: str) -> dict[str, Any]:
        """This slot's part of ``role``'s state (module docstring): the train engine's shard under
        ``<folder>/<role>`` (item ``train``; with the pool's other slots), the sampler's RNG where it samples.

        Returns checkpoint sections: ``engines`` (the train JSON) and ``manifest`` (the DCP folder's entries,
        relative to ``folder``) from the pool's rank 0, ``rollout_rng`` from every rank."""
        from .dcp_files import folder_manifest
        from .train_state import save_train_state

        engines, sections = self._role(role), {}
        if "train" in items:
            target = Path(folder) / role
            state = save_train_state(self._part(role, "train").train, target, role=role, group=self._pool_group())
            if self.slot.rank == 0:  # after DCP's last step: every rank's file is written
                sections["engines"] = state
                sections["manifest"] = folder_manifest(target, relative_to=Path(folder))
        if engines.rollout is not None:
            sections["rollout_rng"] = engines.rollout.rng_state()
        return sections

    def load_state(self, role: str, items: Sequence[str], saved: Mapping[str, Any]) -> None:
        """Load what :meth:`save_state` saved: ``saved`` holds ``folder`` and the role's checkpoint sections
        (``engines``, ``rollout_rng``: one state, or ``{"ranks": [...]}`` from a data-parallel sampler, all of
        which every rank is given: streams are keyed by seed, each rank continues the ones it samples with)."""
        from .train_state import load_train_state

        engines = self._role(role)
        if "train" in items:
            load_train_state(self._part(role, "train").train, Path(saved["folder"]) / role, saved["engines"], role=role,
                             group=self._pool_group())
        if engines.rollout is not None and saved.get("rollout_rng") is not None:
            rng = saved["rollout_rng"]
            for part in rng.get("ranks", [rng]):
                engines.rollout.set_rng_state(part)

    def set_reward(self, role: str, items: Sequence[str], spec: RoleSpec) -> None:
        """Build ``role``'s reward source anew from ``spec`` (e.g. a RemoteRewardModel), replacing the one it had."""
        kind = self._role(role).kind
        self.host({role: build_engines(role, kind, spec, self.device)})

    def export(self, role: str, items: Sequence[str], argument: Any = None) -> dict[str, Any] | None:
        """``role``'s trained model on the pool's rank 0 (a collective on a sharded pool; None on other ranks):
        ``config`` and ``generation_config`` (transformers), ``model`` (full tensors on the CPU, LoRA adapters
        merged into their base weights) and, with item ``optimizer``, ``train_state`` (the engine's whole
        state dict: model, optimizer, schedule)."""
        train = self._part(role, "train").train
        module = train.module
        dp = max((r.dp for r in self.slot.roles if r.role == role), default=1)
        if dp > 1:
            if is_lora(module):
                raise ExecutionError(f"role {role!r}: exporting a LoRA policy sharded over {dp} ranks is not "
                                     "supported; export its checkpoint (hybridflow export)")
            state = train.state_dict()  # gathered on rank 0 (a collective: every rank calls it)
            model = state["model"]
        else:
            state = train.state_dict() if "optimizer" in items else None
            plain = merged_model(copy.deepcopy(module)) if is_lora(module) else module
            model = plain.state_dict()
        if self.slot.rank:
            return None
        config = getattr(module, "config", None)
        return {"config": copy.deepcopy(config), "generation_config": copy.deepcopy(getattr(module, "generation_config", None)),
                "model": {k: v.detach().to("cpu", copy=True) for k, v in model.items()},
                "train_state": copy.deepcopy(state) if "optimizer" in items else None}

    def describe(self, role: str, items: Sequence[str] = (), argument: Any = None) -> dict[str, Any]:
        """What ``role``'s engines on this slot are (copies, read-only for the caller): their types, the train
        settings, the train module's transformers config and generation config, its trainable parameters
        (name -> size) and LoRA adapters, the sampling settings, the reward function, the roles whose train
        engine computes with the same module (a base-model view), what is offloaded."""
        engines = self._role(role)
        train, rollout, reward = engines.train, engines.rollout, engines.reward
        module = getattr(train, "module", None)
        shares = [other for other, e in self.engines.items() if other != role and e.train is not None
                  and module is not None and getattr(e.train, "module", None) is module]
        return {"role": role, "kind": engines.kind, "device": self.device, "rank": self.slot.rank,
                "engines": {part: type(getattr(engines, part)).__name__ for part in ("train", "rollout", "reward")
                            if getattr(engines, part) is not None},
                "train_config": copy.deepcopy(getattr(train, "config", None)),
                "model_config": copy.deepcopy(getattr(module, "config", None)),
                "generation_config": copy.deepcopy(getattr(module, "generation_config", None)),
                "trainable": {n: p.numel() for n, p in module.named_parameters() if p.requires_grad} if module is not None else {},
                "adapters": sorted(adapter_names(module)) if module is not None and is_lora(module) else [],
                "shares_module_with": shares,
                "sampling": copy.deepcopy(rollout.sampling) if rollout is not None else None,
                "rollout_folder": getattr(rollout, "folder", None),
                "reward_fn": getattr(reward, "compute_score", None),
                "offloaded": sorted(self.offloaded.get(role, ()))}

    def _pool_group(self):
        return self.groups.get(pool_group(self.slot.pool))
