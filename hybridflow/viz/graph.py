"""Draw a :class:`~hybridflow.graph.Graph` as DOT (and SVG) through graphviz.

Node shape says the node kind, fill colour the role it runs on (compute nodes
run on the controller, grey), edges are labelled with the fields they carry
(``field`` or ``producer field -> consumer field`` when renamed); a legend
lists the kinds and roles that appear, and the title lists the graph's
attributes. Given the edge lags of a plan with staleness
(:meth:`~hybridflow.compiler.plan.ExecutionPlan.edge_lags`), a lagged edge is
dashed, in LAG_COLOUR, and its label ends with ``lag=k``. The styling lives in
the tables below.
"""
from __future__ import annotations

import html
from pathlib import Path
from typing import Callable, Mapping

from ..graph import CONTROLLER, Edge, Graph, Node
from .render import Rendered, write_dot_and_svg

__all__ = ["KIND_SHAPES", "ROLE_COLOURS", "graph_to_dot", "draw_graph"]

KIND_SHAPES: dict[str, dict[str, str]] = {
    "input": {"shape": "cylinder"},
    "generate": {"shape": "box3d"},
    "infer": {"shape": "ellipse"},
    "score": {"shape": "hexagon"},
    "compute": {"shape": "box", "style": "rounded,filled"},
    "update": {"shape": "doubleoctagon"},
}
"""Graphviz node attributes per node kind ("input" is a graph input)."""

ROLE_COLOURS: dict[str, str] = {
    "actor": "#a6cee3", "critic": "#fdbf6f", "cost_critic": "#ff9f80", "ref": "#b2df8a",
    "reward": "#fb9a99", "cost": "#cab2d6", CONTROLLER: "#eeeeee",
}
"""Fill colour per role name; other roles take colours from PALETTE in order."""

PALETTE = ("#ffff99", "#8dd3c7", "#bebada", "#80b1d3", "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5")
INPUT_COLOUR = "#ffffff"
LAG_COLOUR = "#c07000"
"""Lagged edges (data sampled by older weights) are dashed in this colour."""


def role_colours(graph: Graph) -> dict[str, str]:
    """Role name (and the controller) -> its fill colour: the standard roles' own, then the palette's in turn."""
    colours = {CONTROLLER: ROLE_COLOURS[CONTROLLER]}
    spare = iter(PALETTE * (1 + len(graph.roles) // len(PALETTE)))
    for role in graph.roles:
        colours[role.name] = ROLE_COLOURS.get(role.name) or next(spare)
    return colours


def _scalar(value: object) -> str:
    return "true" if value is True else "false" if value is False else "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _params(params: tuple) -> str:
    return ", ".join(f"{k}={_scalar(v)}" for k, v in params)


# What the second line of a node's label says, per node kind.
_DETAIL: dict[str, Callable[[Node], str]] = {
    "generate": lambda n: ", ".join(p for p in (f"n={n.attrs.n}" if n.attrs.n != 1 else "", "greedy" if n.attrs.greedy else "") if p) or "sample",
    "infer": lambda n: f"→ {', '.join(n.outputs.names)}",
    "score": lambda n: f"→ {', '.join(n.outputs.names)}",
    "compute": lambda n: "  ".join(p for p in (n.op if n.op != n.name else "", _params(n.attrs.params)) if p),
    "update": lambda n: " + ".join(t.op if t.weight == 1 else f"{t.weight:g}·{t.op}" for t in n.attrs.terms),
}


def _wrap(text: str, width: int = 38) -> list[str]:
    lines, line = [], ""
    for word in text.split(", "):
        if line and len(line) + len(word) + 2 > width:
            lines.append(line + ",")
            line = word
        else:
            line = f"{line}, {word}" if line else word
    return lines + [line] if line else lines


def _label(title: str, detail: str, width: int = 38) -> str:
    small = "<br/>".join(html.escape(line) for line in _wrap(detail, width))
    return f'<<b>{html.escape(title)}</b>' + (f'<br/><font point-size="10">{small}</font>>' if small else ">")


def _edge_label(fields: tuple[tuple[str, str], ...]) -> str:
    names = [name if name == field else f"{field} → {name}" for name, field in fields]
    return "\n".join(_wrap(", ".join(names), width=30))


def graph_to_dot(graph: Graph, lags: Mapping[Edge, int] | None = None):
    """The graph as a ``graphviz.Digraph``; ``lags``: the lag of each edge (lagged ones are drawn dashed)."""
    import graphviz

    colours = role_colours(graph)
    title = _label(graph.name, _params(graph.attrs), width=90)
    dot = graphviz.Digraph(graph.name, graph_attr={"rankdir": "TB", "label": title, "labelloc": "t", "fontname": "Helvetica",
                                                   "nodesep": "0.35", "ranksep": "0.5"},
                           node_attr={"fontname": "Helvetica", "style": "filled", "penwidth": "1.2"},
                           edge_attr={"fontname": "Helvetica", "fontsize": "9", "color": "#555555", "fontcolor": "#333333"})
    for graph_input in graph.inputs:
        dot.node(graph_input.name, _label(graph_input.name, ", ".join(graph_input.schema.names)), fillcolor=INPUT_COLOUR, **KIND_SHAPES["input"])
    regions = {n: r for r in graph.resample for n in r.nodes}
    for node in graph.nodes:
        if node.name not in regions:
            dot.node(node.name, _label(node.name, _DETAIL[node.kind](node)), fillcolor=colours.get(node.role, "#ffffff"), **KIND_SHAPES[node.kind])
    for k, region in enumerate(graph.resample):  # a dynamic-sampling body: one dashed box, its bound and filter in the label
        with dot.subgraph(name=f"cluster_resample_{k}") as box:
            box.attr(label=f"{region.name}: repeat until full, <= {region.max_rounds} rounds (keep: {region.filter})",
                     style="dashed", color="#aa3333", fontcolor="#aa3333", fontsize="10")
            for name in region.nodes:
                node = graph.node(name)
                box.node(name, _label(name, _DETAIL[node.kind](node)), fillcolor=colours.get(node.role, "#ffffff"), **KIND_SHAPES[node.kind])
    lag_of: dict[tuple[str, str], int] = {}
    for edge, lag in (lags or {}).items():
        lag_of[(edge.producer, edge.consumer)] = max(lag, lag_of.get((edge.producer, edge.consumer), 0))
    for (source, target), fields in _edges(graph).items():
        lag = lag_of.get((source, target), 0)
        if lag:
            dot.edge(source, target, label=f"{_edge_label(fields)}\nlag={lag}", style="dashed", color=LAG_COLOUR,
                     fontcolor=LAG_COLOUR)
        else:
            dot.edge(source, target, label=_edge_label(fields))
    _legend(dot, graph, colours)
    return dot


def _edges(graph: Graph) -> dict[tuple[str, str], tuple[tuple[str, str], ...]]:
    edges: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {}
    for node in graph.nodes:
        for item in node.inputs:
            key = (item.source, node.name)
            edges[key] = edges.get(key, ()) + ((item.name, item.field),)
    return edges


def _legend(dot, graph: Graph, colours: dict[str, str]) -> None:
    """Two rows under the graph: one sample node per kind, one swatch per role."""
    kinds = (["input"] if graph.inputs else []) + [k for k in KIND_SHAPES if any(n.kind == k for n in graph.nodes)]
    roles = [(r.name, f"{r.kind}, {'trainable' if r.trainable else 'frozen'}") for r in graph.roles]
    if any(n.role == CONTROLLER for n in graph.nodes):
        roles.append((CONTROLLER, "compute ops"))
    with dot.subgraph(name="cluster_legend") as legend:
        legend.attr(label="legend", fontsize="11", style="rounded", color="#999999", fontname="Helvetica")
        with legend.subgraph() as row:
            row.attr(rank="same")
            for kind in kinds:
                style = {**KIND_SHAPES[kind], "style": "filled" + (",rounded" if kind == "compute" else "")}
                row.node(f"legend.kind.{kind}", kind, fontsize="10", fillcolor="#ffffff", **style)
            _in_order(row, [f"legend.kind.{kind}" for kind in kinds])
        with legend.subgraph() as row:
            row.attr(rank="same")
            for role, text in roles:
                row.node(f"legend.role.{role}", f"{role}\n({text})", shape="box", fontsize="10", fillcolor=colours[role])
            _in_order(row, [f"legend.role.{role}" for role, _ in roles])
        if kinds and roles:
            legend.edge(f"legend.kind.{kinds[0]}", f"legend.role.{roles[0][0]}", style="invis")
    if kinds:  # hang the legend under the last nodes so that it is drawn at the bottom
        read = {i.source for n in graph.nodes for i in n.inputs}
        for sink in [n.name for n in graph.nodes if n.name not in read]:
            dot.edge(sink, f"legend.kind.{kinds[0]}", style="invis")


def _in_order(row, keys: list[str]) -> None:
    """Invisible edges that keep a legend row in reading order."""
    for left, right in zip(keys, keys[1:]):
        row.edge(left, right, style="invis")


def draw_graph(graph: Graph, out: str | Path, lags: Mapping[Edge, int] | None = None) -> Rendered:
    """Write ``out.dot`` and, when Graphviz's ``dot`` exists, ``out.svg`` (``lags``: see :func:`graph_to_dot`)."""
    return write_dot_and_svg(graph_to_dot(graph, lags).source, out)
