"""Pass ``placement``: decide where every role runs and with which layouts, and write it into the plan.

The request (``ctx.placement``, forms in :mod:`.spec`) is resolved to a
:class:`~.spec.ResolvedPlacement`:

- ``auto``: the search's best (:func:`hybridflow.compiler.placement.search`);
  ``compile`` goes further and re-ranks the search's runners-up and the fixed
  strategies by the scheduled plan's predicted time;
- a fixed strategy: :func:`~hybridflow.compiler.placement.place_fixed`;
- a manual spec: :func:`~hybridflow.compiler.placement.manual_placement` for the
  roles' pools; a rollout pool ``ROLE.generate@N`` takes the generating role's
  rollout engine onto its own devices, on the given layout or the fastest one;
- a device map: one single-device pool per device named, a pool whose roles do
  not fit together is put in offload mode.

Rule-function roles (no model) go to a pool ``host`` of the controller's CPU
(or to the device a device map names for them).

A role whose generate nodes have an environment (``env=``) gets an environment
pool, ``env`` (``env_<role>`` when several roles have one): host CPUs running
``ctx.options.env_workers`` environment workers, which the role's placement and
its generate ops name (``env_pool``).
"""
from __future__ import annotations

import math

from ...errors import ConfigError, PlacementError
from ..cost import Generate, estimate
from ..layout import Layout, valid_layouts
from ..placement import Placement, PoolSpec, evaluate, manual_placement, place_fixed, placement_from_device_map, search
from ..placement.search import ScoredPlacement, assign_devices, fixed_strategy_refusal
from ..plan import ExecutionPlan, LayoutPlan, PoolPlan, RolePlacement
from ..workload import Workload
from .context import CompileContext
from .lower import device_names
from .spec import ROLE_ALIASES, ResolvedPlacement, RolloutPool, normalise_device, parse_placement

__all__ = ["HOST", "ENV", "resolve_placement", "without_generation", "rollout_layout", "with_rollout", "placement"]

HOST = "host"
"""Pool of rule-function roles: the controller's CPU."""
ENV = "env"
"""Pool of a generating role's environment workers (multi-turn rollouts): host CPUs."""


def without_generation(workload: Workload) -> Workload:
    """The workload with generation taken off every role (it runs on a rollout pool of its own)."""
    return workload.model_copy(update={"roles": tuple(r.model_copy(update={"generates": False}) for r in workload.roles)})


def rollout_layout(ctx: CompileContext, role: str, devices: int) -> Layout:
    """The fastest valid generation layout of ``role``'s model on a dedicated pool of ``devices`` devices."""
    model, gen = ctx.models[role], ctx.workload.generation
    best: tuple[float, Layout | None] = (math.inf, None)
    for layout in valid_layouts(model, devices, ctx.cluster.devices_per_node):
        if ctx.options.data_parallel_only and layout.size != layout.dp:
            continue
        cost = estimate(Generate(model, layout, gen.sequences, gen.prompt_len, gen.response_len), ctx.cluster, ctx.options)
        if cost.time_s < best[0]:
            best = (cost.time_s, layout)
    if best[1] is None:
        raise PlacementError(f"a rollout pool of {devices} devices cannot hold {model.name}'s weights and one sequence's "
                             "KV cache in any layout; give it more devices")
    return best[1]


def with_rollout(placement: Placement, rollout: RolloutPool, ctx: CompileContext, strategy: str) -> ResolvedPlacement:
    """Add a dedicated rollout pool to a placement of the roles (devices reassigned so that every pool packs)."""
    sizes = tuple(p.size for p in placement.pools) + (rollout.devices,)
    devices = assign_devices(sizes, ctx.cluster)
    pools = tuple(type(p)(devices[k], p.device_type) for k, p in enumerate(placement.pools))
    layout = rollout.layout or rollout_layout(ctx, rollout.role, rollout.devices)
    if layout.size != rollout.devices:
        raise ConfigError(f"rollout pool {rollout.role}.generate@{rollout.devices}: layout {layout} uses {layout.size} devices")
    moved = Placement(pools=pools, roles=placement.roles, offload=placement.offload, strategy=placement.strategy)
    return ResolvedPlacement(moved, (rollout.role, devices[-1], layout), strategy)


def _manual(ctx: CompileContext, specs: list) -> ResolvedPlacement:
    rule = set(ctx.rule_roles)
    rollouts = [s for s in specs if isinstance(s, RolloutPool)]
    pools = []
    for spec in (s for s in specs if isinstance(s, PoolSpec)):
        roles = tuple(r for r in spec.roles if r not in rule)
        if not roles:
            raise ConfigError(f"pool {list(spec.roles)} holds only rule-function roles, which need no devices; leave it out")
        pools.append(spec.model_copy(update={"roles": roles}))
    workload = ctx.workload
    generating = [r.name for r in workload.roles if r.generates]
    if len(rollouts) > 1 or any(r.role not in generating for r in rollouts):
        raise ConfigError(f"a spec may give one rollout pool, for the generating role ({', '.join(generating) or 'none'}); "
                          f"got {[r.role + '.generate' for r in rollouts]}")
    if rollouts:
        workload = without_generation(workload)
    scored = manual_placement(workload, ctx.cluster, pools, ctx.options)
    if not rollouts:
        return ResolvedPlacement(scored.placement, None, "manual")
    return with_rollout(scored.placement, rollouts[0], ctx, "manual")


def _device_map(ctx: CompileContext, mapping: dict) -> ResolvedPlacement:
    roles = {r.name for r in ctx.graph.roles}
    devices = {}
    for key, device in mapping.items():
        role = key if key in roles else ROLE_ALIASES.get(key, key)
        if role not in roles:
            raise PlacementError(f"device_map names {key!r}, which is not a role of graph {ctx.graph.name!r}; its roles are "
                                 f"{', '.join(sorted(roles))} (alias 'rm' = 'reward')")
        devices[role] = normalise_device(device, key)
    model_roles = ctx.workload.role_names
    placement = placement_from_device_map({r: devices.get(r, "cpu") for r in model_roles}, ctx.workload)
    cost = evaluate(placement, ctx.workload, ctx.cluster, ctx.options)
    if not cost.feasible:  # try offload mode for the pools that do not fit resident
        offload = tuple(bool(g.problem) for g in cost.groups)
        placement = Placement(placement.pools, placement.roles, offload, placement.strategy)
        cost = evaluate(placement, ctx.workload, ctx.cluster, ctx.options)
    if not cost.feasible:
        raise PlacementError(f"device map {mapping} does not fit {ctx.cluster.describe()} even with offloading: {cost.problem}; "
                             "map the roles to more devices, or use smaller models or batches")
    return ResolvedPlacement(placement, None, "device_map")


def resolve_placement(ctx: CompileContext) -> ResolvedPlacement:
    """The placement ``ctx.placement`` asks for (module docstring)."""
    request = parse_placement(ctx.placement)
    if isinstance(request, ResolvedPlacement):
        return request
    if isinstance(request, ScoredPlacement):
        request = request.placement
    if isinstance(request, Placement):
        return ResolvedPlacement(request, None, request.strategy)
    if request == "auto":
        result = search(ctx.workload, ctx.cluster, ctx.options)
        return ResolvedPlacement(result.best.placement, None, "auto", result.seconds)
    if isinstance(request, str):
        found = place_fixed(request, ctx.workload, ctx.cluster, ctx.options)
        if found is None:
            raise PlacementError(fixed_strategy_refusal(request, ctx.workload, ctx.cluster))
        return ResolvedPlacement(found.placement, None, request)
    if isinstance(request, dict):
        return _device_map(ctx, request)
    if isinstance(request, (list, tuple)):
        return _manual(ctx, list(request))
    raise ConfigError(f"placement {request!r}: use a strategy name, a pool spec, a device map or a Placement")


def _pools(resolved: ResolvedPlacement, ctx: CompileContext) -> list[PoolPlan]:
    """Plan pools: ``pool0``.. on cluster slots, or ``cpu`` / ``cuda0`` for a device map; the rollout pool last."""
    slots, memory = device_names(ctx.cluster), int(ctx.cluster.device_memory_bytes)
    pools = []
    for k, pool in enumerate(resolved.placement.pools):
        offload = resolved.placement.offload[k]
        if resolved.strategy == "device_map":
            (device,) = pool.device_strings()[:1]
            pools.append(PoolPlan(name=device.replace(":", ""), devices=(device,), memory_bytes=memory, offload=offload))
        else:
            pools.append(PoolPlan(name=f"pool{k}", devices=tuple(slots[i] for i in pool.devices), memory_bytes=memory, offload=offload))
    if resolved.rollout:
        pools.append(PoolPlan(name=f"pool{len(pools)}", devices=tuple(slots[i] for i in resolved.rollout[1]), memory_bytes=memory))
    return pools


def _rule_pools(ctx: CompileContext, pools: list[PoolPlan]) -> dict[str, str]:
    """Pool of each rule role: the device a device map names for it, else a host pool of its own (added to ``pools``).

    A lone rule role's pool is ``host``; with several (Safe-RLHF's reward and cost) each gets ``host_<role>``, so
    their scoring can run at the same time on an executor with one process per pool.
    """
    mapping = parse_placement(ctx.placement)
    mapped = {ROLE_ALIASES.get(k, k): normalise_device(v, k) for k, v in mapping.items()} if isinstance(mapping, dict) else {}
    unmapped = [role for role in ctx.rule_roles if role not in mapped]
    found = {}
    for role in ctx.rule_roles:
        device = mapped.get(role)
        name = device.replace(":", "") if device else (HOST if len(unmapped) == 1 else f"{HOST}_{role}")
        if name not in {p.name for p in pools}:
            pools.append(PoolPlan(name=name, devices=(device or "cpu",)))
        found[role] = name
    return found


def _env_pools(ctx: CompileContext, pools: list[PoolPlan]) -> dict[str, str]:
    """Environment pool of each role that generates with an environment (added to ``pools``): ``env``, or
    ``env_<role>`` when several roles have one."""
    roles = sorted({n.role for n in ctx.graph.nodes if n.kind == "generate" and n.attrs.env is not None})
    found = {}
    for role in roles:
        name = ENV if len(roles) == 1 else f"{ENV}_{role}"
        pools.append(PoolPlan(name=name, devices=("cpu",), workers=ctx.options.env_workers))
        found[role] = name
    return found


def _lp(layout: Layout | None) -> LayoutPlan | None:
    return None if layout is None else LayoutPlan(dp=layout.dp, tp=layout.tp, pp=layout.pp)


def _with_train_engines(placements: list[RolePlacement], chosen: Placement) -> tuple[RolePlacement, ...]:
    """Each model role's placement with the training engine the placement chose for it (rule roles keep the default)."""
    engines = {rp.role: rp.engine for rp in chosen.roles}
    return tuple(p.model_copy(update={"train_engine": engines[p.role]}) if p.role in engines else p for p in placements)


def placement(plan: ExecutionPlan, ctx: CompileContext) -> ExecutionPlan:
    """Place the roles.

    Requires: a plan from ``lower`` (node ops; roles on any pools).
    Guarantees: pools named ``pool0``.. (or ``cpu``/``cuda0`` for a device map,
    ``host`` for rule roles, ``env`` for environment workers) with their devices, device memory and offload
    flag; every role placed with its layout, the generating role with its
    generation layout (on ``generation_pool`` when it has a rollout pool);
    every node op on its role's pool (generate ops on the rollout pool);
    generate ops with an environment, and their role's placement, name its
    environment pool; ``strategy`` says how the placement was chosen.
    """
    resolved = resolve_placement(ctx)
    pools = _pools(resolved, ctx)
    rule_pools = _rule_pools(ctx, pools)
    env_pools = _env_pools(ctx, pools)
    rollout_pool = pools[len(resolved.placement.pools)].name if resolved.rollout else None
    role_pool, placements = dict(rule_pools), []
    generating = {r.name for r in ctx.workload.roles if r.generates}
    for role in ctx.graph.roles:
        if role.name in rule_pools:
            placements.append(RolePlacement(role=role.name, pool=rule_pools[role.name]))
            continue
        rp = resolved.placement.of(role.name)
        role_pool[role.name] = pools[rp.pool].name
        gen_layout, gen_pool = rp.gen_layout, None
        if resolved.rollout and resolved.rollout[0] == role.name:
            gen_layout, gen_pool = resolved.rollout[2], rollout_pool
        engine = ctx.options.rollout_engine if role.name in generating else None
        placements.append(RolePlacement(role=role.name, pool=role_pool[role.name], layout=_lp(rp.layout),
                                        generation_layout=_lp(gen_layout), generation_pool=gen_pool,
                                        rollout_engine=engine, env_pool=env_pools.get(role.name)))
    gen_pools = {p.role: p.generation_pool for p in placements if p.generation_pool}
    graph = ctx.graph
    ops = []
    for op in plan.ops:
        if op.kind == "node" and op.pool is not None:
            kind = graph.node(op.node).kind
            pool = gen_pools.get(op.role) if kind == "generate" and op.role in gen_pools else role_pool[op.role]
            env_pool = env_pools.get(op.role) if kind == "generate" and graph.node(op.node).attrs.env else None
            op = op.model_copy(update={"pool": pool, "env_pool": env_pool})
        ops.append(op)
    return plan.model_copy(update={"pools": tuple(pools), "placements": _with_train_engines(placements, resolved.placement),
                                   "ops": tuple(ops), "strategy": resolved.strategy})
