"""The graph IR: frozen, typed records.

* :class:`Role` — a model the algorithm uses (``actor``: a trainable policy,
  ``ref``: a frozen reference, ...).
* :class:`GraphInput` — a value the iteration starts from (``prompts``).
* :class:`Input` — one field a node reads: its name as the node sees it, and
  which producer (a node or a graph input) and which of its fields supplies it.
* :class:`Node` — one step: ``kind`` (generate | infer | score | compute |
  update), the ``role`` it runs on (``controller`` for compute nodes), the
  ``op`` it runs, its inputs, its output :class:`Schema` and a typed
  attribute record (see :mod:`hybridflow.graph.attrs`).
* :class:`Graph` — roles, graph inputs, nodes in a topological order, graph
  attributes (the algorithm's keyword arguments), and the dynamic-sampling
  regions (:class:`~hybridflow.graph.resampling.Resample`: a part of the graph
  repeated, behind a data-dependent filter, until the batch is full).

Node ops: generate nodes run ``generate``; infer nodes ``logprob`` or
``values``; score nodes ``score``; update nodes ``update`` (their loss terms
are in :class:`UpdateAttrs`); compute nodes any op registered with kind
``compute`` in :mod:`hybridflow_ops.registry`.

Records check their own shape when built (raising :class:`GraphError`);
whether a graph makes sense is :func:`hybridflow.graph.validate`'s job. Edits
make new objects (``dataclasses.replace`` or the ``with_*`` helpers).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Mapping

from ..errors import GraphError
from ..names import NAME_RE
from .attrs import ATTRS_BY_KIND, NodeAttrs, Params, make_params
from .resampling import Resample
from .schema import Schema

if TYPE_CHECKING:
    import networkx

__all__ = ["NODE_KINDS", "ROLE_KINDS", "TRAINABLE_KINDS", "CONTROLLER", "Role", "GraphInput", "Input", "Node", "Graph"]

NODE_KINDS = ("generate", "infer", "score", "compute", "update")
ROLE_KINDS = ("policy", "critic", "reference", "reward", "cost")
TRAINABLE_KINDS = ("policy", "critic")
RULE_KINDS = ("reward", "cost")
"""Role kinds that may be a rule function (``Role.rule``): they only score."""
CONTROLLER = "controller"
"""The pseudo-role of compute nodes: they run on the single controller, not on a model's workers."""


def _check_name(value: object, what: str) -> None:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise GraphError(f"{what} {value!r} is not a valid name; use letters, digits, '_', '.', '-' (starting with a letter)")


@dataclass(frozen=True)
class Role:
    """A model of the algorithm: ``kind`` is one of ROLE_KINDS; only trainable roles may be updated.

    ``rule``: a reward or cost role computed by a rule function, not by a model, so the compiler
    costs it as ~0 and places no model for it (``@hf.algorithm(roles={"reward": "rule"})``).
    """

    name: str
    kind: str
    trainable: bool
    rule: bool = False

    def __post_init__(self) -> None:
        _check_name(self.name, "role name")
        if not self.name.isidentifier() or self.name == CONTROLLER:
            raise GraphError(f"role name {self.name!r} must be a Python identifier other than {CONTROLLER!r}")
        if self.kind not in ROLE_KINDS:
            raise GraphError(f"role {self.name!r} has kind {self.kind!r}; use one of {', '.join(ROLE_KINDS)}")
        if not isinstance(self.trainable, bool):
            raise GraphError(f"role {self.name!r}: trainable must be a bool, got {self.trainable!r}")
        if not isinstance(self.rule, bool):
            raise GraphError(f"role {self.name!r}: rule must be a bool, got {self.rule!r}")
        if self.rule and (self.kind not in RULE_KINDS or self.trainable):
            raise GraphError(f"role {self.name!r} is a {self.kind} role; only frozen {' and '.join(RULE_KINDS)} roles "
                             "can be rule functions")


@dataclass(frozen=True)
class GraphInput:
    """A value the iteration starts from, e.g. ``prompts`` with the Prompts schema."""

    name: str
    schema: Schema

    def __post_init__(self) -> None:
        _check_name(self.name, "graph input name")
        if not isinstance(self.schema, Schema):
            raise GraphError(f"graph input {self.name!r}: schema must be a Schema, got {self.schema!r}")


@dataclass(frozen=True)
class Input:
    """Field ``name`` of a node, read from field ``field`` of producer ``source``."""

    name: str
    source: str
    field: str

    def __post_init__(self) -> None:
        for what, value in (("input field", self.name), ("source field", self.field)):
            if not isinstance(value, str) or not value.isidentifier():
                raise GraphError(f"{what} {value!r} must be an identifier")
        _check_name(self.source, "input source")

    def __str__(self) -> str:
        return f"{self.name}={self.source}.{self.field}"


@dataclass(frozen=True)
class Node:
    """One step of an iteration; see the module docstring for the meaning of each field."""

    name: str
    kind: str
    role: str
    op: str
    inputs: tuple[Input, ...]
    outputs: Schema
    attrs: NodeAttrs

    def __post_init__(self) -> None:
        _check_name(self.name, "node name")
        if self.kind not in NODE_KINDS:
            raise GraphError(f"node {self.name!r} has kind {self.kind!r}; use one of {', '.join(NODE_KINDS)}")
        _check_name(self.role, f"node {self.name!r}: role")
        _check_name(self.op, f"node {self.name!r}: op")
        if not isinstance(self.inputs, tuple) or not all(isinstance(i, Input) for i in self.inputs):
            raise GraphError(f"node {self.name!r}: inputs must be a tuple of Input, got {self.inputs!r}")
        names = [i.name for i in self.inputs]
        if len(set(names)) != len(names):
            raise GraphError(f"node {self.name!r} reads a field twice: {names}; each input name must be distinct")
        if not isinstance(self.outputs, Schema):
            raise GraphError(f"node {self.name!r}: outputs must be a Schema, got {self.outputs!r}")
        expected = ATTRS_BY_KIND[self.kind]
        if type(self.attrs) is not expected:
            raise GraphError(f"node {self.name!r} of kind {self.kind!r} needs attrs of type {expected.__name__}, got {type(self.attrs).__name__}")

    @property
    def sources(self) -> tuple[str, ...]:
        """The producers this node reads from, each once, in first-use order."""
        return tuple(dict.fromkeys(i.source for i in self.inputs))


@dataclass(frozen=True)
class Graph:
    """One training iteration of an RL algorithm."""

    name: str
    roles: tuple[Role, ...]
    inputs: tuple[GraphInput, ...]
    nodes: tuple[Node, ...]
    attrs: Params = ()
    resample: tuple[Resample, ...] = ()
    """Dynamic-sampling regions (at most one; see :mod:`hybridflow.graph.resampling`)."""

    def __post_init__(self) -> None:
        _check_name(self.name, "graph name")
        for what, items, kind in (("roles", self.roles, Role), ("inputs", self.inputs, GraphInput), ("nodes", self.nodes, Node),
                                  ("resample", self.resample, Resample)):
            if not isinstance(items, tuple) or not all(isinstance(x, kind) for x in items):
                raise GraphError(f"graph {self.name!r}: {what} must be a tuple of {kind.__name__}, got {items!r}")
        roles = [r.name for r in self.roles]
        if len(set(roles)) != len(roles):
            raise GraphError(f"graph {self.name!r} declares a role twice: {roles}")
        if not isinstance(self.attrs, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in self.attrs):
            raise GraphError(f"graph {self.name!r}: attrs must be a tuple of (name, value) pairs, got {self.attrs!r}")
        object.__setattr__(self, "attrs", make_params(dict(self.attrs), f"graph {self.name!r}"))

    # -- lookups ---------------------------------------------------------------
    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise GraphError(f"graph {self.name!r} has no node {name!r}; its nodes are {', '.join(n.name for n in self.nodes)}")

    def role(self, name: str) -> Role | None:
        return next((r for r in self.roles if r.name == name), None)

    def attr(self, name: str) -> object:
        for key, value in self.attrs:
            if key == name:
                return value
        raise GraphError(f"graph {self.name!r} has no attribute {name!r}; it has {', '.join(k for k, _ in self.attrs) or 'none'}")

    def producers(self) -> dict[str, Schema]:
        """Every name a node may read from (graph inputs and nodes) -> the schema it provides."""
        found = {i.name: i.schema for i in self.inputs}
        found.update((n.name, n.outputs) for n in self.nodes)
        return found

    def resample_of(self, node: str) -> Resample | None:
        """The dynamic-sampling region whose body holds ``node``, if any."""
        return next((r for r in self.resample if node in r.nodes), None)

    def consumers(self, name: str) -> tuple[Node, ...]:
        """The nodes that read at least one field of producer ``name``."""
        return tuple(n for n in self.nodes if name in n.sources)

    # -- edits -----------------------------------------------------------------
    def with_nodes(self, nodes: tuple[Node, ...]) -> "Graph":
        return replace(self, nodes=tuple(nodes))

    def with_attrs(self, **attrs: object) -> "Graph":
        """A copy with graph attributes set (this does not re-trace; see ``Algorithm.build``)."""
        return replace(self, attrs=tuple({**dict(self.attrs), **attrs}.items()))  # type: ignore[arg-type]

    def with_params(self, params: Mapping[str, Mapping[str, object]]) -> "Graph":
        """A copy whose compute nodes take new values for parameters they already have.

        ``params`` is node name -> {parameter: value}, e.g. ``{"safe_rlhf_advantage": {"lagrange_lambda": 0.3}}``:
        the per-iteration values executors accept (``run_iteration(..., params=...)``) for run state
        such as a Lagrange multiplier (see :mod:`hybridflow.graph.state`). The structure never changes:
        GraphError for an unknown node, a node that is not a compute node, or a parameter it lacks.
        """
        if not params:
            return self
        nodes = []
        for node in self.nodes:
            if node.name not in params:
                nodes.append(node)
                continue
            if node.kind != "compute":
                raise GraphError(f"node {node.name!r} is a {node.kind} node; only compute nodes take parameters per iteration")
            current = dict(node.attrs.params)
            unknown = sorted(set(params[node.name]) - set(current))
            if unknown:
                raise GraphError(f"node {node.name!r} has no parameter {', '.join(unknown)}; it has "
                                 f"{', '.join(current) or 'none'}")
            attrs = replace(node.attrs, params=make_params({**current, **params[node.name]}, f"node {node.name!r}"))
            nodes.append(replace(node, attrs=attrs))
        missing = sorted(set(params) - {n.name for n in self.nodes})
        if missing:
            raise GraphError(f"graph {self.name!r} has no node {', '.join(missing)} to set parameters of")
        return replace(self, nodes=tuple(nodes))

    # -- views and forms ---------------------------------------------------------
    def to_networkx(self) -> "networkx.DiGraph":
        """A networkx view: one vertex per graph input and node, one edge per producer -> consumer pair.

        Vertices carry ``kind`` ("input" for graph inputs), ``role`` and ``op``;
        edges carry ``fields``, the (consumer name, producer field) pairs they carry.
        Edges to unknown producers are kept (the vertex gets kind "missing") so
        analyses of corrupted graphs do not crash.
        """
        from .analysis import to_networkx

        return to_networkx(self)

    def to_json(self, indent: int | None = 2) -> str:
        from .serialize import graph_to_json

        return graph_to_json(self, indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> "Graph":
        from .serialize import graph_from_json

        return graph_from_json(text)

    def to_text(self) -> str:
        from .text import graph_to_text

        return graph_to_text(self)

    @classmethod
    def from_text(cls, text: str) -> "Graph":
        from .text import graph_from_text

        return graph_from_text(text)

    def __str__(self) -> str:
        return self.to_text()
