"""The plan interpreter both executors share: a ready queue over the plan's ops.

One run loop for every executor: local and Ray differ only in how an op reaches a worker. A :class:`Stream` is
one run through a list of plan ops with its own environment (producer name ->
:class:`Batch`): a whole iteration, or, with overlap (:mod:`.overlap`), the
generation working ahead for the next iteration. :class:`PlanExecutor` drives
streams:

* an op is **sent** as soon as its ``deps`` are done and every earlier op of
  its pool (and of its target pool) has been sent — the plan's per-pool order;
  controller ops (``compute`` nodes) run at once in this process;
* sending goes through :data:`OP_SUBMITTERS` (one entry per plan op kind:
  node, weight_sync, offload, onload, and the control kinds save_state,
  load_state, set_reward, export, describe), which asks each slot of the op's
  pool for its part — a node's batch split over the pool's data-parallel ranks
  (:mod:`.dispatch`) — as one method of the :class:`~.worker.Worker` per op kind,
  and returns an :class:`InFlight` whose ``finish`` merges the slots' results into
  the environment (a control op's: its slots' results in rank order, in ``results``);
* the executor waits on every in-flight op at once and finishes each as its
  slots' results arrive;
* a generate op with ``stream`` set is sent by :func:`~.streaming.start_streamed` instead: its
  pool's slots yield prompt groups as they end, and the row- and group-wise ops after it run on
  each group as it arrives, joined in prompt order before anything batch-wise (:mod:`.streaming`).
  Its flight answers the same three questions (``waiting``, ``collect``, ``complete``).

Every send and every completion takes the next number of :attr:`PlanExecutor.events`,
and each op's span keeps its numbers (``sent``, ``done``) and the call it was sent in
(``call``): the order in which the interpreter issued and collected its ops, which is what
it decided and does not depend on how fast the workers were (their start and end times do).

A graph's dynamic-sampling region (:mod:`hybridflow.graph.resampling`) is run here too, by
the :class:`~.resampling.ResampleRun` of the stream: ops after the region wait for it, and
when its filter has run its body's ops are sent again until the batch is full.

Everything the controller asks of the workers is a plan run here: an iteration
(:meth:`PlanExecutor.run_iteration`), or a plan derived from the training plan
(:meth:`PlanExecutor.run_plan`: validation, checkpoint, restore, export, ...; see
:mod:`hybridflow.compiler.control`). A backend (a subclass) says only how an op
reaches a slot and how its result comes back, through the **transport**:
:meth:`PlanExecutor.send` (``Worker.run(kind, *args)``: at once on the
LocalExecutor's in-process workers, a Ray object ref on the RayExecutor's
actors) returns a handle; :meth:`~PlanExecutor.ready`
says which handles are done, :meth:`~PlanExecutor.wait` blocks until one is,
:meth:`~PlanExecutor.fetch` returns a done handle's value (a slot's failure as a
project error), and :meth:`~PlanExecutor.check_running` refuses when the workers
are gone. Weight syncs, offloads and onloads run where the plan puts them;
nothing is re-decided here.
"""
from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..compiler.plan import CONTROL_KINDS, ExecutionPlan, PlanOp
from ..errors import ExecutionError, HybridflowError, PlanError
from ..graph import CONTROLLER
from ..batch import Batch
from .dispatch import balances_tokens, merge_results, split_for_ranks
from .node_calls import node_call, node_output, read_by_update, reused_log_probs, run_compute
from .resampling import Refill, ResampleRun
from .node_metrics import graph_metrics
from .roles import RoleSpec
from .spans import Span, SpanRecorder
from .streaming import start_streamed
from .topology import Slot, Topology, sync_group, topology
from .watchdog import Watchdog

__all__ = ["IterationResult", "IterationState", "Stream", "InFlight", "OP_SUBMITTERS", "PlanExecutor", "sync_metrics"]


@dataclass
class IterationResult:
    """What one iteration produced: every node's output batch and the update metrics."""

    env: dict[str, Batch]
    metrics: dict[str, float] = field(default_factory=dict)
    results: dict[str, list] = field(default_factory=dict)
    """Control op name -> its slots' results, in rank order (:meth:`PlanExecutor.run_plan`)."""


@dataclass
class IterationState:
    """The environment (producer name -> Batch), metrics and control results of one run through plan ops."""

    env: dict[str, Batch]
    metrics: dict[str, float] = field(default_factory=dict)
    results: dict[str, list] = field(default_factory=dict)
    args: Mapping[str, Any] = field(default_factory=dict)
    """Control op name -> the argument its slots are given (a folder, a reward spec)."""


@dataclass
class InFlight:
    """An op sent to ``slots`` (``refs[i]`` is slot i's result); ``finish(results)`` runs when all are in."""

    op: PlanOp
    slots: tuple[Slot, ...]
    refs: list
    finish: Callable[[Sequence[Any]], None]
    kind: str
    results: dict[int, Any] = field(default_factory=dict)
    times: dict[int, tuple[float, float]] = field(default_factory=dict)
    sent: int = -1
    """The executor's event number when it was sent (:attr:`PlanExecutor.events`)."""
    call: int = 0
    """The ``run_iteration`` call during which it was sent."""
    sent_at: float = 0.0
    """``time.monotonic()`` when it was sent (the watchdog's report says how long ago)."""

    def waiting(self) -> list:
        """The handles still to come in."""
        return [ref for i, ref in enumerate(self.refs) if i not in self.results]

    def collect(self, ex: "PlanExecutor") -> bool:
        """Fetch the slots' results that are ready; True when all are in. A failed slot raises at once."""
        waiting = [i for i in range(len(self.refs)) if i not in self.results]
        for i, ready in zip(waiting, ex.ready([self.refs[i] for i in waiting])):
            if ready:
                self.results[i], self.times[i] = ex.fetch(self.refs[i], self.slots[i], f"op {self.op.name!r}")
        return len(self.results) == len(self.refs)

    def complete(self, ex: "PlanExecutor", iteration: int) -> None:
        """Merge the slots' results (``finish``) and record the op's spans with the next event number."""
        self.finish([self.results[i] for i in range(len(self.refs))])
        ex.record_flight(self, iteration, ex.next_event())


@dataclass
class Stream:
    """Plan ops to send (``pending``), sent (``inflight``) and finished (``done``), for one ``iteration``."""

    pending: list[PlanOp]
    state: IterationState
    iteration: int
    done: set[str] = field(default_factory=set)
    inflight: dict[str, InFlight] = field(default_factory=dict)
    inputs: Mapping[str, Batch] | None = None
    """The graph inputs this stream works on (a generation ahead is matched to the next call's inputs)."""
    resample: ResampleRun | None = None
    """The graph's dynamic-sampling region, when it has one."""
    submitters: dict[str, Callable[["PlanExecutor", PlanOp, IterationState], "InFlight"]] = field(default_factory=dict)
    """Op name -> how this stream sends that op, in place of :data:`OP_SUBMITTERS` (partial rollouts send a
    generation in segments: :mod:`.partial`; a staged weight sync its two halves: :mod:`.staged_sync`)."""
    after: "Stream | None" = None
    """A stream whose pool order this one keeps: none of this stream's ops on a pool is sent while ``after`` still
    has ops to send to that pool (generations working ahead with a staged weight sync, :mod:`.staged_sync`)."""

    def unsent_pools(self) -> set[str]:
        """The pools this stream still has ops to send to."""
        return {pool for op in self.pending for pool in (op.pool, op.target_pool) if pool is not None}

    @property
    def finished(self) -> bool:
        return not self.pending and not self.inflight


# -- op submitters: one per plan op kind ----------------------------------------------------------

def _node(ex: "PlanExecutor", op: PlanOp, state: IterationState) -> InFlight:
    node = ex.graph.node(op.node)
    call = node_call(node, state.env)
    if node.kind == "generate":  # the engine may keep the decode's products only for an update that reads them
        call.args[0]["keep_products"] = read_by_update(ex.graph, node)
    slots = ex.topology.pool_slots(op.pool)
    balance = balances_tokens(ex.specs.get(call.role))
    split = split_for_ranks(call.method, call.batch, len(slots), balance_tokens=balance)
    refs = [ex.send(slot, call.method, call.role, part, *call.args) for slot, part in zip(slots, split.parts)]

    def finish(results: Sequence[Any]) -> None:
        state.env[node.name] = node_output(node, merge_results(call.method, split, results), state.metrics)

    return InFlight(op, slots, refs, finish, node.kind)


def sync_metrics(state: IterationState, role: str, stats: Sequence[Any]) -> None:
    """``weight_sync/<role>/...`` metrics of a sync's slots' :class:`~.weight_sync.SyncStats` into ``state``."""
    moved = max(stats, key=lambda s: s.bytes)
    metrics = moved.metrics(role)
    metrics[f"weight_sync/{role}/peak_mb"] = max(s.peak_bytes for s in stats) / 2**20
    state.metrics.update(metrics)


def _weight_sync(ex: "PlanExecutor", op: PlanOp, state: IterationState) -> InFlight:
    if op.target_pool and op.target_pool != op.pool:
        senders, receivers = ex.topology.pool_slots(op.pool), ex.topology.pool_slots(op.target_pool)
        group, src = sync_group(op.role, op.pool, op.target_pool), senders[0].global_rank
        refs = [ex.send(s, "send_weights", op.role, group, src) for s in senders]
        refs += [ex.send(s, "receive_weights", op.role, group, src) for s in receivers]
        slots = senders + receivers
    else:
        slots = ex.topology.pool_slots(op.pool)
        refs = [ex.send(s, "sync_weights", op.role) for s in slots]
    return InFlight(op, slots, refs, lambda results: sync_metrics(state, op.role, results), "weight_sync")


def _move(kind: str):
    def submit(ex: "PlanExecutor", op: PlanOp, state: IterationState) -> InFlight:
        slots = ex.topology.pool_slots(op.pool)
        refs = [ex.send(s, kind, op.role, op.items) for s in slots]
        return InFlight(op, slots, refs, lambda results: None, kind)

    return submit


def _control(kind: str):
    def submit(ex: "PlanExecutor", op: PlanOp, state: IterationState) -> InFlight:
        slots = ex.topology.pool_slots(op.pool)
        refs = [ex.send(s, kind, op.role, op.items, state.args.get(op.name)) for s in slots]
        return InFlight(op, slots, refs, lambda results: state.results.__setitem__(op.name, list(results)), kind)

    return submit


OP_SUBMITTERS: dict[str, Callable[["PlanExecutor", PlanOp, IterationState], InFlight]] = {
    "node": _node, "weight_sync": _weight_sync, "offload": _move("offload"), "onload": _move("onload"),
    **{kind: _control(kind) for kind in CONTROL_KINDS},
}
"""Plan op kind -> how it is sent to its slots (the one op-kind table of the runtime)."""


class PlanExecutor(ABC):
    """The run loop over a bound plan (module docstring); subclasses provide the slots and the transport."""

    overlaps = False
    """Whether this backend runs pools at the same time (needed by staleness > 0)."""

    def __init__(self, plan: ExecutionPlan, specs: Mapping[str, RoleSpec], *, recorder: SpanRecorder | None = None):
        if plan.machine is None:
            raise PlanError(f"plan of graph {plan.graph.name!r} (compiled for {plan.cluster}) is not bound to "
                            "a machine; bind it first: hybridflow.compiler.bind(plan, hybridflow.compiler.local_machine())")
        self.plan = plan
        self.plan_graph = plan.graph
        self.graph = self.plan_graph
        """The graph the current (or last) call runs: the plan's, with that call's ``params``."""
        missing = [r.name for r in self.graph.roles if r.name not in specs]
        if missing:
            raise ExecutionError(f"no RoleSpec for role(s) {missing}; give one per role of graph {self.graph.name!r}")
        if plan.staleness and not self.overlaps:
            raise ExecutionError(f"the plan has staleness {plan.staleness} (generation overlapping training on a pool of "
                                 f"its own), which {type(self).__name__} cannot run: its pools take turns in one process. "
                                 "Use executor='ray', or staleness 0")
        self.specs = dict(specs)
        self.topology: Topology = topology(plan, {r.name: r.kind for r in self.graph.roles})
        self.recorder = recorder or SpanRecorder()
        self.worker_spans: list[Span] = []
        self.side_spans: list[Span] = []
        """Spans of plans run beside the iterations (:meth:`run_plan`: validation)."""
        self.iteration = 0
        self.events = 0
        """How many sends and completions this executor has issued (each one's number goes to its op's span)."""
        self.ahead: list[Stream] = []
        """Staleness k: the next iterations' generations (at most k, in step order), left in flight or finished by
        the last call (:mod:`.overlap`)."""
        self.watchdog: Watchdog | None = None
        """Reports (and stops, as configured) a plan run in which no op completes for a while (:mod:`.watchdog`)."""
        self.partial_rollouts = None
        """Staleness >= 1: what happens to a generation in flight at a weight update (:class:`.partial.PartialRollouts`;
        None: it finishes with the weights it started with)."""
        self.weight_sync = "collective"
        """Staleness >= 1: how a new policy version reaches the rollout pool, 'collective' or 'staged'
        (:meth:`set_weight_sync`, :mod:`.staged_sync`)."""

    def set_weight_sync(self, mode: str) -> None:
        """Bring new policy versions to a rollout pool of its own by ``mode``: 'collective' (one collective of both
        pools) or 'staged' (a staging buffer, :mod:`.staged_sync`); ConfigError where this plan or executor cannot."""
        from .staged_sync import check_weight_sync

        setting = self.partial_rollouts.mode if self.partial_rollouts is not None else "finish"
        check_weight_sync(mode, staleness=self.plan.staleness, executor="ray" if self.overlaps else "local",
                          partial_rollouts=setting)
        self.weight_sync = mode

    # -- the transport (every backend implements it; module docstring) ---------------------------
    @abstractmethod
    def send(self, slot: Slot, kind: str, *args) -> Any:
        """Start ``Worker.run(kind, *args)`` on ``slot`` (op kind ``kind``'s method of the slot's worker);
        returns a handle for :meth:`ready`, :meth:`wait` and :meth:`fetch`."""

    @abstractmethod
    def wait(self, refs: list, timeout: float) -> None:
        """Block until one of ``refs`` is ready or ``timeout`` seconds passed."""

    @abstractmethod
    def ready(self, refs: list) -> list[bool]:
        """Which of ``refs`` are ready, without blocking."""

    @abstractmethod
    def fetch(self, ref: Any, slot: Slot, what: str) -> tuple[Any, tuple[float, float]]:
        """The (value, (start, end)) of a ready ref; a slot's failure as a project error naming ``what``."""

    def send_stream(self, slot: Slot, kind: str, *args) -> Any:
        """Start the generator ``Worker.run_stream(kind, *args)`` on ``slot`` (a streamed op, :mod:`.streaming`); the
        handle is ready (:meth:`ready`) when its next piece is, which :meth:`next_piece` returns."""
        raise ExecutionError(f"{type(self).__name__} cannot stream ops; set stream_rollouts=false")

    def next_piece(self, handle: Any, slot: Slot, what: str) -> tuple[Any, tuple[float, float]] | None:
        """The next (piece, (start, end)) of a ready stream handle; None when it has ended."""
        raise ExecutionError(f"{type(self).__name__} cannot stream ops; set stream_rollouts=false")

    def check_running(self) -> None:
        """Raise when the workers are gone (RayExecutor after shutdown)."""

    def shutdown(self) -> None:
        """Stop the workers and give their devices back (RayExecutor); this process's own workers need nothing."""

    poll_s = 1.0
    """How long one :meth:`wait` of the run loop blocks at most, seconds."""

    runs_inline = False
    """Whether :meth:`send` runs the op in the controller's thread (a blocked op then blocks the run loop)."""

    def worker_stacks(self, slots: Sequence[Slot], timeout_s: float) -> dict[str, dict[str, str]]:
        """Slot name -> its worker's Python stacks (thread -> stack), for the slots that answer within ``timeout_s``
        (the watchdog's report); none where the workers are this process's own threads."""
        return {}

    # -- one iteration -----------------------------------------------------------------------
    def run_iteration(self, inputs: Mapping[str, Batch], *,
                      next_inputs: Mapping[str, Batch] | Sequence[Mapping[str, Batch]] | None = None,
                      params: Mapping[str, Mapping[str, object]] | None = None, refill: Refill | None = None) -> IterationResult:
        """Run every op of the plan once, feeding the graph inputs (e.g. ``{"prompts": batch}``).

        The result's metrics are the updates', the weight syncs' and a summary of every node's
        float outputs (:func:`~.node_metrics.graph_metrics`: ``<node>/<field>/mean``, ...).

        ``params`` (node name -> {parameter: value}) sets compute nodes' parameters for the ops
        this call runs (they run here, on the controller; see :meth:`Graph.with_params`).

        With a plan of ``staleness`` k > 0, ``next_inputs`` are the following steps' inputs, in order, at most
        k of them (one mapping: the next step's): the generation of those not started yet (the ops with
        ``iteration_offset`` k) starts now, with the weights before this step's update, runs while this step
        trains, and is what a later call trains on (see :mod:`.overlap`).

        ``refill(round)`` gives the graph inputs of each further round of a dynamic-sampling
        region (the next prompts of the data); None: every round resamples ``inputs``.
        """
        self.graph = self.plan_graph.with_params(params or {})
        self._check_inputs(inputs)
        if self.plan.staleness == 0:
            stream = Stream(list(self.plan.ops), IterationState(env=dict(inputs)), self.iteration)
            stream.resample = ResampleRun.start(self.graph, self.plan.ops, inputs, refill)
            self.drive([stream], stream)
            self.iteration += 1
            result = IterationResult(env=stream.state.env, metrics=stream.state.metrics)
        else:
            from .overlap import run_overlapped

            if self.graph.resample:
                raise ExecutionError(f"graph {self.graph.name!r} resamples part of each iteration (dynamic sampling), which "
                                     f"a plan with staleness {self.plan.staleness} cannot overlap; compile it with staleness 0")
            from .overlap import following_inputs

            for following in following_inputs(next_inputs):
                self._check_inputs(following)
            result = run_overlapped(self, inputs, next_inputs)
        result.metrics.update(graph_metrics(self.graph, result.env))
        return result

    def run_plan(self, plan: ExecutionPlan, inputs: Mapping[str, Batch] | None = None, *,
                 args: Mapping[str, Any] | None = None) -> IterationResult:
        """Run another plan on this executor's pools once (the validation plan of
        :func:`hybridflow.compiler.validation.validation_plan`, the control plans of
        :func:`hybridflow.compiler.control.control_plan`), without counting it as an iteration.

        ``args`` (control op name -> value) is what each control op's slots are given (a checkpoint
        folder, a reward spec); the result's ``results`` holds each control op's slots' results in rank
        order. Its pools must be pools of this executor's plan (same names, same devices); its spans go to
        :attr:`side_spans` (drawn in the trace, kept out of the iterations' timings).
        """
        mine = {p.name: p.devices for p in self.plan.pools}
        foreign = [p.name for p in plan.pools if mine.get(p.name) != p.devices]
        if foreign:
            raise PlanError(f"plan {plan.graph.name!r} uses pools {foreign} that this executor does not run "
                            f"(its pools: {', '.join(mine)}); derive it from the executor's plan")
        self._finish_ahead({pool for op in plan.ops for pool in (op.pool, op.target_pool) if pool is not None})
        saved_graph, saved_recorder = self.graph, self.recorder
        self.graph = plan.graph
        self.recorder = SpanRecorder()
        self.recorder.origin = saved_recorder.origin
        try:
            inputs = dict(inputs or {})
            self._check_inputs(inputs)
            stream = Stream(list(plan.ops), IterationState(env=inputs, args=dict(args or {})), self.iteration)
            self.drive([stream], stream)
        finally:
            self.side_spans.extend(self.recorder.spans)
            self.graph, self.recorder = saved_graph, saved_recorder
        return IterationResult(env=stream.state.env, metrics=stream.state.metrics, results=stream.state.results)

    def _finish_ahead(self, pools: set[str]) -> None:
        """Staged weight sync: drive the generations working ahead to their end before another plan's ops go to
        their ``pools`` while any of them still has ops to send there. A generation's load waits for its stage
        (:mod:`.staged_sync`), so an op of another plan — the validation plan's weight sync — could otherwise be sent
        between the loads and generate ops of the generations ahead. The collective sync sends a generation whole."""
        if self.weight_sync != "staged" or not any(s.unsent_pools() & pools for s in self.ahead):
            return
        for stream in self.ahead:
            self.drive(list(self.ahead), stream)

    def _check_inputs(self, inputs: Mapping[str, Batch]) -> None:
        expected = {i.name for i in self.graph.inputs}
        if set(inputs) != expected:
            raise ExecutionError(f"graph {self.graph.name!r} takes inputs {sorted(expected)}, got {sorted(inputs)}")
        self.check_running()

    def next_event(self) -> int:
        """The next event number (a send or a completion; :attr:`events`)."""
        self.events += 1
        return self.events

    def drive(self, streams: list[Stream], target: Stream, *, settle: Sequence[Stream] = (),
              send: Sequence[Stream] = ()) -> None:
        """Send and collect the ops of ``streams`` until ``target`` has run all its ops (others may stay in flight).

        Streams in ``settle`` are driven until none of their transitions (weight sync, offload, onload) is in
        flight, and whatever they can send then is sent before this returns: a generation working ahead is
        left running, not waiting to be sent by a later call. Streams in ``send`` are not waited for, but what
        they can send when ``target`` is done is sent before this returns.
        """
        with self.watchdog.watch(self, streams) if self.watchdog else contextlib.nullcontext():
            self._drive(streams, target, settle, send)

    def _drive(self, streams: list[Stream], target: Stream, settle: Sequence[Stream], send: Sequence[Stream]) -> None:
        def moving(stream: Stream) -> bool:
            return any(f.kind != "node" for f in stream.inflight.values())

        while not target.finished or any(moving(s) for s in settle):
            for stream in streams:
                self._send_ready(stream)
            flights = [(stream, f) for stream in streams for f in stream.inflight.values()]
            if not flights:
                if not target.finished:
                    raise ExecutionError(f"ops {[op.name for op in target.pending]} wait on ops that never run; "
                                         "the plan's deps are broken")
                break
            refs = [ref for _, f in flights for ref in f.waiting()]
            self.wait(refs, self.poll_s)
            if self.watchdog:
                self.watchdog.check()
            for stream, flight in flights:
                if flight.collect(self):
                    del stream.inflight[flight.op.name]
                    flight.complete(self, stream.iteration)
                    stream.done.add(flight.op.name)
                    if self.watchdog:
                        self.watchdog.op_done(flight.op.name, flight.op.pool, stream.iteration)
        for stream in [*settle, *send]:
            self._send_ready(stream)

    def _send_ready(self, stream: Stream) -> None:
        """Send (or, for controller ops, run) every op whose deps are done, keeping each pool's plan order."""
        progress = True
        while progress:
            progress, blocked = False, stream.after.unsent_pools() if stream.after is not None else set()
            for op in list(stream.pending):
                if stream.resample is not None and stream.resample.holds(op):
                    continue  # after the dynamic-sampling region; it does not block its pools' rounds
                pools = {op.pool, op.target_pool} - {None}
                if not all(d in stream.done for d in op.deps) or pools & blocked:
                    blocked |= pools
                    continue
                stream.pending.remove(op)
                self.recorder.started(op.name)
                if self.watchdog:  # a backend that runs ops inline (and the controller) is inside it until it returns
                    self.watchdog.starting(op, stream.iteration)
                if op.pool is None:
                    self.run_controller(op, stream)
                    stream.done.add(op.name)
                    if self.watchdog:
                        self.watchdog.op_done(op.name, None, stream.iteration)
                    self._after_filter(op, stream)
                    progress = True
                else:
                    try:
                        submit = stream.submitters.get(op.name) or OP_SUBMITTERS[op.kind]
                        flight = start_streamed(self, op, stream) if op.stream else submit(self, op, stream.state)
                    except HybridflowError:
                        raise
                    except Exception as err:
                        raise ExecutionError(f"op {op.name!r} (role {op.role!r} on pool {op.pool!r}) could not be sent: "
                                             f"{type(err).__name__}: {err}") from err
                    flight.sent, flight.call, flight.sent_at = self.next_event(), self.iteration, time.monotonic()
                    stream.inflight[op.name] = flight
                if self.watchdog:
                    self.watchdog.sent(op, stream.iteration)

    @staticmethod
    def _after_filter(op: PlanOp, stream: Stream) -> None:
        """After a dynamic-sampling filter: send the region's body again, or let the ops after it go."""
        if stream.resample is None or op.node != stream.resample.spec.filter:
            return
        again = stream.resample.filter_done(stream.state.env, stream.state.metrics)
        stream.done.difference_update(o.name for o in again)
        stream.pending[:0] = again

    def run_controller(self, op: PlanOp, stream: Stream) -> None:
        """Run controller op ``op`` (a compute node, or a log-prob served from the rollout) here, on ``stream``'s env."""
        node = self.graph.node(op.node)
        sent = self.next_event()  # it runs here and now: sent and done in one
        with self.recorder.record(op=op.name, node=op.node, kind=node.kind, role=op.role, device=CONTROLLER,
                                  iteration=stream.iteration, sent=sent, done=sent, call=self.iteration):
            try:
                if op.reuse:
                    log_probs = reused_log_probs(stream.state.env, op.reuse)
                    stream.state.env[node.name] = node_output(node, log_probs, stream.state.metrics)
                else:
                    stream.state.env[node.name] = run_compute(node, stream.state.env)
            except HybridflowError:
                raise
            except Exception as err:
                raise ExecutionError(f"op {op.name!r} (role {op.role!r} on the controller) failed: "
                                     f"{type(err).__name__}: {err}") from err

    # -- spans ---------------------------------------------------------------------------------------
    def clock(self, wall: float) -> float:
        """A wall-clock time of a worker on the recorder's clock."""
        return wall - (time.time() - self.recorder.now())

    def record_flight(self, flight: InFlight, iteration: int, done: int) -> None:
        """The spans of a finished flight: one per slot (``worker_spans``) and one for its pool (the recorder)."""
        op = flight.op
        fields = dict(op=op.name, node=op.node, kind=flight.kind, role=op.role, iteration=iteration,
                      sent=flight.sent, done=done, call=flight.call)
        for i, slot in enumerate(flight.slots):
            start, end = flight.times[i]
            self.worker_spans.append(Span(device=slot.name, start=self.clock(start), end=self.clock(end), **fields))
        starts, ends = zip(*flight.times.values())
        self.recorder.add(Span(device=op.pool, start=self.clock(min(starts)), end=self.clock(max(ends)), **fields))

    def trace_spans(self) -> list[Span]:
        """Per-op spans (one track per pool and the controller) and per-worker spans (one track per slot)."""
        return sorted([*self.recorder.spans, *self.worker_spans, *self.side_spans], key=lambda s: s.start)
