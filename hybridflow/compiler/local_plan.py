"""A plan for one machine from a ``device_map``: the seed article's local path.

``plan_local(graph, {"actor": "cpu", "critic": "cuda:0", ...})`` places every
role on the device the map names (``cpu`` where the map is silent); roles on the
same device share a pool and a process (colocated). The schedule is the graph's
own order, with one ``weight_sync`` op in front of each generation of a policy
that is also updated, so the rollout engine always samples from the weights
the last update produced. Predicted times are left at 0: on one machine the
real run's trace is the timeline.

Aliases used by the seed article are accepted for role names: ``rm`` for
``reward``; keys that name no role of the graph (for example the article's
``actor_lora``) are an error that lists the graph's roles.
"""
from __future__ import annotations

import re
from typing import Mapping

from ..errors import PlacementError
from ..graph import CONTROLLER, Graph
from .plan import ExecutionPlan, LayoutPlan, PlanOp, PoolPlan, RolePlacement, verify_plan

__all__ = ["plan_local", "normalise_device", "ROLE_ALIASES"]

ROLE_ALIASES = {"rm": "reward", "reward_model": "reward", "reference": "ref", "policy": "actor"}
_DEVICE_RE = re.compile(r"^(cpu|cuda(:\d+)?|mps)$")


def normalise_device(device: str, role: str) -> str:
    """``"cuda"`` -> ``"cuda:0"``; anything but cpu / cuda[:N] / mps is a PlacementError."""
    text = str(device).strip().lower()
    if not _DEVICE_RE.match(text):
        raise PlacementError(f"device_map[{role!r}] = {device!r} is not a device; use 'cpu', 'cuda', 'cuda:N' or 'mps'")
    return "cuda:0" if text == "cuda" else text


def _resolve_map(graph: Graph, device_map: Mapping[str, str] | None) -> dict[str, str]:
    roles = {r.name for r in graph.roles}
    resolved = {name: "cpu" for name in roles}
    for key, device in (device_map or {}).items():
        role = key if key in roles else ROLE_ALIASES.get(key, key)
        if role not in roles:
            raise PlacementError(
                f"device_map names {key!r}, which is not a role of graph {graph.name!r}; "
                f"its roles are {', '.join(sorted(roles))} (alias 'rm' = 'reward')"
            )
        resolved[role] = normalise_device(device, key)
    return resolved


def plan_local(graph: Graph, device_map: Mapping[str, str] | None = None) -> ExecutionPlan:
    """A single-machine plan for ``graph``: placement by ``device_map``, the graph's order, weight syncs."""
    devices = _resolve_map(graph, device_map)
    pool_names = {device: device.replace(":", "") for device in sorted(set(devices.values()))}
    pools = tuple(PoolPlan(name=pool_names[d], devices=(d,)) for d in sorted(pool_names))
    placements = tuple(
        RolePlacement(role=r.name, pool=pool_names[devices[r.name]], layout=LayoutPlan(),
                      generation_layout=LayoutPlan() if r.kind == "policy" else None)
        for r in graph.roles
    )
    updated = {n.role for n in graph.nodes if n.kind == "update"}
    graph_inputs = {i.name for i in graph.inputs}
    ops: list[PlanOp] = []
    for node in graph.nodes:
        deps = tuple(s for s in node.sources if s not in graph_inputs)
        pool = None if node.role == CONTROLLER else pool_names[devices[node.role]]
        if node.kind == "generate" and node.role in updated:
            sync = PlanOp(name=f"{node.role}.weight_sync#{len(ops)}", kind="weight_sync", role=node.role, pool=pool,
                          note="train engine -> rollout engine (shared module on one device: nothing to copy)")
            ops.append(sync)
            deps = deps + (sync.name,)
        ops.append(PlanOp(name=node.name, kind="node", role=node.role, pool=pool, node=node.name, deps=deps))
    plan = ExecutionPlan(
        graph=_graph_dict(graph), cluster="local", strategy="manual", pools=pools, placements=placements,
        ops=tuple(ops), staleness=0,
    )
    verify_plan(plan, after="plan_local")
    return plan


def _graph_dict(graph: Graph) -> dict:
    from ..graph.serialize import graph_to_dict

    return graph_to_dict(graph)
