"""The priority order of plan ops (not a pass: ``offload`` and ``schedule`` use it).

A topological order of the ops by their deps that runs, among the ops ready
at any point, the earliest **stage** first (weight sync and generation, then
forward passes, then controller math, then updates; HybridFlow appendix C)
and, within a stage, the op that came first in the plan. Offload and onload
ops take the stage of the op they serve. It is computed by Kahn's algorithm
with a heap, O(E log V).
"""
from __future__ import annotations

import heapq

from ...errors import PlanError
from ..plan import ExecutionPlan, PlanOp

__all__ = ["STAGE_OF_KIND", "op_stage", "priority_order"]

STAGE_OF_KIND = {"weight_sync": 0, "generate": 0, "infer": 1, "score": 1, "compute": 2, "update": 3}
"""Stage per op kind (node ops by their node's kind)."""


def op_stage(plan: ExecutionPlan, op: PlanOp, graph=None) -> int:
    """The stage of ``op``; offload takes its dep's stage, onload that of the first op depending on it."""
    graph = graph or plan.graph
    by_name = {o.name: o for o in plan.ops}

    def stage(o: PlanOp, seen: frozenset = frozenset()) -> int:
        if o.kind == "node":
            return STAGE_OF_KIND[graph.node(o.node).kind]
        if o.kind in STAGE_OF_KIND:
            return STAGE_OF_KIND[o.kind]
        if o.name in seen:
            return 0
        if o.kind == "offload":
            return max((stage(by_name[d], seen | {o.name}) for d in o.deps if d in by_name), default=0)
        served = next((x for x in plan.ops if o.name in x.deps), None)
        return stage(served, seen | {o.name}) if served else 0

    return stage(op)


def priority_order(plan: ExecutionPlan) -> tuple[PlanOp, ...]:
    """The ops in a dependency-respecting order, earliest stage first, then plan order (module docstring)."""
    graph = plan.graph
    index = {op.name: i for i, op in enumerate(plan.ops)}
    key = {op.name: (op_stage(plan, op, graph), index[op.name]) for op in plan.ops}
    waiting = {op.name: sum(1 for d in op.deps if d in index) for op in plan.ops}
    users: dict[str, list[str]] = {op.name: [] for op in plan.ops}
    for op in plan.ops:
        for dep in op.deps:
            if dep in users:
                users[dep].append(op.name)
    heap = [(key[name], name) for name, n in waiting.items() if n == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, name = heapq.heappop(heap)
        order.append(plan.ops[index[name]])
        for user in users[name]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(heap, (key[user], user))
    if len(order) != len(plan.ops):
        stuck = sorted(set(index) - {o.name for o in order})
        raise PlanError(f"the ops {stuck} depend on each other in a cycle; no order runs them")
    return tuple(order)
