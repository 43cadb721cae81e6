"""Pass ``offload``: where colocated roles cannot all be resident, move each role's states in only while it works.

The placement decided, per pool, whether its roles' model states fit on the
devices together (``PoolPlan.offload``; the search prices both modes). On an
offload pool this pass takes the pool's ops in priority order
(:func:`~.order.priority_order`: generation, forward passes, updates), cuts
them into runs of consecutive ops of one role, and brackets every run with

- ``onload`` (before): the role's states from host memory — ``params`` for a
  frozen model; ``params``, ``optimizer``, ``grads`` for a trained one —
  ``volume_bytes`` = its resident bytes per device (18·N/(d·t·p) or 2·N/(t·p));
- ``offload`` (after): the same states back to the host, and for a run that
  generated, the rollout engine's ``kv_cache`` freed too.

Every op of a run depends on its onload and the offload on every op of the
run; the brackets are chained (each onload waits for the previous run's offload),
so the pool never holds two roles' states at once: that is what the
placement's memory check assumed for offload mode.
"""
from __future__ import annotations

from ..plan import ExecutionPlan, PlanOp
from .context import CompileContext
from .order import priority_order
from .timing import PlanView

__all__ = ["offload", "state_items"]


def state_items(trainable: bool) -> tuple[str, ...]:
    """What moves for a role: its weights, and for a trained model its optimizer state and gradients."""
    return ("params", "optimizer", "grads") if trainable else ("params",)


def _runs(ops: list[PlanOp]) -> list[list[PlanOp]]:
    runs: list[list[PlanOp]] = []
    for op in ops:
        if runs and runs[-1][-1].role == op.role:
            runs[-1].append(op)
        else:
            runs.append([op])
    return runs


def _bracket(pool: str, runs: list[list[PlanOp]], view: PlanView, graph) -> tuple[list[PlanOp], dict[str, tuple[str, ...]]]:
    """Onload/offload ops for each run, and the extra dep (its onload) of every op of the run."""
    inserted, extra, previous = [], {}, None
    for k, run in enumerate(runs):
        role = run[0].role
        items = state_items(view.trainable.get(role, False))
        volume = int(view.resident[role])
        on = PlanOp(name=f"{role}.onload@{pool}#{k}", kind="onload", role=role, pool=pool, items=items,
                    deps=(previous,) if previous else (), volume_bytes=volume,
                    note=f"{role} states to the devices before {run[0].name}")
        generated = any(o.kind == "node" and graph.node(o.node).kind == "generate" for o in run)
        off = PlanOp(name=f"{role}.offload@{pool}#{k}", kind="offload", role=role, pool=pool,
                     items=items + (("kv_cache",) if generated else ()), deps=tuple(o.name for o in run), volume_bytes=volume,
                     note=f"{role} states to host memory after {run[-1].name}" + ("; KV cache freed" if generated else ""))
        inserted += [on, off]
        extra.update((o.name, (on.name,)) for o in run)
        previous = off.name
    return inserted, extra


def offload(plan: ExecutionPlan, ctx: CompileContext) -> ExecutionPlan:
    """Insert offload/onload brackets on offload pools.

    Requires: a placed plan (pools carry their offload flag), weight syncs in place.
    Guarantees: on every pool with ``offload``, each run of one role's ops is
    preceded by an ``onload`` and followed by an ``offload`` of that role's
    states, chained so runs do not overlap; resident pools are unchanged; the
    op list is in priority order.
    """
    offload_pools = [p.name for p in plan.pools if p.offload]
    if not offload_pools:
        return plan
    view, graph = PlanView(plan, ctx), ctx.graph
    order = priority_order(plan)
    inserted, extra = [], {}
    for pool in offload_pools:
        ops = [op for op in order if op.pool == pool]
        more, deps = _bracket(pool, _runs(ops), view, graph)
        inserted += more
        extra.update(deps)
    ops = [op.model_copy(update={"deps": op.deps + extra[op.name]}) if op.name in extra else op for op in plan.ops]
    staged = plan.model_copy(update={"ops": tuple(ops) + tuple(inserted)})  # order restored just below
    return staged.model_copy(update={"ops": priority_order(staged)})
