"""How the Ray executor starts each kind of plan op on its workers (a table keyed by op kind).

A submitter sends an op to every slot it runs on without waiting and returns
an :class:`InFlight`: the object refs, one per slot, and ``finish``, which
the executor calls with the slots' results once all have arrived. Node ops
split their batch over the pool's data-parallel ranks and merge the results
(:mod:`.dispatch`); the node's inputs and outputs are gathered and read by
the same functions the LocalExecutor uses (:mod:`hybridflow.runtime.node_calls`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ...compiler.plan import PlanOp
from ..node_calls import node_call, node_output
from .dispatch import merge_results, split_for_ranks
from .topology import Slot, sync_group

if TYPE_CHECKING:
    from .executor import RayExecutor
    from .streams import IterationState

__all__ = ["InFlight", "OP_SUBMITTERS"]


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


def _node(ex: "RayExecutor", op: PlanOp, state: "IterationState") -> InFlight:
    node = ex.graph.node(op.node)
    call = node_call(node, state.env)
    slots = ex.topology.pool_slots(op.pool)
    split = split_for_ranks(call.method, call.batch, len(slots))
    refs = [ex.actor(slot).run.remote(call.method, call.role, part, call.args) for slot, part in zip(slots, split.parts)]

    def finish(results: Sequence[Any]) -> None:
        state.env[node.name] = node_output(node, merge_results(call.method, split, results), state.metrics)

    return InFlight(op, slots, refs, finish, node.kind)


def _sync_metrics(state: "IterationState", role: str, stats: Sequence[Any]) -> None:
    moved = max(stats, key=lambda s: s.bytes)
    metrics = moved.metrics(role)
    metrics[f"weight_sync/{role}/peak_mb"] = max(s.peak_bytes for s in stats) / 2**20
    state.metrics.update(metrics)


def _weight_sync(ex: "RayExecutor", op: PlanOp, state: "IterationState") -> InFlight:
    if op.target_pool and op.target_pool != op.pool:
        senders, receivers = ex.topology.pool_slots(op.pool), ex.topology.pool_slots(op.target_pool)
        group, src = sync_group(op.role, op.pool, op.target_pool), senders[0].global_rank
        refs = [ex.actor(s).send_weights.remote(op.role, group, src) for s in senders]
        refs += [ex.actor(s).receive_weights.remote(op.role, group, src) for s in receivers]
        slots = senders + receivers
    else:
        slots = ex.topology.pool_slots(op.pool)
        refs = [ex.actor(s).sync_weights.remote(op.role) for s in slots]
    return InFlight(op, slots, refs, lambda results: _sync_metrics(state, op.role, results), "weight_sync")


def _move(kind: str):
    def submit(ex: "RayExecutor", op: PlanOp, state: "IterationState") -> InFlight:
        slots = ex.topology.pool_slots(op.pool)
        refs = [getattr(ex.actor(s), kind).remote(op.role, op.items) for s in slots]
        return InFlight(op, slots, refs, lambda results: None, kind)

    return submit


OP_SUBMITTERS: dict[str, Callable[["RayExecutor", PlanOp, "IterationState"], InFlight]] = {
    "node": _node, "weight_sync": _weight_sync, "offload": _move("offload"), "onload": _move("onload"),
}
