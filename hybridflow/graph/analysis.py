"""Graph analysis through networkx: the view, cycles, ancestors; the sampled rollout and its samples per prompt.

networkx is imported by the functions that use it (~0.14 s of CPU): every process that imports the graph package
(each Ray worker, each command) would pay it, and only the ones that validate or draw a graph use it."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .ir import Graph, Node

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["to_networkx", "find_cycle", "ancestors", "sampled_rollout", "samples_per_prompt"]


def to_networkx(graph: Graph) -> nx.DiGraph:
    """One vertex per graph input and node; one edge per (producer, consumer) pair.

    Vertex attributes: ``kind`` ("input" for graph inputs, "missing" for a
    producer a node names but the graph lacks), ``role``, ``op``. Edge
    attribute ``fields``: tuple of ``(consumer field, producer field)`` pairs.
    """
    import networkx as nx

    view = nx.DiGraph(name=graph.name)
    for graph_input in graph.inputs:
        view.add_node(graph_input.name, kind="input", role=None, op=None)
    for node in graph.nodes:
        view.add_node(node.name, kind=node.kind, role=node.role, op=node.op)
    for node in graph.nodes:
        for item in node.inputs:
            if item.source not in view:
                view.add_node(item.source, kind="missing", role=None, op=None)
            if view.has_edge(item.source, node.name):
                view.edges[item.source, node.name]["fields"] += ((item.name, item.field),)
            else:
                view.add_edge(item.source, node.name, fields=((item.name, item.field),))
    return view


def find_cycle(graph: Graph) -> list[str] | None:
    """The node names of one cycle (first == last), or None when the graph is acyclic."""
    import networkx as nx

    try:
        edges = nx.find_cycle(to_networkx(graph))
    except nx.NetworkXNoCycle:
        return None
    return [u for u, _ in edges] + [edges[0][0]]


def ancestors(graph: Graph, name: str) -> set[str]:
    """Every producer ``name`` depends on, directly or not."""
    import networkx as nx

    view = to_networkx(graph)
    return set(nx.ancestors(view, name)) if name in view else set()


def sampled_rollout(graph: Graph) -> Node | None:
    """The generate node whose samples a step trains on: the first that samples (not ``greedy``), else the first
    generate node (ReMax's greedy baseline is a second, greedy one); None without generation."""
    generates = [n for n in graph.nodes if n.kind == "generate"]
    return next((n for n in generates if not n.attrs.greedy), generates[0] if generates else None)


def samples_per_prompt(graph: Graph) -> int:
    """Responses a step samples per prompt: the sampled rollout's ``n`` (1 without generation). The trainer's batch
    checks, its mini-batch count and the compiler's workload all use this one figure."""
    rollout = sampled_rollout(graph)
    return rollout.attrs.n if rollout is not None else 1
