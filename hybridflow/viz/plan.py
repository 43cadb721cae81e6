"""Draw an :class:`~hybridflow.compiler.plan.ExecutionPlan`'s placement as DOT (and SVG) through graphviz.

One cluster box per device pool (its devices, memory per device, offload
mode), and inside it one box per role placed there: its training/inference
layout, its generation layout, its predicted peak memory and the graph nodes
it runs. A rollout pool of its own holds the generating role's rollout
engine. Weight-sync ops are drawn as their own boxes — inside the pool for the
hybrid engine (with its micro-DP groups), or on an edge to the rollout pool
for a cross-pool broadcast (with buckets and volume). An environment pool holds
the environments of a role's multi-turn rollouts, linked to its rollout. The controller box lists
the compute nodes. Colours follow the graph drawing's role colours.
"""
from __future__ import annotations

import html
from pathlib import Path

from .graph import role_colours
from .render import Rendered, write_dot_and_svg

__all__ = ["plan_to_dot", "draw_plan"]

GIB = 2**30


def _gib(nbytes: float | None) -> str:
    return "" if nbytes is None else f"{nbytes / GIB:.3g} GiB"


def _devices(devices: tuple[str, ...]) -> str:
    return ", ".join(devices) if len(devices) <= 2 else f"{devices[0]} … {devices[-1]}"


def _lines(title: str, *rows: str) -> str:
    small = "<br/>".join(html.escape(r) for r in rows if r)
    return f"<<b>{html.escape(title)}</b>" + (f'<br/><font point-size="10">{small}</font>>' if small else ">")


def _role_box(plan, placement, graph, on_rollout: bool) -> str:
    kinds = {n.name: n.kind for n in graph.nodes}
    elsewhere = on_rollout or placement.generation_pool is None
    runs = [op.node + (f" (i+{op.iteration_offset})" if op.iteration_offset else "") for op in plan.ops
            if op.kind == "node" and op.role == placement.role
            and (kinds[op.node] == "generate" if on_rollout else kinds[op.node] != "generate" or elsewhere)]
    if on_rollout:
        peak = max((op.peak_memory_bytes or 0 for op in plan.ops if op.role == placement.role and op.pool == placement.generation_pool), default=0)
        return _lines(f"{placement.role} (rollout engine)", f"generate {placement.generation_layout}",
                      f"peak {_gib(peak)} per device" if peak else "", f"runs {', '.join(runs)}")
    layout = f"train/infer {placement.layout}" if placement.generation_layout else f"layout {placement.layout}"
    gen = f"generate {placement.generation_layout}" if placement.generation_layout and not placement.generation_pool else ""
    peak = f"peak {_gib(placement.memory_bytes)} per device" if placement.memory_bytes else ""
    return _lines(placement.role, layout, gen, peak, f"runs {', '.join(runs)}" if runs else "")


def _sync_box(op) -> str:
    rows = [f"{op.role}: {'broadcast to ' + op.target_pool if op.target_pool else 'hybrid engine'}"]
    if op.rank_groups:
        rows.append(f"{len(op.rank_groups)} micro-DP groups of {len(op.rank_groups[0])} ranks")
    if op.volume_bytes is not None:
        rows.append(f"{_gib(op.volume_bytes)} received per device")
    rows.append(f"{op.predicted_end_s - op.predicted_start_s:.3g} s predicted")
    return _lines(op.name, *rows)


def plan_to_dot(plan):
    """The placement drawing as a ``graphviz.Digraph``."""
    import graphviz

    graph = plan.graph
    colours = role_colours(graph)
    timing = f", predicted {plan.predicted_iteration_s:.4g} s per iteration" if plan.predicted_iteration_s else ""
    title = _lines(f"{graph.name} on {plan.cluster}", f"placement {plan.strategy}{timing}, staleness {plan.staleness}")
    dot = graphviz.Digraph("plan", graph_attr={"rankdir": "LR", "label": title, "labelloc": "t", "fontname": "Helvetica",
                                               "compound": "true", "nodesep": "0.25", "ranksep": "0.6"},
                           node_attr={"fontname": "Helvetica", "shape": "box", "style": "rounded,filled", "penwidth": "1.2"},
                           edge_attr={"fontname": "Helvetica", "fontsize": "10", "color": "#555555"})
    syncs = [op for op in plan.ops if op.kind == "weight_sync"]
    for pool in plan.pools:
        with dot.subgraph(name=f"cluster_{pool.name}") as box:
            memory = f" × {_gib(pool.memory_bytes)}" if pool.memory_bytes else ""
            mode = "offload: each role's states go to host memory between its uses" if pool.offload else ""
            what = (f"{pool.workers} environment worker(s) on host CPUs" if pool.workers
                    else f"{len(pool.devices)} device(s){memory}: {_devices(pool.devices)}")
            box.attr(label=_lines(pool.name, what, mode),
                     style="rounded,filled", fillcolor="#f4f4f4", color="#888888", fontname="Helvetica")
            for p in plan.placements:
                if pool.workers and p.env_pool == pool.name:
                    box.node(f"env.{p.role}", _lines(f"{p.role}: environments", "reset / step of each sample (tool calls)"),
                             fillcolor="#e8f4e8")
            for p in plan.placements:
                if p.pool == pool.name:
                    box.node(f"role.{p.role}", _role_box(plan, p, graph, False), fillcolor=colours.get(p.role, "#ffffff"))
                if p.generation_pool == pool.name:
                    box.node(f"rollout.{p.role}", _role_box(plan, p, graph, True), fillcolor=colours.get(p.role, "#ffffff"))
            if not any(p.pool == pool.name or p.generation_pool == pool.name or p.env_pool == pool.name
                       for p in plan.placements):
                box.node(f"empty.{pool.name}", "(idle)", style="dashed")
            for op in syncs:
                if op.pool == pool.name:
                    box.node(f"op.{op.name}", _sync_box(op), shape="box", style="filled,bold", color="#c07000", fillcolor="#ffe8b0")
    for op in syncs:
        dot.edge(f"role.{op.role}", f"op.{op.name}", label="after update", style="dashed")
        target = f"rollout.{op.role}" if op.target_pool else f"role.{op.role}"
        dot.edge(f"op.{op.name}", target, label="weights for generation", penwidth="2", color="#c07000")
    for p in plan.placements:
        if p.env_pool:
            source = f"rollout.{p.role}" if p.generation_pool else f"role.{p.role}"
            dot.edge(source, f"env.{p.role}", label="actions → observations", style="dashed", dir="both")
    compute = [n.name for n in graph.nodes if n.kind == "compute"]
    if compute:
        dot.node("controller", _lines("controller (single process)", f"compute: {', '.join(compute)}"),
                 fillcolor=colours.get("controller", "#eeeeee"))
    return dot


def draw_plan(plan, out: str | Path) -> Rendered:
    """Write ``out.dot`` and, when Graphviz's ``dot`` exists, ``out.svg``."""
    return write_dot_and_svg(plan_to_dot(plan).source, out)
