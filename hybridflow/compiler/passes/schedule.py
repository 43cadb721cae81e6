"""Pass ``schedule``: order the ops per pool, overlap what may overlap, and predict the timeline.

**List scheduling.** Ops are taken in priority order
(:func:`~.order.priority_order`); each starts when its deps have ended and
its resources are free, and holds them for its predicted time
(:mod:`.timing`). The resources are its pool (colocated roles take turns on
their devices), the target pool of a cross-pool weight sync, and the
controller for compute nodes. Independent ops on disjoint pools therefore run
concurrently. The op list is then sorted by predicted start, so each pool's
ops appear in the order they run; ``predicted_iteration_s`` is the makespan.

**Staleness** ``k > 0`` (one-step off-policy generalised to k steps): the
generation ops (and their weight syncs) work for iteration ``i + k``
(``iteration_offset = k``), so this iteration's forward passes and updates
read the rollout produced k iterations ago and stop waiting for the
generation. That only helps, and is only safe for memory, when generation
runs on devices that do nothing else in the iteration — a rollout pool of its
own; otherwise the pass raises :class:`~hybridflow.errors.PlanError` saying
which ops share the pool. Every edge then has a lag (:mod:`hybridflow.graph.staleness`):
a policy-gradient loss that reads the stale rollout must be corrected (truncated
importance sampling, ``truncated_is_weight`` + ``ppo_clip_is``, or another
correction the op registry declares); the pass raises
:class:`~hybridflow.errors.StalenessError` when it is not, and only warns when
the context allows it (``allow_uncorrected_staleness``).

**Predicted step with staleness** ``k >= 1``: the timeline above is one step of
the pipeline with every time at its prediction; :func:`async_parts` reads from it
the generation ``G`` (the rollout pool's ops after the weight sync), the sync
``S`` and the training side ``T`` (the other ops' makespan less the sync), and
``predicted_iteration_s`` is :func:`~hybridflow.compiler.async_cost.predict_async`
of them with the cost options' ``generation_time_cv`` and ``async_weight_sync``.
With constant generation times and the collective sync that is ``S + max(G, T)``,
the makespan itself, for every ``k >= 1``; with varying generation times a larger
``k`` absorbs more of the variation when the sync is staged (see that module).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

from ...errors import PlanError, StalenessError
from ...graph.staleness import check_staleness, lagged_edges
from ..async_cost import predict_async
from ..cost import CostOptions
from ..plan import ExecutionPlan, PlanOp
from .context import CompileContext
from .order import priority_order
from .timing import PlanView, op_cost

__all__ = ["schedule", "overlap_generation", "AsyncParts", "async_parts", "async_step_s", "CONTROLLER_RESOURCE"]

CONTROLLER_RESOURCE = "controller"


def _generation_ops(plan: ExecutionPlan) -> set[str]:
    graph = plan.graph
    gen = {op.name for op in plan.ops if op.kind == "node" and graph.node(op.node).kind == "generate"}
    syncs = {d for op in plan.ops if op.name in gen for d in op.deps
             if any(o.name == d and o.kind == "weight_sync" for o in plan.ops)}
    return gen | syncs


def _corrected(graph, offsets) -> bool:
    try:
        check_staleness(graph, offsets=offsets)
    except StalenessError:
        return False
    return True


def overlap_generation(plan: ExecutionPlan, k: int, allow_uncorrected: bool = False) -> ExecutionPlan:
    """Mark generation (and its weight syncs) as working for iteration i+k; raise PlanError when its pool is shared,
    StalenessError when a policy-gradient loss would train on the lagged rollout uncorrected (a warning instead
    with ``allow_uncorrected``)."""
    moved = _generation_ops(plan)
    if not moved:
        raise PlanError(f"staleness={k}: the graph generates nothing, so there is nothing to overlap; use staleness 0")
    graph = plan.graph
    gen_pools = {op.pool for op in plan.ops if op.name in moved and op.kind == "node"}
    for pool in sorted(gen_pools):
        sharing = [op.name for op in plan.ops if op.pool == pool and op.name not in moved]
        if sharing:
            roles = ", ".join(plan.roles_on(pool)) or "-"
            raise PlanError(
                f"staleness={k} overlaps generation of iteration i+{k} with the rest of iteration i, but generation runs "
                f"on pool {pool!r} ({roles}), which also runs {', '.join(sharing)}; the two would take turns, not overlap. "
                f"Give the rollout a pool of its own, e.g. --placement 'actor+ref@8;critic+reward@4;actor.generate@4' "
                f"(or ROLE.generate@N in your spec), or use staleness 0")
    offsets = {op.node: k if op.name in moved else 0 for op in plan.ops if op.kind == "node"}
    if allow_uncorrected:
        if lagged_edges(graph, offsets=offsets) and not _corrected(graph, offsets):
            warnings.warn(f"staleness={k}: graph {graph.name!r} trains on a rollout {k} update(s) old with no off-policy "
                          "correction (allow_uncorrected_staleness); expect a biased gradient", stacklevel=3)
    else:
        check_staleness(graph, offsets=offsets)
    ops = []
    for op in plan.ops:
        if op.name in moved:
            op = op.model_copy(update={"iteration_offset": k, "deps": tuple(d for d in op.deps if d in moved)})
        else:
            op = op.model_copy(update={"deps": tuple(d for d in op.deps if d not in moved)})
        ops.append(op)
    return plan.model_copy(update={"ops": tuple(ops), "staleness": k})


@dataclass(frozen=True)
class AsyncParts:
    """One step of a scheduled plan with staleness, as the asynchronous model sees it (seconds)."""

    gen_s: float
    """The rollout pool's generation after its weight sync."""
    train_s: float
    """Every op of the step that reads the rollout (training side), less the weight sync it starts behind."""
    sync_s: float
    """The weight syncs to the rollout pool."""


def async_parts(plan: ExecutionPlan) -> AsyncParts:
    """Generation, training and sync times of a scheduled plan with staleness (module docstring); PlanError for a
    plan without staleness or not yet scheduled."""
    if not plan.staleness or any(op.predicted_end_s is None for op in plan.ops):
        raise PlanError("async_parts needs a scheduled plan with staleness >= 1 (compile it with staleness=k)")
    ahead = [op for op in plan.ops if op.iteration_offset > 0]
    sync = sum(op.predicted_end_s - op.predicted_start_s for op in ahead if op.kind == "weight_sync")
    gen = max((op.predicted_end_s for op in ahead), default=0.0) - sync
    rest = max((op.predicted_end_s for op in plan.ops if op.iteration_offset == 0), default=0.0)
    return AsyncParts(gen_s=max(gen, 0.0), train_s=max(rest - sync, 0.0), sync_s=sync)


def async_step_s(plan: ExecutionPlan, options: CostOptions) -> float:
    """Predicted seconds per step of a scheduled plan with staleness ``plan.staleness`` (module docstring)."""
    parts = async_parts(plan)
    return predict_async(parts.gen_s, parts.train_s, plan.staleness, sync_s=parts.sync_s,
                         gen_cv=options.generation_time_cv, sync=options.async_weight_sync)


def _resources(op: PlanOp) -> tuple[str, ...]:
    if op.pool is None:
        return (CONTROLLER_RESOURCE,)
    return (op.pool,) + ((op.target_pool,) if op.target_pool else ())


def schedule(plan: ExecutionPlan, ctx: CompileContext) -> ExecutionPlan:
    """Predict the timeline.

    Requires: a placed plan with its weight syncs and offload brackets.
    Guarantees: every op has ``predicted_start_s`` / ``predicted_end_s`` and
    ``peak_memory_bytes`` (pool devices only), ops sorted by start (deps
    first), no two ops overlapping on a pool, every role's ``memory_bytes`` =
    the largest peak of its ops on its own pool (a rollout pool's peak is on
    its generate ops); ``predicted_iteration_s`` the makespan, or with
    ``ctx.staleness > 0`` (generation moved to iteration i+k) the asynchronous step (module docstring).
    """
    if ctx.staleness:
        plan = overlap_generation(plan, ctx.staleness, ctx.allow_uncorrected_staleness)
    view = PlanView(plan, ctx)
    order = priority_order(plan)
    free: dict[str, float] = {}
    ends: dict[str, float] = {}
    timed: list[tuple[float, int, PlanOp]] = []
    for rank, op in enumerate(order):
        cost = op_cost(view, op)
        if not math.isfinite(cost.time_s):
            raise PlanError(f"op {op.name!r} cannot run: {cost.problem or 'infinite predicted time'}")
        start = max([ends[d] for d in op.deps] + [free.get(r, 0.0) for r in _resources(op)] + [0.0])
        end = start + cost.time_s
        for r in _resources(op):
            free[r] = end
        ends[op.name] = end
        peak = int(math.ceil(cost.peak_memory_bytes)) if op.pool is not None and plan.pool(op.pool).memory_bytes else None
        timed.append((start, rank, op.model_copy(update={"predicted_start_s": start, "predicted_end_s": end,
                                                         "peak_memory_bytes": peak})))
    ops = tuple(op for _, _, op in sorted(timed, key=lambda t: (t[0], t[1])))
    peaks: dict[str, int] = {}
    home = {p.role: p.pool for p in plan.placements}
    for op in ops:
        if op.peak_memory_bytes is not None and op.pool == home.get(op.role):
            peaks[op.role] = max(peaks.get(op.role, 0), op.peak_memory_bytes)
    placements = tuple(p.model_copy(update={"memory_bytes": peaks.get(p.role)}) for p in plan.placements)
    scheduled = plan.model_copy(update={"ops": ops, "placements": placements,
                                        "predicted_iteration_s": max(ends.values(), default=0.0)})
    if not plan.staleness:
        return scheduled
    return scheduled.model_copy(update={"predicted_iteration_s": async_step_s(scheduled, ctx.options)})
