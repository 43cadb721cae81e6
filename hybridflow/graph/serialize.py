"""The JSON form of a graph.

::

    {"format": "hybridflow.graph", "version": 1, "name": "ppo",
     "attrs": {"kl_coef": 0.001, ...},
     "roles": [{"name": "actor", "kind": "policy", "trainable": true}, ...],
     "inputs": [{"name": "prompts", "fields": ["prompt_ids: int64[B, P]", ...]}],
     "nodes": [{"name": "gae", "kind": "compute", "role": "controller", "op": "gae",
                "inputs": [{"name": "values", "source": "critic.values", "field": "values"}, ...],
                "outputs": ["advantages: float32[B, R]", ...],
                "attrs": {"gamma": 1.0, "lam": 0.95}}, ...]}

Reading checks every key and type and raises :class:`GraphError` on anything
malformed, never a bare KeyError or TypeError. ``graph_from_json(graph_to_json(g)) == g``.
"""
from __future__ import annotations

import json
from typing import Any

from ..errors import GraphError
from .attrs import attrs_from_dict, attrs_to_dict, make_params
from .ir import Graph, GraphInput, Input, Node, Role
from .resampling import resample_from_dict, resample_to_dict
from .schema import Schema, parse_field

__all__ = ["FORMAT", "VERSION", "graph_to_dict", "graph_from_dict", "graph_to_json", "graph_from_json"]

FORMAT = "hybridflow.graph"
VERSION = 1


def _schema_to_list(schema: Schema) -> list[str]:
    return [str(f) for f in schema]


def _node_to_dict(node: Node) -> dict[str, Any]:
    return {
        "name": node.name, "kind": node.kind, "role": node.role, "op": node.op,
        "inputs": [{"name": i.name, "source": i.source, "field": i.field} for i in node.inputs],
        "outputs": _schema_to_list(node.outputs),
        "attrs": attrs_to_dict(node.attrs),
    }


def _role_to_dict(role: Role) -> dict[str, Any]:
    """``rule`` is written only when true, so graphs without rule roles read as they always did."""
    return {"name": role.name, "kind": role.kind, "trainable": role.trainable, **({"rule": True} if role.rule else {})}


def _role(data: object) -> Role:
    keys = ("name", "kind", "trainable", "rule") if isinstance(data, dict) and "rule" in data else ("name", "kind", "trainable")
    return Role(**_obj(data, keys, "role"))


def graph_to_dict(graph: Graph) -> dict[str, Any]:
    return {
        "format": FORMAT, "version": VERSION, "name": graph.name,
        "attrs": dict(graph.attrs),
        "roles": [_role_to_dict(r) for r in graph.roles],
        "inputs": [{"name": i.name, "fields": _schema_to_list(i.schema)} for i in graph.inputs],
        "nodes": [_node_to_dict(n) for n in graph.nodes],
        **({"resample": [resample_to_dict(r) for r in graph.resample]} if graph.resample else {}),
    }


def graph_to_json(graph: Graph, indent: int | None = 2) -> str:
    return json.dumps(graph_to_dict(graph), indent=indent)


# -- reading -------------------------------------------------------------------------------

def _obj(data: object, keys: tuple[str, ...], where: str) -> dict[str, Any]:
    """``data`` as an object with exactly ``keys``."""
    if not isinstance(data, dict):
        raise GraphError(f"{where}: expected a JSON object with keys {', '.join(keys)}, got {type(data).__name__}")
    missing, extra = [k for k in keys if k not in data], sorted(set(map(str, data)) - set(keys))
    if missing or extra:
        raise GraphError(f"{where}: " + "; ".join(
            ([f"missing key(s) {', '.join(missing)}"] if missing else []) + ([f"unexpected key(s) {', '.join(extra)}"] if extra else [])))
    return data


def _list(data: object, where: str) -> list:
    if not isinstance(data, list):
        raise GraphError(f"{where}: expected a JSON list, got {type(data).__name__}")
    return data


def _schema(data: object, where: str) -> Schema:
    return Schema(tuple(parse_field(f) for f in _list(data, where)))


def _node(data: object, where: str) -> Node:
    d = _obj(data, ("name", "kind", "role", "op", "inputs", "outputs", "attrs"), where)
    where = f"node {d['name']!r}" if isinstance(d["name"], str) else where
    inputs = tuple(Input(**_obj(i, ("name", "source", "field"), f"{where} input")) for i in _list(d["inputs"], f"{where} inputs"))
    if not isinstance(d["kind"], str):
        raise GraphError(f"{where}: kind must be a string, got {d['kind']!r}")
    return Node(name=d["name"], kind=d["kind"], role=d["role"], op=d["op"], inputs=inputs,
                outputs=_schema(d["outputs"], f"{where} outputs"), attrs=attrs_from_dict(d["kind"], d["attrs"], where))


def graph_from_dict(data: object) -> Graph:
    keys = ("format", "version", "name", "attrs", "roles", "inputs", "nodes")
    d = _obj(data, keys + (("resample",) if isinstance(data, dict) and "resample" in data else ()), "graph")
    if d["format"] != FORMAT or d["version"] != VERSION:
        raise GraphError(f"not a hybridflow graph of version {VERSION}: format={d['format']!r}, version={d['version']!r}")
    if not isinstance(d["attrs"], dict):
        raise GraphError(f"graph attrs must be a JSON object, got {d['attrs']!r}")
    try:
        return Graph(
            name=d["name"],
            roles=tuple(_role(r) for r in _list(d["roles"], "graph roles")),
            inputs=tuple(GraphInput(name=i["name"], schema=_schema(i["fields"], "graph input"))
                         for i in (_obj(x, ("name", "fields"), "graph input") for x in _list(d["inputs"], "graph inputs"))),
            nodes=tuple(_node(n, f"node #{k}") for k, n in enumerate(_list(d["nodes"], "graph nodes"))),
            attrs=make_params(d["attrs"], "graph attrs"),
            resample=tuple(resample_from_dict(r, f"resample #{k}") for k, r in enumerate(_list(d.get("resample", []), "graph resample"))),
        )
    except (TypeError, ValueError) as err:  # a record given a value of the wrong type deep inside
        raise GraphError(f"malformed graph JSON: {err}") from None


def graph_from_json(text: str | bytes) -> Graph:
    """Read a graph from its JSON form; :class:`GraphError` if the text is not one."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError, RecursionError) as err:
        raise GraphError(f"not valid JSON: {err}") from None
    return graph_from_dict(data)
