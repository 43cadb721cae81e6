"""The readable text form of a graph, one record per line, like a jaxpr::

    graph ppo
    attr kl_coef = 0.001
    role actor: policy, trainable
    role ref: reference, frozen
    input prompts (prompt_ids: int64[B, P], prompt_mask: int64[B, P])
    node gae: compute @controller gae(token_rewards=kl_in_reward.token_rewards, values=critic.values.values, ...) {"gamma": 1.0}
        -> (advantages: float32[B, R], returns: float32[B, R])
    resample {"nodes": ["actor.generate", "reward.score", "uniform_group_filter"], "filter": "uniform_group_filter", ...}

An input ``name=source.field`` reads field ``field`` of producer ``source``
(split at the last dot) as ``name``. Attribute values and node attribute
records are written as JSON. Blank lines and lines starting with ``#`` are
ignored. ``graph_from_text(graph_to_text(g)) == g``; malformed text raises
:class:`GraphError` naming the line.
"""
from __future__ import annotations

import json
import re

from ..errors import GraphError
from ..names import IDENTIFIER, NAME
from .attrs import attrs_from_dict, attrs_to_dict, make_params
from .ir import Graph, GraphInput, Input, Node, Role
from .resampling import resample_from_dict, resample_to_dict
from .schema import Schema, parse_field

__all__ = ["graph_to_text", "graph_from_text"]

_GRAPH = re.compile(rf"^graph ({NAME})$")
_ATTR = re.compile(rf"^attr ({IDENTIFIER}) = (.+)$")
_ROLE = re.compile(rf"^role ({NAME}): (\w+), (trainable|frozen)(, rule)?$")
_INPUT = re.compile(rf"^input ({NAME}) (\(.*\))$")
_NODE = re.compile(rf"^node ({NAME}): (\w+) @({NAME}) ({NAME})\(([^()]*)\) (\{{.*\}})$")
_OUTPUTS = re.compile(r"^\s+-> (\(.*\))$")
_INPUT_ITEM = re.compile(rf"^({IDENTIFIER})=({NAME})\.({IDENTIFIER})$")


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=False)


def graph_to_text(graph: Graph) -> str:
    lines = [f"graph {graph.name}"]
    lines += [f"attr {k} = {_json(v)}" for k, v in graph.attrs]
    lines += [f"role {r.name}: {r.kind}, {'trainable' if r.trainable else 'frozen'}{', rule' if r.rule else ''}" for r in graph.roles]
    lines += [f"input {i.name} {i.schema}" for i in graph.inputs]
    for n in graph.nodes:
        inputs = ", ".join(str(i) for i in n.inputs)
        lines.append(f"node {n.name}: {n.kind} @{n.role} {n.op}({inputs}) {_json(attrs_to_dict(n.attrs))}")
        lines.append(f"    -> {n.outputs}")
    lines += [f"resample {_json(resample_to_dict(r))}" for r in graph.resample]
    return "\n".join(lines) + "\n"


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets: ``"a: f[B, R], b: f"`` -> two items."""
    items, depth, start = [], 0, 0
    for k, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(text[start:k])
            start = k + 1
    items.append(text[start:])
    return [item.strip() for item in items]


def _schema(text: str) -> Schema:
    inner = text[1:-1].strip()
    return Schema(tuple(parse_field(item) for item in _split_top(inner))) if inner else Schema()


def _inputs(text: str, where: str) -> tuple[Input, ...]:
    if not text.strip():
        return ()
    found = []
    for item in text.split(","):
        match = _INPUT_ITEM.match(item.strip())
        if not match:
            raise GraphError(f"{where}: cannot read input {item.strip()!r}; write it as name=source.field")
        found.append(Input(*match.groups()))
    return tuple(found)


def _load(text: str, where: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as err:
        raise GraphError(f"{where}: not valid JSON ({err}): {text!r}") from None


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Non-blank, non-comment lines with their numbers; '->' continuation lines are joined to the line before."""
    lines: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if _OUTPUTS.match(line):
            if not lines or not lines[-1][1].startswith("node "):
                raise GraphError(f"line {number}: an outputs line '-> (...)' must follow a node line")
            lines[-1] = (lines[-1][0], lines[-1][1] + "\n" + line)
        else:
            lines.append((number, line.rstrip()))
    return lines


def _node(head: str, outputs: str, where: str) -> Node:
    match = _NODE.match(head)
    if not match:
        raise GraphError(f"{where}: cannot read node line {head!r}; expected 'node NAME: KIND @ROLE OP(INPUTS) {{ATTRS}}'")
    name, kind, role, op, inputs, attrs = match.groups()
    return Node(name=name, kind=kind, role=role, op=op, inputs=_inputs(inputs, where),
                outputs=_schema(outputs), attrs=attrs_from_dict(kind, _load(attrs, where), where))


def graph_from_text(text: str) -> Graph:
    """Read a graph from its text form; :class:`GraphError` on anything malformed."""
    if not isinstance(text, str):
        raise GraphError(f"graph text must be a str, got {type(text).__name__}")
    lines = _logical_lines(text)
    header = _GRAPH.match(lines[0][1]) if lines else None
    if not header:
        raise GraphError("graph text must start with a line 'graph NAME'")
    attrs: dict[str, object] = {}
    roles, inputs, nodes, regions = [], [], [], []
    for number, line in lines[1:]:
        where = f"line {number}"
        head, _, outputs = line.partition("\n")
        if m := _ATTR.match(line):
            if m.group(1) in attrs:
                raise GraphError(f"{where}: attribute {m.group(1)!r} is given twice")
            attrs[m.group(1)] = _load(m.group(2), where)
        elif m := _ROLE.match(line):
            roles.append(Role(m.group(1), m.group(2), m.group(3) == "trainable", rule=m.group(4) is not None))
        elif m := _INPUT.match(line):
            inputs.append(GraphInput(m.group(1), _schema(m.group(2))))
        elif line.startswith("resample "):
            regions.append(resample_from_dict(_load(line[len("resample "):], where), where))
        elif head.startswith("node "):
            out = _OUTPUTS.match(outputs)
            if not out:
                raise GraphError(f"{where}: node line must be followed by its outputs line '    -> (...)'")
            nodes.append(_node(head, out.group(1), where))
        else:
            raise GraphError(f"{where}: cannot read {line!r}; expected an attr, role, input, node or resample line")
    return Graph(name=header.group(1), roles=tuple(roles), inputs=tuple(inputs), nodes=tuple(nodes),
                 attrs=make_params(attrs, "graph attrs"), resample=tuple(regions))
