"""Two runs compared: what ``hybridflow diff RUN_A RUN_B`` reports, and the determinism check's verdict.

Each comparison is a function of the two runs' records (:mod:`.run_folder`) returning :class:`Difference` rows
(what, A's value, B's value); :func:`first_divergence` walks two runs' value hashes step by step and, within a
step, edge by edge in plan order, and returns the first digest that differs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from .run_folder import HashRecord

__all__ = ["Difference", "Divergence", "mapping_differences", "config_differences", "graph_differences",
           "plan_differences", "environment_differences", "first_divergence"]


@dataclass(frozen=True)
class Difference:
    """One thing that differs: its path (``config.actor_lr``, ``plan.actor.layout``), and its value in A and in B
    (``None``: absent there)."""

    what: str
    a: Any
    b: Any

    def __str__(self) -> str:
        def shown(value: Any) -> str:
            return "(absent)" if value is None else json.dumps(value) if not isinstance(value, str) else value

        return f"{self.what}: {shown(self.a)} -> {shown(self.b)}"


def mapping_differences(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str,
                        ignore: Iterable[str] = ()) -> list[Difference]:
    """The keys whose values differ, recursing into mappings (``prefix.key.sub``), in key order."""
    skipped, rows = set(ignore), []
    for key in sorted(set(a) | set(b)):
        if key in skipped:
            continue
        left, right = a.get(key), b.get(key)
        if isinstance(left, Mapping) and isinstance(right, Mapping):
            rows += mapping_differences(left, right, f"{prefix}.{key}")
        elif left != right:
            rows.append(Difference(f"{prefix}.{key}", left, right))
    return rows


CONFIG_NOISE = ("output_dir", "experiment_name")
"""Config fields that differ between any two runs by construction; not reported."""


def config_differences(a, b) -> list[Difference]:
    """The algorithm and the config fields that differ (:class:`~.run_folder.RunConfigRecord` of each run)."""
    rows = [Difference("algorithm", a.algorithm, b.algorithm)] if a.algorithm != b.algorithm else []
    return rows + mapping_differences(a.config, b.config, "config", ignore=CONFIG_NOISE)


def graph_differences(plan_a, plan_b) -> list[Difference]:
    """Nodes present in one graph only, and the attributes, inputs and roles of nodes in both that differ."""
    from ..graph.serialize import graph_to_dict

    ga, gb = graph_to_dict(plan_a.graph), graph_to_dict(plan_b.graph)
    rows = [Difference("graph.name", ga.get("name"), gb.get("name"))] if ga.get("name") != gb.get("name") else []
    nodes_a = {n["name"]: n for n in ga.get("nodes", [])}
    nodes_b = {n["name"]: n for n in gb.get("nodes", [])}
    for name in list(nodes_a) + [n for n in nodes_b if n not in nodes_a]:
        left, right = nodes_a.get(name), nodes_b.get(name)
        if left is None or right is None:
            rows.append(Difference(f"graph.node {name}", left and left.get("op"), right and right.get("op")))
        else:
            rows += mapping_differences(left, right, f"graph.{name}")
    roles_a = {r["name"]: r for r in ga.get("roles", [])}
    roles_b = {r["name"]: r for r in gb.get("roles", [])}
    return rows + mapping_differences(roles_a, roles_b, "graph.roles")


def _plan_view(plan) -> dict[str, Any]:
    pools = {p.name: len(p.devices) for p in plan.pools}
    view: dict[str, Any] = {"strategy": plan.strategy, "staleness": plan.staleness, "cluster": plan.cluster,
                            "machine": plan.machine, "predicted_step_s": round(plan.predicted_iteration_s or 0.0, 6)}
    for p in plan.placements:
        companions = sorted(r.role for r in plan.placements if r.pool == p.pool)
        view[p.role] = {"pool": f"{'+'.join(companions)} on {pools[p.pool]} device(s)", "layout": str(p.layout),
                        "generation_layout": str(p.generation_layout) if p.generation_layout else None,
                        "generation_pool": (f"{pools[p.generation_pool]} device(s) of its own" if p.generation_pool
                                            else None),
                        "train_engine": p.train_engine, "rollout_engine": p.rollout_engine}
    syncs = {op.role: op.note.split(":")[0] if op.note else ("broadcast" if op.target_pool else "in place")
             for op in plan.ops if op.kind == "weight_sync"}
    for role, method in syncs.items():
        view.setdefault(role, {})["weight_sync"] = method
    view["ops"] = [op.name + (f" (for i+{op.iteration_offset})" if op.iteration_offset else "") for op in plan.ops]
    return view


def plan_differences(plan_a, plan_b) -> list[Difference]:
    """Placement (each role's companions and device count), layouts, weight-sync method, staleness, strategy,
    the cluster it was priced for, the predicted step and the op order."""
    a, b = _plan_view(plan_a), _plan_view(plan_b)
    rows = mapping_differences({k: v for k, v in a.items() if k != "ops"}, {k: v for k, v in b.items() if k != "ops"}, "plan")
    if a["ops"] != b["ops"]:
        rows.append(Difference("plan.ops", " ".join(a["ops"]), " ".join(b["ops"])))
    return rows


def environment_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Difference]:
    """Python, package versions, threads, devices (``environment.json`` of each run)."""
    return mapping_differences(a, b, "environment")


@dataclass(frozen=True)
class Divergence:
    """Where two runs' values first differ: the step and edge, with each run's digest (None: not recorded there)."""

    step: int
    node: str
    field: str
    pool: str | None
    digest_a: str | None
    digest_b: str | None

    @property
    def edge(self) -> str:
        return f"{self.node}.{self.field}"

    def __str__(self) -> str:
        where = f"pool {self.pool}" if self.pool else "controller"
        if self.digest_a is None or self.digest_b is None:
            side = "A" if self.digest_a is None else "B"
            return f"step {self.step}, `{self.edge}` ({where}): recorded in one run only (missing in {side})"
        return f"step {self.step}, `{self.edge}` ({where}): {self.digest_a[:12]} vs {self.digest_b[:12]}"


def _by_step(records: Sequence[HashRecord]) -> dict[int, list[HashRecord]]:
    steps: dict[int, list[HashRecord]] = {}
    for record in records:
        steps.setdefault(record.step, []).append(record)
    return steps


def first_divergence(a: Sequence[HashRecord], b: Sequence[HashRecord]) -> Divergence | None:
    """The first step (ascending) and, within it, the first edge in A's order (graph inputs, then plan order) whose
    digest differs between the runs, or that one of them did not record; None when every step both recorded
    agrees (the runs may still differ in how many steps they recorded)."""
    steps_a, steps_b = _by_step(a), _by_step(b)
    for step in sorted(set(steps_a) & set(steps_b)):
        theirs = {(r.node, r.field): r for r in steps_b[step]}
        mine = {(r.node, r.field) for r in steps_a[step]}
        for record in steps_a[step]:
            other = theirs.get((record.node, record.field))
            if other is None or other.digest != record.digest:
                return Divergence(step, record.node, record.field, record.pool, record.digest,
                                  other.digest if other else None)
        for record in steps_b[step]:
            if (record.node, record.field) not in mine:
                return Divergence(step, record.node, record.field, record.pool, None, record.digest)
    return None
