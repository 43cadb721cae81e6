"""Streamed rollouts: each prompt group goes on to scoring as soon as its responses have ended.

A generate op with ``stream`` set (config ``stream_rollouts``, :func:`mark_streaming`) is not one
call that returns the whole rollout. Each slot of its pool runs ``Worker.generate_stream``, which
yields the prompt groups whose ``n`` responses have all ended, as they end
(:func:`~.engines.stream_decode.decode_groups`), through the backend's streaming transport
(:meth:`~.interpreter.PlanExecutor.send_stream` / :meth:`~.interpreter.PlanExecutor.next_piece`: a
Ray streaming generator, or the in-process worker's Python generator). The ops after it that work
row by row or group by group — its **streamed region**, :func:`streamed_region` — run on each
piece as it arrives, on their own pools (a score of the first groups is sent while the last groups
are still decoding), and the pieces are joined in prompt order (not in the order they finished)
before anything batch-wise runs: the first op outside the region (an update, a whitening) sees
exactly the batch a run without streaming produces, whatever the timing.

Which ops are row- or group-wise is declared here (:data:`GRANULARITY`, by node kind and compute
op name); an op not declared is batch-wise, which is always safe (it waits for the join). An op
joins the region when every input comes from the generate node or another region op, it is
row-/group-wise, and none of its plan dependencies lies downstream of the generate op outside
the region (an offload between generation and a log-prob keeps that log-prob out).

Groups that arrive while the region still works on a piece wait and go on together as the next piece: when
the region keeps up, each group goes on alone; when it is the slower side, its calls grow instead of queueing
up (fewer round trips). Each piece's ops keep the plan's order: an op is sent for a piece only when its dependencies are
done (for that piece, or, for ops outside the region, in the stream) and no earlier op of its pools
in the plan waits to be sent. Every send and completion takes the executor's next event number, as
for whole ops, and each piece's op gets a span of its own (op timings sum them).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch

from ..batch import Batch
from ..compiler.plan import ExecutionPlan, PlanOp
from ..errors import ExecutionError
from ..graph import Graph, Node
from .dispatch import split_for_ranks
from .node_calls import node_call
from .spans import Span

if TYPE_CHECKING:
    from .interpreter import InFlight, IterationState, PlanExecutor, Stream

__all__ = ["GRANULARITY", "KIND_GRANULARITY", "granularity", "streamed_region", "mark_streaming", "StreamedFlight",
           "start_streamed"]

KIND_GRANULARITY: dict[str, str] = {"score": "row", "infer": "row"}
"""Node kind -> how it reads its batch: a reward and a model forward look at one sample at a time."""

GRANULARITY: dict[str, str] = {
    # row-wise: each output row is a function of the same input row only
    "old_log_probs_from_rollout": "row", "kl": "row", "score_to_token_rewards": "row", "kl_in_reward": "row",
    "overlong_penalty": "row", "env_scores": "row",
    # group-wise: each row depends on the rows of its group (same group_index) only
    "grpo_advantage": "group", "rloo_advantage": "group",
}
"""Compute op name -> ``row`` or ``group``; every other compute op is batch-wise (whitening, REINFORCE++'s batch
baseline, GPG's batch-level rescaling, importance-weight normalisation, filters)."""

_STREAMABLE = ("row", "group")
_ORDER_STRIDE = 1 << 40
"""Join key of a row: ``rank * _ORDER_STRIDE + row within the rank's result`` (rank-major = the merged order)."""


def granularity(node: Node) -> str:
    """``row``, ``group`` or ``batch``: what a node's output rows depend on (:data:`GRANULARITY`)."""
    if node.kind == "compute":
        return GRANULARITY.get(node.op, "batch")
    return KIND_GRANULARITY.get(node.kind, "batch")


def streamed_region(ops: Sequence[PlanOp], graph: Graph, generate: PlanOp) -> tuple[PlanOp, ...]:
    """The ops of ``ops`` (in plan order) that run piece by piece after the streamed ``generate`` op."""
    downstream, region, names = {generate.name}, [], {generate.node}
    waiting_pools: set[str] = set()  # pools of ops that wait for the whole rollout: later ops there cannot stream
    for op in ops:
        if op.name == generate.name or not any(d in downstream for d in op.deps):
            continue
        downstream.add(op.name)
        pools = {op.pool, op.target_pool} - {None}
        if _streams_after(op, graph, generate, names, downstream, region) and not pools & waiting_pools:
            region.append(op)
            names.add(op.node)
        else:
            waiting_pools |= pools
    return tuple(region)


def _streams_after(op: PlanOp, graph: Graph, generate: PlanOp, names: set[str], downstream: set[str],
                   region: list[PlanOp]) -> bool:
    """Whether ``op`` can run piece by piece: a row-/group-wise node reading only the rollout and region ops, with
    no dependency on an op that waits for the whole rollout."""
    if op.kind != "node" or op.iteration_offset != generate.iteration_offset:
        return False
    node = graph.node(op.node)
    if granularity(node) not in _STREAMABLE or not node.inputs or not all(i.source in names for i in node.inputs):
        return False
    inside = {generate.name, *(o.name for o in region)}
    return all(d in inside or d not in downstream for d in op.deps)


def mark_streaming(plan: ExecutionPlan) -> ExecutionPlan:
    """``plan`` with ``stream`` set on its generate ops that can stream: single-turn rollouts (no ``env``) of a
    graph without a dynamic-sampling region. Plans that have none are returned as they are."""
    if plan.graph.resample:
        return plan
    ops = []
    for op in plan.ops:
        node = plan.graph.node(op.node) if op.kind == "node" else None
        streams = node is not None and node.kind == "generate" and getattr(node.attrs, "env", None) is None
        ops.append(op.model_copy(update={"stream": True}) if streams and not op.stream else op)
    return plan.model_copy(update={"ops": tuple(ops)})


@dataclass
class _Piece:
    """One piece of a streamed rollout: its rows' join keys and the region's outputs for them so far."""

    keys: torch.Tensor
    stream: "Stream"
    inflight: dict[str, "InFlight"] = field(default_factory=dict)

    @property
    def done(self) -> set[str]:
        return self.stream.done


class StreamedFlight:
    """A streamed generate op and its region in flight; the interpreter drives it like an :class:`InFlight`
    (``waiting``, ``collect``, ``complete``)."""

    kind = "node"

    def __init__(self, ex: "PlanExecutor", op: PlanOp, stream: "Stream"):
        from .interpreter import IterationState, Stream

        self.ex, self.op, self.stream = ex, op, stream
        self.node = ex.graph.node(op.node)
        self.region = streamed_region(stream.pending, ex.graph, op)
        self._names = {o.name for o in self.region}
        call = node_call(self.node, stream.state.env)
        if len(call.args) != 1:
            raise ExecutionError(f"op {op.name!r}: a multi-turn rollout (env=) cannot stream; set stream_rollouts=false")
        self.slots = ex.topology.pool_slots(op.pool)
        self.split = split_for_ranks("generate", call.batch, len(self.slots))
        self.offsets = [sum(self.split.sizes[:r]) for r in range(len(self.slots))]
        self.refs = [ex.send_stream(slot, "generate_stream", call.role, part, *call.args)
                     for slot, part in zip(self.slots, self.split.parts)]
        self.live = set(range(len(self.slots)))
        self.times: dict[int, tuple[float, float]] = {}
        self.results: dict[int, Any] = {}
        self.pieces: list[_Piece] = []
        self.arrived: list[tuple[torch.Tensor, Batch]] = []
        """Groups yielded while the region still works on the last piece: they go on together as the next one."""
        self.sent, self.call, self.sent_at = -1, 0, 0.0
        self._make_stream = lambda env: Stream([], IterationState(env=env), stream.iteration)

    # -- what the interpreter asks -----------------------------------------------------------------
    def waiting(self) -> list:
        refs = [self.refs[i] for i in sorted(self.live)]
        for piece in self.pieces:
            for flight in piece.inflight.values():
                refs.extend(flight.waiting())
        return refs

    def collect(self, ex: "PlanExecutor") -> bool:
        """Take at most one new piece per generating slot, move every piece's ops on; True when all is done."""
        live = sorted(self.live)
        for i, ready in zip(live, ex.ready([self.refs[i] for i in live]) if live else []):
            if ready:
                self._take(i)
        if self.sent >= 0 and not self.live and "generated" not in self.results:
            self.results["generated"] = ex.next_event()
            self._record_generation()
        for piece in self.pieces:
            self._advance(piece)
        if self.arrived and all(self._piece_done(p) for p in self.pieces):
            self._start_piece()
        return not self.live and not self.arrived and all(self._piece_done(p) for p in self.pieces)

    def finish(self, results: Sequence[Any]) -> None:
        from .node_calls import node_output

        state, pad_rows = self.stream.state, 0
        keys = torch.cat([p.keys for p in self.pieces])
        order = torch.argsort(keys)
        total = len(keys)
        prompts = sum(self.split.sizes)
        if self.split.pad and prompts:
            pad_rows = self.split.pad * (total // prompts)
        keep = order[:total - pad_rows]
        for name in [self.node.name, *(o.node for o in self.region)]:
            joined = Batch.concat([p.stream.state.env[name] for p in self.pieces])[keep]
            state.env[name] = node_output(self.node, joined, state.metrics) if name == self.node.name else joined
        self.stream.done.update(self._names)
        self.stream.pending[:] = [o for o in self.stream.pending if o.name not in self._names]

    def complete(self, ex: "PlanExecutor", iteration: int) -> None:
        """Join the pieces (:meth:`finish`); the generation and each piece's ops were recorded as they ended."""
        self.finish(())

    # -- the pieces ------------------------------------------------------------------------------------
    def _take(self, rank: int) -> None:
        got = self.ex.next_piece(self.refs[rank], self.slots[rank], f"op {self.op.name!r}")
        if got is None:
            self.live.discard(rank)
            self.results[rank] = None
            return
        (rows, batch), (start, end) = got
        first, _ = self.times.get(rank, (start, end))
        self.times[rank] = (first, end)
        if not self.split.had_groups:
            batch = batch.with_fields(group_index=batch["group_index"] + self.offsets[rank])
        self.arrived.append((rows.to(torch.long) + rank * _ORDER_STRIDE, batch))

    def _start_piece(self) -> None:
        """The groups that arrived since the last piece started, as one piece (fewer, larger calls when the region's
        pools are the slower side; one group per piece when they keep up)."""
        keys = torch.cat([k for k, _ in self.arrived])
        batch = Batch.concat([b for _, b in self.arrived]) if len(self.arrived) > 1 else self.arrived[0][1]
        self.arrived = []
        piece = _Piece(keys, self._make_stream({self.node.name: batch}))
        piece.done.add(self.op.name)
        self.pieces.append(piece)
        self._advance(piece)

    def _piece_done(self, piece: _Piece) -> bool:
        return not piece.inflight and all(o.name in piece.done for o in self.region)

    def _advance(self, piece: _Piece) -> None:
        from .interpreter import OP_SUBMITTERS

        ex = self.ex
        for name, flight in list(piece.inflight.items()):
            if flight.collect(ex):
                del piece.inflight[name]
                flight.complete(ex, self.stream.iteration)
                piece.done.add(name)
        progress = True
        while progress:
            progress, blocked = False, set()
            for op in self.stream.pending:  # plan order: an unsent op blocks its pools' later ops
                pools = {op.pool, op.target_pool} - {None}
                if op.name not in self._names:
                    blocked |= pools
                    continue
                if op.name in piece.done or op.name in piece.inflight:
                    continue
                if not all(d in piece.done or d in self.stream.done for d in op.deps) or pools & blocked:
                    blocked |= pools
                    continue
                if op.pool is None:
                    ex.run_controller(op, piece.stream)
                    piece.done.add(op.name)
                    progress = True
                else:
                    flight = OP_SUBMITTERS["node"](ex, op, piece.stream.state)
                    flight.sent, flight.call = ex.next_event(), ex.iteration
                    piece.inflight[op.name] = flight

    def _record_generation(self) -> None:
        ex, op = self.ex, self.op
        fields = dict(op=op.name, node=op.node, kind=self.node.kind, role=op.role, iteration=self.stream.iteration,
                      sent=self.sent, done=self.results["generated"], call=self.call)
        spans = []
        for i, slot in enumerate(self.slots):
            start, end = self.times.get(i, (0.0, 0.0))
            spans.append((start, end))
            ex.worker_spans.append(Span(device=slot.name, start=ex.clock(start), end=ex.clock(end), **fields))
        starts, ends = zip(*spans)
        ex.recorder.add(Span(device=op.pool, start=ex.clock(min(starts)), end=ex.clock(max(ends)), **fields))


def start_streamed(ex: "PlanExecutor", op: PlanOp, stream: "Stream") -> StreamedFlight:
    """Send a streamed generate op (``op.stream``) to its pool; the interpreter drives the returned flight."""
    return StreamedFlight(ex, op, stream)
