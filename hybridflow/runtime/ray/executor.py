"""RayExecutor: runs a bound ExecutionPlan on a Ray cluster, one actor per device slot.

The same interpreter of the same plan as the LocalExecutor (:mod:`..interpreter`: one run
loop for every executor), distributed:

* **placement** — one placement group per pool (:mod:`.cluster`), one actor per
  device slot in it, hosting a :class:`~hybridflow.runtime.worker.Worker`
  with the engines of every role placed on the pool; all slots form one
  ``torch.distributed`` world with a group per pool (FSDP2 when dp > 1) and a
  group per cross-pool weight sync (:mod:`..topology`), meeting at the global
  rank-0 slot's node address and a port it picked there, so the world and its
  groups may span Ray nodes (gloo on CPU, NCCL for groups of CUDA slots);
* **dispatch** — each op goes to every slot of its pool as one ``Worker.run``
  call, the batch split by data-parallel rank and the results merged
  (:data:`..interpreter.OP_SUBMITTERS`, :mod:`..dispatch`); controller ops
  (``compute`` nodes) run in this process; nothing reaches a worker otherwise
  (checkpoints, exports, validation are plans too);
* **concurrency** — ops are sent as soon as their dependencies are done and
  every earlier op of the same pool has been sent (the plan's per-pool order),
  without waiting: ops on disjoint pools run at the same time, and the
  executor waits on all in-flight results at once (``ray.wait``);
* **spans** — ``recorder`` holds one span per op (first start to last end over
  its slots), as the LocalExecutor records, so step timings mean the same;
  ``worker_spans`` holds one span per op per slot, device ``<pool>/rank<r>``;
  :meth:`RayExecutor.trace_spans` returns both, one trace track per worker;
* **faults** — a slot whose process dies makes the op fail with
  :class:`~hybridflow.errors.WorkerLostError` naming its pool, rank and roles;
  the surviving ranks' collectives time out after ``collective_timeout_s``
  instead of hanging; :meth:`RayExecutor.restart` builds a fresh worker group.
"""
from __future__ import annotations

import gc
import itertools
import logging
import os
import time
from typing import Any, Mapping

import ray
import torch

from ...compiler.plan import ExecutionPlan
from ...errors import ExecutionError, HybridflowError, PlacementError, WorkerLostError
from ..interpreter import PlanExecutor
from ..roles import RoleSpec
from ..spans import SpanRecorder
from ..topology import Slot, Topology
from ..weight_sync import DEFAULT_BUCKET_BYTES
from ..worker import Worker
from .cluster import DeviceResource, connect, release_pools, replace_lost_nodes, reserve_pools
from .env_pool import attach_env_pools, env_worker_handles, start_env_workers
from .warm import keeping_workers, park

__all__ = ["RayExecutor"]

log = logging.getLogger("hybridflow.ray")

LOST_PEER = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
"""gloo / NCCL messages of a collective whose peer process went away."""
PEER_WAIT_S = 30.0
"""How long a slot's lost-peer error waits for Ray to report which slot died."""


def _is_dead(ref) -> bool:
    try:
        ray.get(ref, timeout=0)
    except ray.exceptions.RayActorError:
        return True
    except Exception:
        return False
    return False


RESERVE_RETRY_S = 1.0
"""A restart's reservation attempts last this long each, until the plan's lost Ray nodes are replaced and the
killed slots' resources are back (Ray frees them a moment after the processes exit): short attempts, so that
the restart goes ahead about as soon as they are."""

WATCH_GROUP = "watchdog"
"""The actors' concurrency group of :meth:`Worker.stacks`: its own thread, so a worker busy in an op still answers
(with a concurrency group, Ray runs every method on a thread of its group's; the default group's is one thread)."""


class _RayWorker(Worker):
    """The worker of a Ray actor: a staged weight sync's buffer is the object store (:meth:`Worker.stash`); a
    parked actor starts over as another executor's slot (:mod:`.warm`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._cpus = os.sched_getaffinity(0)

    def stash(self, named):
        return ray.put(named)

    def release(self) -> int:
        """Leave the world and drop every engine, as the process was before its slot's set-up: it may be parked."""
        self.shutdown()
        self.engines, self.offloaded, self.groups, self.group_devices, self.env_hosts = {}, {}, {}, {}, {}
        gc.collect()
        os.sched_setaffinity(0, self._cpus)
        torch.set_grad_enabled(True)
        return os.getpid()

    def recycle(self, slot: Slot, specs: Mapping[str, RoleSpec], **options) -> int:
        """Start over as ``slot`` with ``specs`` (after :meth:`release`): the next calls are probe, rendezvous, set-up."""
        cpus = self._cpus
        Worker.__init__(self, slot, specs, **options)
        self._cpus = cpus
        return os.getpid()


_RemoteWorker = ray.remote(concurrency_groups={WATCH_GROUP: 1})(_RayWorker)


def group_backend(ranks, topo: Topology, devices: Mapping[str, str]) -> str:
    """NCCL for a group whose members all compute on CUDA, gloo otherwise (CPU, or virtual GPUs in tests)."""
    slots = {s.global_rank: s for s in topo.slots}
    return "nccl" if all(devices[slots[r].name].startswith("cuda") for r in ranks) else "gloo"


class RayExecutor(PlanExecutor):
    """Runs ``plan`` on Ray with the engines ``specs`` describe (role name -> :class:`RoleSpec`).

    Args:
        address: a Ray cluster to join (``"auto"``, ``"ray://host:10001"``); None starts a local
            Ray instance unless this process already has one.
        num_cpus / num_gpus: resources of a local instance this executor starts (``num_gpus`` may be
            virtual: slots then reserve "GPU" bundles while computing on CPU).
        device_resource: what a slot reserves: "GPU", "CPU", or "auto" (GPU when the cluster has any).
        cpus_per_worker: CPU resource of each slot.
        collective_timeout_s: timeout of every collective (a dead peer raises after at most this).
        bucket_bytes: bucket size of weight syncs.
        seed: torch seed of every slot before building engines (identical replicas).
        pin_cpus: pool name -> CPU cores its slots are pinned to (``os.sched_setaffinity``), with that
            many torch threads; e.g. one core per pool on a small machine.
        recorder: where the per-op spans go (e.g. the trainer's PhaseRecorder).
    """

    overlaps = True

    def __init__(self, plan: ExecutionPlan, specs: Mapping[str, RoleSpec], *, address: str | None = None,
                 num_cpus: int | None = None, num_gpus: int | None = None, device_resource: DeviceResource = "auto",
                 cpus_per_worker: float = 1.0, collective_timeout_s: float = 60.0,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, seed: int = 0, recorder: SpanRecorder | None = None,
                 pin_cpus: Mapping[str, tuple[int, ...]] | None = None, poll_s: float = 1.0,
                 setup_timeout_s: float = 600.0):
        super().__init__(plan, specs, recorder=recorder)
        self.poll_s = poll_s
        self._options = dict(device_resource=device_resource, cpus_per_worker=cpus_per_worker, pin_cpus=dict(pin_cpus or {}),
                             timeout_s=collective_timeout_s, bucket_bytes=bucket_bytes, seed=seed,
                             setup_timeout_s=setup_timeout_s)
        self._owns_ray = connect(address, num_cpus=num_cpus, num_gpus=num_gpus)
        self._actors: dict[str, Any] = {}
        self._reservation = None
        self._failed = False
        self.slot_info: dict[str, dict] = {}
        self.env_workers: dict[str, list] = {}
        """Environment pool name -> its environment workers' actors (:mod:`.env_pool`)."""
        self._start_workers()

    # -- worker group ------------------------------------------------------------------------
    def _start_workers(self, reserve_timeout_s: float = 120.0) -> None:
        o = self._options
        self._reservation = reserve_pools(self.plan, resource=o["device_resource"], cpus_per_worker=o["cpus_per_worker"],
                                          timeout_s=reserve_timeout_s)
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        recycled = {}
        for slot in self.topology.slots:
            bundle = self._reservation.bundles[slot.pool]
            group, index = self._reservation.placement(slot.pool, slot.rank)
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
            specs = {r.role: self.specs[r.role] for r in slot.roles}
            options = dict(timeout_s=o["timeout_s"], bucket_bytes=o["bucket_bytes"], seed=o["seed"])
            parked = self._reservation.actors.get(slot.pool, {}).get(slot.rank)
            if parked is not None:  # a kept slot of an earlier executor (.warm): it starts over before its probe
                self._actors[slot.name] = parked
                recycled[slot.name] = parked.recycle.remote(slot, specs, **options)
                continue
            self._actors[slot.name] = _RemoteWorker.options(
                num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0), scheduling_strategy=strategy,
                max_restarts=0, max_task_retries=0,
            ).remote(slot, specs, **options)
        try:
            self.get_all(recycled, "start", o["setup_timeout_s"])  # a slot that cannot start over fails here, named
            bundles = self._reservation.bundles
            devices = self.get_all({s.name: self.actor(s).probe.remote(self._reservation.uses_gpu(s.pool),
                                                                       tuple(o["pin_cpus"].get(s.pool, ())),
                                                                       max(1, int(bundles[s.pool]["CPU"])))
                                     for s in self.topology.slots}, "start", o["setup_timeout_s"])
            groups = {name: (ranks, group_backend(ranks, self.topology, devices))
                      for name, ranks in self.topology.groups.items()}
            first = next(s for s in self.topology.slots if s.global_rank == 0)
            init = self.get_all({first.name: self.actor(first).rendezvous.remote()}, "rendezvous",
                                 o["setup_timeout_s"])[first.name]
            refs = {s.name: self.actor(s).setup.remote(init, self.topology.world_size, groups) for s in self.topology.slots}
            self.slot_info = self.get_all(refs, "set-up", o["setup_timeout_s"])
            self._start_env_pools()
        except BaseException:
            self._failed = True
            self.shutdown()
            raise

    def _start_env_pools(self) -> None:
        """The plan's environment pools' workers (:mod:`.env_pool`), attached to the rollout slots; stopped with them."""
        self.env_workers = start_env_workers(self.plan, self._reservation.placement, self._reservation.bundles)
        self._actors.update(env_worker_handles(self.env_workers))
        ray.get(attach_env_pools(self.plan, self.topology, self.env_workers, self.actor),
                timeout=self._options["setup_timeout_s"])

    def get_all(self, refs: Mapping[str, Any], what: str, timeout_s: float) -> dict[str, Any]:
        """Wait up to ``timeout_s`` for every ref (slot name -> Ray object ref); slot name -> its value.

        A ref late past the timeout is an ExecutionError naming the slots; a slot's failure the project error
        naming ``what`` (WorkerLostError when its process died)."""
        slots = {s.name: s for s in self.topology.slots}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        if len(ready) < len(refs):
            late = [name for name, ref in refs.items() if ref not in ready]
            raise ExecutionError(f"{what} of slots {late} did not finish within {timeout_s:.0f} s")
        out = {}
        for name, ref in refs.items():
            try:
                out[name] = ray.get(ref)
            except Exception as err:
                raise self._failure(what, slots[name], err) from None
        return out

    def actor(self, slot: Slot):
        return self._actors[slot.name]

    def restart(self) -> None:
        """Kill every slot and start a fresh worker group (engines rebuilt from the specs); the slots of a plan node
        whose Ray node left the cluster go to a node that replaced it (:func:`.cluster.replace_lost_nodes`)."""
        self.ahead = []
        self._stop_workers()
        deadline = time.monotonic() + self._options["setup_timeout_s"]
        for attempt in itertools.count():
            self.plan = replace_lost_nodes(self.plan, timeout_s=max(0.0, deadline - time.monotonic()))
            try:
                self._start_workers(reserve_timeout_s=max(1.0, min(RESERVE_RETRY_S, deadline - time.monotonic())))
                return
            except PlacementError as err:
                # a node killed a moment ago is still alive to Ray until its health checks fail (~15-30 s), and the
                # killed slots' resources come back a moment after their processes exit: try again until then
                if time.monotonic() >= deadline:
                    raise
                if attempt == 0:
                    log.warning("restart: %s; trying again until %.0f s have passed (a lost node may not be marked "
                                "dead yet)", err, self._options["setup_timeout_s"])

    def _stop_workers(self, exit_timeout_s: float = 30.0, *, keep: bool = False) -> None:
        """Kill the slots, wait until Ray reports them gone (a call on each fails), then remove the pools' groups.

        Removing a group while a killed slot's process is still exiting has left its bundles' resources held
        on multi-raylet clusters, so that the next reservation on that node never fitted. ``keep``: park the slots'
        pools instead (:mod:`.warm`), when :func:`~.warm.keep_workers` is on and every slot releases; environment
        pools' workers stop either way."""
        hung = getattr(self.watchdog, "hang", None) is not None
        if keep and keeping_workers() and not (self._failed or hung) and self._reservation is not None:
            by_pool = {name: {s.rank: self._actors[s.name] for s in self.topology.pool_slots(name)}
                       for name in self._reservation.groups if name not in self.env_workers}
            if park([(key, group, [actors[rank] for rank in ranks]) for name, actors in by_pool.items()
                     for key, group, ranks in self._reservation.units(name, len(actors))]):
                for name in by_pool:  # parked with their groups: what is left below is the environment pools
                    del self._reservation.groups[name]
                self._actors = env_worker_handles(self.env_workers)
        handles = list(self._actors.values())
        for handle in handles:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # already dead
                pass
        self._actors.clear()
        if handles and ray.is_initialized():
            ray.wait([h.ping.remote() for h in handles], num_returns=len(handles), timeout=exit_timeout_s)
        if self._reservation is not None:
            release_pools(self._reservation)
            self._reservation = None

    def shutdown(self) -> None:
        """Stop the workers (or park them: :func:`~.warm.keep_workers`), release the pools, and stop Ray if this
        executor started it."""
        self._stop_workers(keep=not self._owns_ray)
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
            self._owns_ray = False

    def __del__(self) -> None:
        try:  # a dropped executor gives its pools back (its actors go with their last handle)
            if getattr(self, "_reservation", None) is not None and ray.is_initialized():
                release_pools(self._reservation)
        except Exception:
            pass

    def __enter__(self) -> "RayExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # -- the transport: Ray object refs ---------------------------------------------------------------
    def send(self, slot: Slot, kind: str, *args) -> Any:
        return self.actor(slot).run.remote(kind, *args)

    def wait(self, refs: list, timeout: float) -> None:
        ray.wait(refs, num_returns=1, timeout=timeout)

    def ready(self, refs: list) -> list[bool]:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        ready_ids = {id(r) for r in ready}
        return [id(r) in ready_ids for r in refs]

    def fetch(self, ref: Any, slot: Slot, what: str) -> tuple[Any, tuple[float, float]]:
        try:
            return ray.get(ref)
        except Exception as err:
            raise self._failure(what, slot, err) from None

    def send_stream(self, slot: Slot, kind: str, *args) -> Any:
        """A Ray streaming generator over ``Worker.run_stream(kind, *args)``: its pieces arrive as they are yielded."""
        return self.actor(slot).run_stream.options(num_returns="streaming").remote(kind, *args)

    def next_piece(self, handle: Any, slot: Slot, what: str) -> tuple[Any, tuple[float, float]] | None:
        try:
            ref = next(handle)
        except StopIteration:
            return None
        except Exception as err:
            raise self._failure(what, slot, err) from None
        return self.fetch(ref, slot, what)

    def worker_stacks(self, slots, timeout_s: float) -> dict[str, dict[str, str]]:
        refs = {s.name: self.actor(s).stacks.options(concurrency_group=WATCH_GROUP).remote()
                for s in slots if s.name in self._actors}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
        out = {}
        for name, ref in refs.items():
            if ref in ready:
                try:
                    out[name] = ray.get(ref)
                except Exception as err:  # a dead slot: the report says so
                    out[name] = {"(no stacks)": f"{type(err).__name__}: {str(err).strip().splitlines()[0]}"}
        return out

    def check_running(self) -> None:
        if not self._actors:
            raise ExecutionError("the executor's workers are stopped (shutdown); create a new RayExecutor")

    # -- faults ----------------------------------------------------------------------------------------
    def _failure(self, what: str, slot: Slot, err: Exception) -> Exception:
        """The project error for a slot's failure: WorkerLostError when a slot of the op's pools died."""
        self._failed = True  # its workers are not kept (.warm)
        cause_text = str(getattr(err, "cause", None) or err)
        # a collective that broke because a peer went away: give Ray time to learn which one (a lost node's
        # processes are known dead a little after its peers see their connections close)
        lost_peer = not isinstance(err, ray.exceptions.RayActorError) and any(m in cause_text for m in LOST_PEER)
        dead = self._dead_slots({slot.pool}, timeout_s=PEER_WAIT_S if lost_peer else 5.0)
        if isinstance(err, ray.exceptions.RayActorError) and slot not in dead:
            dead.insert(0, slot)
        cause = getattr(err, "cause", None) or err
        if dead:
            names = "; ".join(f"pool {s.pool!r} rank {s.rank} (roles {', '.join(r.role for r in s.roles)}, "
                              f"device {s.device}, {self._node_of(s)})" for s in dead)
            reason = str(cause).strip().splitlines()
            return WorkerLostError(f"{what}: worker {names} died ({type(cause).__name__}: {reason[0] if reason else ''}). "
                                   "The executor stopped instead of waiting for it; restart() builds a fresh worker "
                                   "group, and resume='auto' continues a run from its newest checkpoint")
        if isinstance(cause, HybridflowError):
            return cause
        return ExecutionError(f"{what} failed on {slot.describe()}: {type(cause).__name__}: {cause}")

    def _node_of(self, slot: Slot) -> str:
        """``Ray node 4ecf536e at 10.0.0.2``: where the slot ran (as its set-up reported)."""
        info = self.slot_info.get(slot.name, {})
        return f"Ray node {info.get('node_id', '?')[:8]} at {info.get('node_ip', '?')}"

    def _dead_slots(self, pools: set[str], timeout_s: float = 5.0) -> list[Slot]:
        """The slots of ``pools`` whose process is gone (a busy slot's ping just waits: it is alive); waits up to
        ``timeout_s``, less once a dead one is found."""
        slots = [s for s in self.topology.slots if s.pool in pools and s.name in self._actors]
        pings = {s.name: self.actor(s).ping.remote() for s in slots}
        deadline, pending = time.monotonic() + timeout_s, list(pings.values())
        while pending and time.monotonic() < deadline:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if any(_is_dead(r) for r in ready):
                ray.wait(pending, num_returns=len(pending), timeout=1.0)  # its peers on the same node die with it
                break
        dead = []
        for s in slots:
            ready, _ = ray.wait([pings[s.name]], timeout=0)
            if not ready:
                continue
            try:
                ray.get(pings[s.name])
            except ray.exceptions.RayActorError:
                dead.append(s)
        return dead
