"""Partial rollouts: a generation in flight at a weight update finishes, or goes on under the new weights.

With ``staleness`` >= 1 the generation of a later step runs while the current step trains (:mod:`.overlap`).
When the current step's update is done, the policy is newer than the weights that generation started with.
:class:`PartialRollouts` says what happens then (config ``partial_rollouts``):

* ``finish``: the generation runs whole with the weights it started with (every token one update old);
* ``continue``: the generation runs in segments of at most ``segment_tokens`` positions (one generate op
  each, :mod:`.engines.segments`); at each segment boundary, if the policy's update has completed since the
  generation's weights were synced, the newer weights are synced to the generation pool (the plan's own
  weight-sync op, sent again) and the next segment continues the unfinished responses under them, keeping
  the tokens and log-probs decoded so far. This is AReaL's interruptible generation (Fu et al. 2025, Sec.
  4.1: interrupt, load new weights, recompute the KV cache, continue) with segment granularity, and what
  verl's fully asynchronous trainer calls partial rollout; slime aborts and resumes requests likewise.

Each response token carries the version of the weights that decoded it: the generate output's
``policy_version`` int64[B, R] (the trained policy's step count of the weights that decoded each token, -1 at padding: :mod:`.policy_version`), so a
continued response switches version exactly at the cut.

Everything is a plan op, sent through the interpreter's one run loop: the first segment is the plan's
generate op, later ones are ops named ``<generate op>#<k>`` and a mid-generation sync ``<sync op>#<k>``,
added to the generation's stream as the segments come back (their spans record the order the controller
decided: event numbers, never times). Each data-parallel rank continues the rows it decoded (its sampler
seed stays with its rows); the ranks' parts are merged once every row is finished.

The step's metrics say what happened: ``<generate node>/segments`` (generate ops the generation took) and
``<generate node>/midway_syncs`` (1 when it was continued under newer weights).

Only single-turn generate nodes that no other op of their stream waits on are cut; the rest run whole.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Sequence

from ..batch import Batch
from ..compiler.plan import PlanOp
from ..errors import ConfigError
from .dispatch import Split, balances_tokens, merge_results, split_for_ranks
from .engines.segments import PARTIAL_FIELDS
from .interpreter import InFlight, IterationState, Stream
from .node_calls import node_call, node_output

if TYPE_CHECKING:
    from .interpreter import PlanExecutor

__all__ = ["PartialRollouts", "MODES", "segment_generation"]

MODES = ("finish", "continue")
"""What a generation in flight at a weight update does (module docstring)."""


@dataclass(frozen=True)
class PartialRollouts:
    """The executor's partial-rollout setting (:attr:`PlanExecutor.partial_rollouts`)."""

    mode: Literal["finish", "continue"] = "finish"
    segment_tokens: int = 8

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"partial_rollouts must be one of {MODES}, got {self.mode!r}")
        if self.segment_tokens < 1:
            raise ConfigError(f"partial_segment_tokens must be at least 1, got {self.segment_tokens}")


def segment_generation(ex: "PlanExecutor", generation: Stream, step: Stream) -> None:
    """In ``continue`` mode, send ``generation``'s generate ops in segments, continuing under the policy's newer
    weights once ``step`` (the step that trains while it runs) has updated the policy. Nothing in ``finish`` mode.

    Called by :func:`.overlap.run_overlapped` for the generation it sends ahead, before it is driven.
    """
    setting = ex.partial_rollouts
    if setting is None or setting.mode == "finish":
        return
    waited_on = {dep for op in generation.pending for dep in op.deps}
    for op in list(generation.pending):
        if op.kind != "node" or op.name in waited_on:
            continue
        node = ex.graph.node(op.node)
        if node.kind != "generate" or node.attrs.env is not None:
            continue
        syncs = [o for o in generation.pending if o.kind == "weight_sync" and o.role == op.role]
        updates = [o.name for o in step.pending if o.kind == "node" and o.role == op.role
                   and ex.graph.node(o.node).kind == "update"]
        run = _SegmentedGenerate(op, setting.segment_tokens, generation, step, sync=syncs[0] if syncs else None,
                                 updates=tuple(updates))
        generation.submitters[op.name] = run.first


@dataclass
class _SegmentedGenerate:
    """One generate op run in segments; its ranks' partial rollouts are held here between segments."""

    op: PlanOp
    segment_tokens: int
    generation: Stream
    step: Stream
    sync: PlanOp | None
    updates: tuple[str, ...]
    parts: list[Batch] = field(default_factory=list)
    split: Split | None = None
    args: tuple = ()
    segments: int = 0
    synced_update: bool = False

    def first(self, ex: "PlanExecutor", op: PlanOp, state: IterationState) -> InFlight:
        node = ex.graph.node(op.node)
        call = node_call(node, state.env)
        slots = ex.topology.pool_slots(op.pool)
        self.split = split_for_ranks(call.method, call.batch, len(slots),
                                     balance_tokens=balances_tokens(ex.specs.get(call.role)))
        self.args = (call.role, call.args[0])
        return self._send(ex, op, state, self.split.parts, resume=False)

    def resume(self, ex: "PlanExecutor", op: PlanOp, state: IterationState) -> InFlight:
        return self._send(ex, op, state, self.parts, resume=True)

    def _send(self, ex: "PlanExecutor", op: PlanOp, state: IterationState, parts: Sequence[Batch], *,
              resume: bool) -> InFlight:
        slots = ex.topology.pool_slots(op.pool)
        role, overrides = self.args
        partial = {"segment_tokens": self.segment_tokens, "resume": resume}
        refs = [ex.send(slot, "generate", role, part, overrides, None, partial) for slot, part in zip(slots, parts)]
        self.segments += 1
        return InFlight(op, slots, refs, lambda results: self._segment_done(ex, op, state, results), "generate")

    def _segment_done(self, ex: "PlanExecutor", op: PlanOp, state: IterationState, results: Sequence[Any]) -> None:
        """Store the ranks' parts; when every row is finished, the node's output; else queue the next segment
        (after a sync of the newer weights if the policy was updated since)."""
        self.parts = list(results)
        node = ex.graph.node(self.op.node)
        if all(bool(part["rollout_finished"].all()) for part in self.parts):
            merged = merge_results("generate", self.split, self.parts).drop(*PARTIAL_FIELDS)
            state.metrics[f"{node.name}/segments"] = float(self.segments)
            state.metrics[f"{node.name}/midway_syncs"] = float(self.synced_update)
            state.env[node.name] = node_output(node, merged, state.metrics)
            return
        after = op.name
        queued: list[PlanOp] = []
        if self.sync is not None and not self.synced_update and self._policy_updated():
            sync = self.sync.model_copy(update={"name": f"{self.sync.name}#{self.segments + 1}", "deps": (after,)})
            queued.append(sync)
            after = sync.name
            self.synced_update = True
        follow = self.op.model_copy(update={"name": f"{self.op.name}#{self.segments + 1}", "deps": (after,)})
        self.generation.submitters[follow.name] = self.resume
        queued.append(follow)
        self.generation.pending.extend(queued)

    def _policy_updated(self) -> bool:
        """Whether the step training beside this generation has finished its update of the policy."""
        return bool(self.updates) and all(name in self.step.done for name in self.updates)

