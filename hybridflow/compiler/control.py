"""Plans derived from a training plan: everything else the controller asks of the workers.

The trainer asks the workers for more than iterations: a validation, a checkpoint, a restore,
the trained model, a new reward source, a report of what their engines are. Each is a plan of
the training plan's pools, run by the same interpreter (``executor.run_plan``), built here by
one function per shape:

* :func:`control_plan` — the control ops of one kind (:data:`~.plan.CONTROL_KINDS`: ``save_state``,
  ``load_state``, ``set_reward``, ``export``, ``describe``) for the roles that hold what it acts on;
* :func:`graph_plan` — the nodes of a small graph (e.g. validation's generations and scores) placed
  where the training plan runs their roles: generations on the policy's generation pool.

Both wrap their ops in the training plan's bracketing (:func:`bracketed`): a role the training
plan offloads between uses is onloaded first and offloaded after, and a policy whose rollout
engine holds a copy of the weights gets the training plan's weight sync — before the ops that
generate, after the ops that load new weights. The plans keep the training plan's pools and
placements and are verified like any other; what a control op needs at run time (a folder, a
reward spec) is given to ``run_plan``, not stored in the plan.
"""
from __future__ import annotations

from typing import Iterable, Literal, Sequence

from ..errors import PlanError
from ..graph import Graph
from .plan import CONTROL_KINDS, ExecutionPlan, PlanOp, verify_plan

__all__ = ["bracketed", "control_plan", "graph_plan", "trained_roles", "state_roles"]


def trained_roles(graph: Graph) -> tuple[str, ...]:
    """The roles ``graph`` updates (their weights and optimizer state are checkpointed), in graph order."""
    return tuple(dict.fromkeys(n.role for n in graph.nodes if n.kind == "update"))


def state_roles(plan: ExecutionPlan) -> tuple[str, ...]:
    """The roles whose workers hold checkpointed state: the trained roles and the policies (their samplers)."""
    policies = tuple(r.name for r in plan.graph.roles if r.kind == "policy")
    return tuple(dict.fromkeys(trained_roles(plan.graph) + policies))


def _offload_items(plan: ExecutionPlan, role: str) -> tuple[str | None, tuple[str, ...]]:
    """(pool, items) the training plan offloads ``role``'s states from between uses; (None, ()) when it does not."""
    offloads = [op for op in plan.ops if op.kind == "offload" and op.role == role]
    if not offloads:
        return None, ()
    return offloads[0].pool, tuple(dict.fromkeys(item for op in offloads for item in op.items))


def _sync_op(plan: ExecutionPlan, role: str) -> PlanOp | None:
    return next((op for op in plan.ops if op.kind == "weight_sync" and op.role == role), None)


def bracketed(plan: ExecutionPlan, body: Sequence[PlanOp], *, roles: Sequence[str] | None = None,
              sync: Literal["before", "after"] | None = None) -> tuple[PlanOp, ...]:
    """``body`` inside the training plan's bracketing of ``roles`` (default: the roles ``body`` acts on; module
    docstring).

    The ops of ``body`` on those roles wait for the onloads (and a ``sync="before"``); each offload waits for
    the ops of its role. ``sync``: where the roles' weight sync goes, if the training plan has one.
    """
    roles = tuple(dict.fromkeys(op.role for op in body)) if roles is None else tuple(roles)
    ops: list[PlanOp] = []
    for role in roles:
        pool, items = _offload_items(plan, role)
        if pool is not None:
            ops.append(PlanOp(name=f"{role}.onload", kind="onload", role=role, pool=pool, items=items))
    syncs = [s for s in (_sync_op(plan, role) for role in roles) if s is not None] if sync else []
    if sync == "before":
        for s in syncs:
            ops.append(s.model_copy(update={"deps": tuple(op.name for op in ops), "iteration_offset": 0}))
    first = tuple(op.name for op in ops)
    ops.extend(op.model_copy(update={"deps": first + op.deps}) if op.role in roles else op for op in body)
    if sync == "after":
        for s in syncs:
            deps = tuple(op.name for op in ops if op.role == s.role)
            ops.append(s.model_copy(update={"deps": deps, "iteration_offset": 0}))
    for role in roles:
        pool, items = _offload_items(plan, role)
        if pool is not None:
            ops.append(PlanOp(name=f"{role}.offload", kind="offload", role=role, pool=pool, items=items,
                              deps=tuple(op.name for op in ops if op.role == role)))
    return tuple(ops)


def _derived(plan: ExecutionPlan, graph: Graph, ops: Iterable[PlanOp], after: str) -> ExecutionPlan:
    derived = plan.model_copy(update={"graph": graph, "staleness": 0, "predicted_iteration_s": None, "ops": tuple(ops)})
    verify_plan(derived, after=after)
    return derived


def _pools_of(plan: ExecutionPlan, role: str) -> tuple[str, ...]:
    """The pools holding ``role``'s engines: its own, and its generation pool when the plan gives it one."""
    placement = plan.placement(role)
    return tuple(dict.fromkeys(filter(None, (placement.pool, placement.generation_pool))))


def _state_ops(plan: ExecutionPlan, kind: str, roles: Sequence[str]) -> list[PlanOp]:
    """Per role, a save_state / load_state op on every pool holding its engines; item ``train`` on its own pool
    when the graph updates it (its shards). What else a slot keeps (the sampler's RNG) the worker saves with it."""
    trained = set(trained_roles(plan.graph))
    ops = []
    for role in roles:
        own = plan.placement(role).pool
        for pool in _pools_of(plan, role):
            ops.append(PlanOp(name=f"{role}.{kind}" if pool == own else f"{role}.{kind}@{pool}", kind=kind, role=role,
                              pool=pool, items=("train",) if role in trained and pool == own else ()))
    return ops


def control_plan(plan: ExecutionPlan, kind: str, roles: Sequence[str] | None = None, *,
                 items: Sequence[str] = ()) -> ExecutionPlan:
    """The ``kind`` control ops of ``roles`` on ``plan``'s pools, bracketed as ``plan`` brackets those roles.

    * ``save_state`` / ``load_state`` (``roles`` default: :func:`state_roles`): one op per pool holding
      a role's state; a restore then syncs the policies' rollout engines to the loaded weights;
    * ``export`` (``roles`` default: the first policy): on the role's pool (``items``: ``("optimizer",)``
      adds the whole train state);
    * ``set_reward``: on the role's pool; ``describe``: on every pool holding the role's engines.

    Op names are ``<role>.<kind>`` (``<role>.<kind>@<pool>`` on a generation pool): ``run_plan``'s
    ``args`` and its result's ``results`` are keyed by them.
    """
    if kind not in CONTROL_KINDS:
        raise PlanError(f"{kind!r} is not a control op kind; use one of {', '.join(CONTROL_KINDS)}")
    placed = {p.role for p in plan.placements}
    if roles is None:
        policies = [r.name for r in plan.graph.roles if r.kind == "policy"]
        roles = state_roles(plan) if kind in ("save_state", "load_state") else tuple(policies[:1])
    unknown = [r for r in roles if r not in placed]
    if unknown or not roles:
        raise PlanError(f"{kind}: the plan places no role {unknown or '(none given)'}; it places {', '.join(sorted(placed))}")
    if kind in ("save_state", "load_state"):
        body = _state_ops(plan, kind, roles)
    elif kind == "describe":
        body = [PlanOp(name=f"{role}.{kind}" if pool == plan.placement(role).pool else f"{role}.{kind}@{pool}",
                       kind=kind, role=role, pool=pool) for role in roles for pool in _pools_of(plan, role)]
    else:
        body = [PlanOp(name=f"{role}.{kind}", kind=kind, role=role, pool=plan.placement(role).pool,
                       items=tuple(items)) for role in roles]
    if kind == "describe":
        ops = tuple(body)  # a report of the engines as they are, offloaded or not
    else:
        ops = bracketed(plan, body, sync="after" if kind == "load_state" else None)
    graph = Graph(name=kind, roles=plan.graph.roles, inputs=(), nodes=())
    return _derived(plan, graph, ops, after=f"control_plan({kind})")


def graph_plan(plan: ExecutionPlan, graph: Graph, *, after: str = "graph_plan") -> ExecutionPlan:
    """``graph``'s nodes on ``plan``'s pools: a role's generations where ``plan`` generates for it (its generation
    pool, or its own), its other nodes on its pool; after the training plan's weight sync of every policy that
    generates, so that it samples with the weights of the last update. Roles are matched by name."""
    nodes: list[PlanOp] = []
    inputs = {i.name for i in graph.inputs}
    for node in graph.nodes:
        placement = plan.placement(node.role)
        pool = placement.generation_pool or placement.pool if node.kind == "generate" else placement.pool
        deps = tuple(s for s in node.sources if s not in inputs)
        nodes.append(PlanOp(name=node.name, kind="node", role=node.role, pool=pool, node=node.name, deps=deps))
    generators = tuple(dict.fromkeys(op.role for op in nodes if graph.node(op.node).kind == "generate"))
    ops = bracketed(plan, nodes, roles=generators, sync="before")
    used = {r.name for r in graph.roles}
    derived = plan.model_copy(update={"placements": tuple(p for p in plan.placements if p.role in used)})
    return _derived(derived, graph, ops, after=after)
