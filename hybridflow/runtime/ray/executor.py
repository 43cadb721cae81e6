"""RayExecutor: runs an ExecutionPlan on a Ray cluster, one actor per device slot.

The same interpreter of the same plan as the LocalExecutor (STYLE.md,
principle 3), distributed:

* **placement** — one placement group per pool (:mod:`.cluster`), one actor per
  device slot in it, hosting a :class:`~hybridflow.runtime.worker.RoleWorker`
  for every role placed on the pool (:mod:`.slot_worker`); all slots form one
  ``torch.distributed`` world with a group per pool (FSDP2 when dp > 1) and a
  group per cross-pool weight sync (:mod:`.topology`);
* **dispatch** — each op goes to every slot of its pool, the batch split by
  data-parallel rank and the results merged (:mod:`.op_dispatch`,
  :mod:`.dispatch`); controller ops (``compute`` nodes) run in this process;
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

import time
from typing import Any, Mapping

import ray

from ...compiler.plan import ExecutionPlan, PlanOp
from ...errors import ExecutionError, HybridflowError, WorkerLostError
from ...graph import CONTROLLER
from ..batch import Batch
from ..local import IterationResult
from ..node_calls import WorkerCall, run_compute
from ..roles import RoleSpec
from ..spans import Span, SpanRecorder
from ..weight_sync import DEFAULT_BUCKET_BYTES
from .cluster import DeviceResource, connect, free_port, release_pools, reserve_pools
from .dispatch import merge_results, split_for_ranks
from .op_dispatch import OP_SUBMITTERS, InFlight
from .overlap import run_overlapped
from .streams import IterationState, Stream
from .remote_engines import RemoteWorker
from .slot_worker import SlotWorker
from .topology import Slot, Topology, topology

__all__ = ["RayExecutor"]

_RemoteSlot = ray.remote(SlotWorker)


def group_backend(ranks, topo: Topology, devices: Mapping[str, str]) -> str:
    """NCCL for a group whose members all compute on CUDA, gloo otherwise (CPU, or virtual GPUs in tests)."""
    slots = {s.global_rank: s for s in topo.slots}
    return "nccl" if all(devices[slots[r].name].startswith("cuda") for r in ranks) else "gloo"


class RayExecutor:
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

    def __init__(self, plan: ExecutionPlan, specs: Mapping[str, RoleSpec], *, address: str | None = None,
                 num_cpus: int | None = None, num_gpus: int | None = None, device_resource: DeviceResource = "auto",
                 cpus_per_worker: float = 1.0, collective_timeout_s: float = 60.0,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, seed: int = 0, recorder: SpanRecorder | None = None,
                 pin_cpus: Mapping[str, tuple[int, ...]] | None = None, poll_s: float = 1.0,
                 setup_timeout_s: float = 600.0, request_timeout_s: float = 600.0):
        self.plan = plan
        self.plan_graph = plan.graph_ir()
        self.graph = self.plan_graph
        """The graph the current (or last) call runs: the plan's, with that call's ``params``."""
        missing = [r.name for r in self.graph.roles if r.name not in specs]
        if missing:
            raise ExecutionError(f"no RoleSpec for role(s) {missing}; give one per role of graph {self.graph.name!r}")
        self.specs = dict(specs)
        self.topology = topology(plan, {r.name: r.kind for r in self.graph.roles})
        self.recorder = recorder or SpanRecorder()
        self.worker_spans: list[Span] = []
        self.iteration = 0
        self.poll_s = poll_s
        self.request_timeout_s = request_timeout_s
        self._options = dict(device_resource=device_resource, cpus_per_worker=cpus_per_worker, pin_cpus=dict(pin_cpus or {}),
                             timeout_s=collective_timeout_s, bucket_bytes=bucket_bytes, seed=seed,
                             setup_timeout_s=setup_timeout_s)
        self._ahead: Stream | None = None
        self._owns_ray = connect(address, num_cpus=num_cpus, num_gpus=num_gpus)
        self._actors: dict[str, Any] = {}
        self._reservation = None
        self.slot_info: dict[str, dict] = {}
        self._start_workers()

    # -- worker group ------------------------------------------------------------------------
    def _start_workers(self) -> None:
        o = self._options
        self._reservation = reserve_pools(self.plan, resource=o["device_resource"], cpus_per_worker=o["cpus_per_worker"])
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        for slot in self.topology.slots:
            bundle = self._reservation.bundles[slot.pool]
            strategy = PlacementGroupSchedulingStrategy(self._reservation.groups[slot.pool], placement_group_bundle_index=slot.rank)
            specs = {r.role: self.specs[r.role] for r in slot.roles}
            self._actors[slot.name] = _RemoteSlot.options(
                num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0), scheduling_strategy=strategy,
                max_restarts=0, max_task_retries=0,
            ).remote(slot, specs, timeout_s=o["timeout_s"], bucket_bytes=o["bucket_bytes"], seed=o["seed"])
        try:
            devices = self._get_all({s.name: self.actor(s).probe.remote(self._reservation.uses_gpu(s.pool),
                                                                       tuple(o["pin_cpus"].get(s.pool, ())))
                                     for s in self.topology.slots}, "start", o["setup_timeout_s"])
            groups = {name: (ranks, group_backend(ranks, self.topology, devices))
                      for name, ranks in self.topology.groups.items()}
            init = f"tcp://127.0.0.1:{free_port()}"
            refs = {s.name: self.actor(s).setup.remote(init, self.topology.world_size, groups) for s in self.topology.slots}
            self.slot_info = self._get_all(refs, "set-up", o["setup_timeout_s"])
        except BaseException:
            self.shutdown()
            raise

    def _get_all(self, refs: Mapping[str, Any], what: str, timeout_s: float) -> dict[str, Any]:
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
        """Kill every slot and start a fresh worker group (engines rebuilt from the specs)."""
        self._ahead = None
        self._stop_workers()
        self._start_workers()

    def _stop_workers(self) -> None:
        for handle in self._actors.values():
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # already dead
                pass
        self._actors.clear()
        if self._reservation is not None:
            release_pools(self._reservation)
            self._reservation = None

    def shutdown(self) -> None:
        """Stop the workers, release the pools, and stop Ray if this executor started it."""
        self._stop_workers()
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

    # -- work outside the plan ------------------------------------------------------------------------
    def call(self, pool: str, call: WorkerCall) -> Any:
        """One worker call outside the plan, split over the pool's data-parallel ranks and merged."""
        slots = self.topology.pool_slots(pool)
        if not slots:
            raise ExecutionError(f"the plan has no pool {pool!r}; its pools are {', '.join(p.name for p in self.plan.pools)}")
        split = split_for_ranks(call.method, call.batch, len(slots))
        refs = {s.name: self.actor(s).run.remote(call.method, call.role, part, call.args) for s, part in zip(slots, split.parts)}
        results = self._get_all(refs, f"{call.method} of role {call.role!r} on pool {pool!r}", self.request_timeout_s)
        return merge_results(call.method, split, [results[s.name][0] for s in slots])

    @property
    def workers(self) -> dict[str, RemoteWorker]:
        """Pool name -> its engines as seen from here (:mod:`.remote_engines`), like LocalExecutor.workers."""
        return {pool.name: RemoteWorker(self, pool.name) for pool in self.plan.pools}

    # -- one iteration -----------------------------------------------------------------------------
    def run_iteration(self, inputs: Mapping[str, Batch], *, next_inputs: Mapping[str, Batch] | None = None,
                      params: Mapping[str, Mapping[str, object]] | None = None) -> IterationResult:
        """Run every op of the plan once, feeding the graph inputs (e.g. ``{"prompts": batch}``).

        ``params`` (node name -> {parameter: value}) sets compute nodes' parameters for the ops
        this call runs (they run here, on the controller; see :meth:`Graph.with_params`).

        With a plan of ``staleness`` 1, ``next_inputs`` are the next step's inputs: their generation
        (the ops with ``iteration_offset`` 1) starts now, with the weights before this step's update,
        runs while this step trains, and is what the next call trains on (see :mod:`.overlap`).
        """
        self._check_inputs(inputs)
        self.graph = self.plan_graph.with_params(params or {})
        if self.plan.staleness == 0:
            stream = Stream(list(self.plan.ops), IterationState(env=dict(inputs)), self.iteration)
            self._drive([stream], stream)
            self.iteration += 1
            return IterationResult(env=stream.state.env, metrics=stream.state.metrics)
        if next_inputs is not None:
            self._check_inputs(next_inputs)
        return run_overlapped(self, inputs, next_inputs)

    def _check_inputs(self, inputs: Mapping[str, Batch]) -> None:
        expected = {i.name for i in self.graph.inputs}
        if set(inputs) != expected:
            raise ExecutionError(f"graph {self.graph.name!r} takes inputs {sorted(expected)}, got {sorted(inputs)}")
        if not self._actors:
            raise ExecutionError("the executor's workers are stopped (shutdown); create a new RayExecutor")

    def _drive(self, streams: list[Stream], target: Stream) -> None:
        """Send and collect the ops of ``streams`` until ``target`` has run all its ops (others may stay in flight)."""
        while not target.finished:
            for stream in streams:
                self._send_ready(stream)
            flights = [(stream, f) for stream in streams for f in stream.inflight.values()]
            if not flights:
                if not target.finished:
                    raise ExecutionError(f"ops {[op.name for op in target.pending]} wait on ops that never run; "
                                         "the plan's deps are broken")
                break
            refs = [ref for _, f in flights for i, ref in enumerate(f.refs) if i not in f.results]
            ray.wait(refs, num_returns=1, timeout=self.poll_s)
            for stream, flight in flights:
                if self._collect(flight):
                    del stream.inflight[flight.op.name]
                    flight.finish([flight.results[i] for i in range(len(flight.refs))])
                    self._record(flight, stream.iteration)
                    stream.done.add(flight.op.name)

    def _send_ready(self, stream: Stream) -> None:
        """Send (or, for controller ops, run) every op whose deps are done, keeping each pool's plan order."""
        progress = True
        while progress:
            progress, blocked = False, set()
            for op in list(stream.pending):
                pools = {op.pool, op.target_pool} - {None}
                if not all(d in stream.done for d in op.deps) or pools & blocked:
                    blocked |= pools
                    continue
                stream.pending.remove(op)
                if op.pool is None:
                    self._run_controller(op, stream)
                    stream.done.add(op.name)
                    progress = True
                else:
                    try:
                        stream.inflight[op.name] = OP_SUBMITTERS[op.kind](self, op, stream.state)
                    except HybridflowError:
                        raise
                    except Exception as err:
                        raise ExecutionError(f"op {op.name!r} (role {op.role!r} on pool {op.pool!r}) could not be sent: "
                                             f"{type(err).__name__}: {err}") from err

    def _run_controller(self, op: PlanOp, stream: Stream) -> None:
        node = self.graph.node(op.node)
        with self.recorder.record(op=op.name, node=op.node, kind=node.kind, role=op.role, device=CONTROLLER,
                                  iteration=stream.iteration):
            try:
                stream.state.env[node.name] = run_compute(node, stream.state.env)
            except HybridflowError:
                raise
            except Exception as err:
                raise ExecutionError(f"op {op.name!r} (role {op.role!r} on the controller) failed: "
                                     f"{type(err).__name__}: {err}") from err

    def _collect(self, flight: InFlight) -> bool:
        """Fetch the slots' results that are ready; True when all are in. A failed slot raises at once."""
        waiting = [i for i in range(len(flight.refs)) if i not in flight.results]
        ready, _ = ray.wait([flight.refs[i] for i in waiting], num_returns=len(waiting), timeout=0)
        ready_ids = {id(r) for r in ready}
        for i in waiting:
            if id(flight.refs[i]) not in ready_ids:
                continue
            try:
                value, times = ray.get(flight.refs[i])
            except Exception as err:
                raise self._failure(f"op {flight.op.name!r}", flight.slots[i], err) from None
            flight.results[i], flight.times[i] = value, times
        return len(flight.results) == len(flight.refs)

    # -- spans ---------------------------------------------------------------------------------------
    def _clock(self, wall: float) -> float:
        """A wall-clock time of a worker on the recorder's clock."""
        return wall - (time.time() - self.recorder.now())

    def _record(self, flight: InFlight, iteration: int) -> None:
        op = flight.op
        fields = dict(op=op.name, node=op.node, kind=flight.kind, role=op.role, iteration=iteration)
        for i, slot in enumerate(flight.slots):
            start, end = flight.times[i]
            self.worker_spans.append(Span(device=slot.name, start=self._clock(start), end=self._clock(end), **fields))
        starts, ends = zip(*flight.times.values())
        self.recorder.add(Span(device=op.pool, start=self._clock(min(starts)), end=self._clock(max(ends)), **fields))

    def trace_spans(self) -> list[Span]:
        """Per-op spans (one track per pool and the controller) and per-worker spans (one track per slot)."""
        return sorted([*self.recorder.spans, *self.worker_spans], key=lambda s: s.start)

    # -- faults ----------------------------------------------------------------------------------------
    def _failure(self, what: str, slot: Slot, err: Exception) -> Exception:
        """The project error for a slot's failure: WorkerLostError when a slot of the op's pools died."""
        dead = self._dead_slots({slot.pool})
        if isinstance(err, ray.exceptions.RayActorError) and slot not in dead:
            dead.insert(0, slot)
        cause = getattr(err, "cause", None) or err
        if dead:
            names = "; ".join(f"pool {s.pool!r} rank {s.rank} (roles {', '.join(r.role for r in s.roles)}, "
                              f"device {s.device})" for s in dead)
            reason = str(cause).strip().splitlines()
            return WorkerLostError(f"{what}: worker {names} died ({type(cause).__name__}: {reason[0] if reason else ''}). "
                                   "The executor stopped instead of waiting for it; restart() builds a fresh worker "
                                   "group, and resume='auto' continues a run from its newest checkpoint")
        if isinstance(cause, HybridflowError):
            return cause
        return ExecutionError(f"{what} failed on {slot.describe()}: {type(cause).__name__}: {cause}")

    def _dead_slots(self, pools: set[str], timeout_s: float = 5.0) -> list[Slot]:
        """The slots of ``pools`` whose process is gone (a busy slot's ping just waits: it is alive)."""
        slots = [s for s in self.topology.slots if s.pool in pools and s.name in self._actors]
        pings = {s.name: self.actor(s).ping.remote() for s in slots}
        ray.wait(list(pings.values()), num_returns=len(pings), timeout=timeout_s)
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
