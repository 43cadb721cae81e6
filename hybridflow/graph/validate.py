"""Validation: is this graph one well-formed training iteration?

:func:`validate` runs the checks below in order and raises the first failure
as a :class:`~hybridflow.errors.GraphValidationError` subclass that names the
node, the field and a fix. It returns the warnings it issued (also sent
through :func:`warnings.warn`).

1. names: node and graph-input names are distinct (DuplicateNodeError);
2. roles: every node runs on a declared role or the controller (UndeclaredRoleError);
3. corrections: an off-policy correction reads the behaviour log-probs from a rollout
   node that emits them (:func:`~.staleness.check_rollout_inputs`, StalenessError);
   producers: every input names an existing producer and field (MissingFieldError);
4. acyclic and listed in topological order (CycleError, NodeOrderError);
5. per node, its signature (see :mod:`hybridflow.graph.signature`): the op
   exists and fits the node kind (UnknownOpError, OpKindError), attributes are
   the op's (UnknownAttrError), the role can run it (RoleKindError,
   FrozenRoleUpdateError), the inputs are exactly the op's, with matching
   dtypes and consistently unified dims (MissingFieldError, TypeMismatchError),
   and the declared outputs are what the op produces (TypeMismatchError);
6. dynamic sampling: the resample region's rules (:func:`~.resampling.check_resample`, ResampleError);
7. updates: each trainable role at most once (DoubleUpdateError), after every
   other node that reads that role's weights (UpdateOrderError);
8. warnings: a node whose outputs no node reads (UnusedValueWarning).
"""
from __future__ import annotations

import warnings

from hybridflow_ops.registry import FieldSpec

from ..errors import GraphError
from . import dims as D
from .analysis import ancestors, find_cycle
from .errors import (
    CycleError, DoubleUpdateError, DuplicateNodeError, GroupSizeError, MissingFieldError, NodeOrderError, TypeMismatchError,
    UndeclaredRoleError, UnusedValueWarning, UpdateOrderError,
)
from .ir import CONTROLLER, Graph, Node
from .resampling import check_resample
from .staleness import check_rollout_inputs
from .signature import Signature, bind_inputs, node_signature, output_fields

__all__ = ["validate", "check_group_sizes"]


def _check_names(graph: Graph) -> None:
    seen: set[str] = set()
    for name in [i.name for i in graph.inputs] + [n.name for n in graph.nodes]:
        if name in seen:
            raise DuplicateNodeError(f"the name {name!r} is used twice", node=name, hint="give every node and graph input its own name")
        seen.add(name)


def _check_roles(graph: Graph) -> None:
    declared = {r.name for r in graph.roles}
    for node in graph.nodes:
        if node.role != CONTROLLER and node.role not in declared:
            raise UndeclaredRoleError(
                f"runs on role {node.role!r}, which the graph does not declare", node=node.name,
                hint=f"declare it in the graph's roles (declared: {', '.join(sorted(declared)) or 'none'}), or run the node on one of those",
            )


def _check_producers(graph: Graph) -> None:
    producers = graph.producers()
    for node in graph.nodes:
        for item in node.inputs:
            schema = producers.get(item.source)
            if schema is None:
                raise MissingFieldError(
                    f"reads {item.field!r} from {item.source!r}, which is neither a node nor a graph input", node=node.name, field=item.name,
                    hint="add the node that produces it, or read the field from an existing producer",
                )
            if item.field not in schema:
                raise MissingFieldError(
                    f"reads {item.field!r} from {item.source!r}, which produces only {', '.join(schema.names) or 'nothing'}",
                    node=node.name, field=item.name, hint=f"read a field {item.source!r} produces, or make it produce {item.field!r}",
                )


def _check_order(graph: Graph) -> None:
    cycle = find_cycle(graph)
    if cycle:
        raise CycleError(f"nodes read each other's outputs in a cycle: {' -> '.join(cycle)}", node=cycle[0],
                         hint="a graph is one acyclic iteration; break the cycle by reading the field from an earlier node")
    placed = {i.name for i in graph.inputs}
    for node in graph.nodes:
        late = [s for s in node.sources if s not in placed]
        if late:
            raise NodeOrderError(f"reads from {', '.join(map(repr, late))}, which is listed after it", node=node.name,
                                 hint="list nodes in a topological order (producers before consumers)")
        placed.add(node.name)


def _match_outputs(node: Node, sig: Signature, bindings: dict[str, str]) -> None:
    declared, inferred = node.outputs.fields, output_fields(sig, bindings)
    hint = "the declared outputs must be what the op produces; rebuild the graph instead of editing outputs"
    if tuple(f.name for f in declared) != tuple(f.name for f in inferred):
        raise TypeMismatchError(f"declares outputs {node.outputs} but its op produces {', '.join(map(str, inferred)) or 'nothing'}", node=node.name, hint=hint)
    free: dict[str, str] = {}
    for have, want, op_field in zip(declared, inferred, sig.outputs):
        if have.dtype != want.dtype or len(have.dims) != len(want.dims):
            raise TypeMismatchError(f"declares {have} but its op produces {want}", node=node.name, field=have.name, hint=hint)
        for got, expected, op_dim in zip(have.dims, want.dims, op_field.dims):
            if D.is_symbol(op_dim) and op_dim not in bindings:  # a fresh dim (a new response length R): any symbol, used consistently
                if free.setdefault(expected, got) != got or not D.is_symbol(got):
                    raise TypeMismatchError(f"declares {have} but fresh dim {expected!r} must be one symbol throughout", node=node.name, field=have.name, hint=hint)
            elif D.canonical(got) != expected:
                raise TypeMismatchError(f"declares {have} but its op produces {want}", node=node.name, field=have.name, hint=hint)


def _check_node(graph: Graph, node: Node, producers: dict) -> None:
    sig = node_signature(node.name, node.kind, node.op, graph.role(node.role), node.attrs)
    wanted = [f.name for f in sig.inputs]
    extra = [i.name for i in node.inputs if i.name not in wanted]
    if extra:
        raise TypeMismatchError(f"reads {', '.join(map(repr, extra))}, which op {node.op!r} does not take (it takes {', '.join(wanted) or 'nothing'})",
                                node=node.name, field=extra[0], hint="drop the extra inputs")
    given = {}
    for item in node.inputs:
        spec = producers[item.source].get(item.field)
        given[item.name] = FieldSpec(item.name, spec.dtype, spec.dims)
    _match_outputs(node, sig, bind_inputs(node.name, sig, given))


def _check_updates(graph: Graph) -> None:
    updates = [n for n in graph.nodes if n.kind == "update"]
    first: dict[str, str] = {}
    for node in updates:
        if node.role in first:
            raise DoubleUpdateError(f"updates role {node.role!r}, which {first[node.role]!r} already updates in this iteration", node=node.name,
                                    hint="update each trainable role once per iteration; combine the losses into one update's loss terms")
        first[node.role] = node.name
    for node in updates:
        before = ancestors(graph, node.name)
        for other in graph.nodes:
            if other.role == node.role and other.name != node.name and other.name not in before:
                raise UpdateOrderError(
                    f"may change the weights of {node.role!r} before {other.name!r} reads them", node=node.name,
                    hint=f"pass a value that depends on {other.name!r} to the update, so that it runs after it",
                )


GROUP_FIELD = "group_index"
"""The rollout field that says which prompt each response answers; an op that reads it estimates within groups."""


def check_group_sizes(graph: Graph) -> None:
    """A group estimator must get groups of 2 or more: with one response per prompt every response is its group's
    mean, so the advantages are 0 and the policy never learns (GRPO, RLOO, ... with ``n=1``).

    Not part of :func:`validate`: such a graph is well formed (to draw, compile, or test an engine with), it is
    only useless to train; the trainer calls this before step 1 (GroupSizeError naming the estimator's node)."""
    by_name = {n.name: n for n in graph.nodes}
    for node in graph.nodes:
        for item in node.inputs:
            source = by_name.get(item.source)
            if item.name != GROUP_FIELD or source is None or source.kind != "generate" or source.attrs.n != 1:
                continue
            raise GroupSizeError(
                f"op {node.op!r} estimates advantages within groups of responses to one prompt, but {source.name!r} "
                "samples 1 response per prompt: every advantage would be 0 and nothing would be learned",
                node=node.name, field=GROUP_FIELD,
                hint=f"sample 2 or more responses per prompt (n_samples >= 2, or n=... on {source.name!r}), or use an "
                     "estimator without groups (gae with a critic, reinforce_pp, remax)")


def _unused(graph: Graph) -> list[UnusedValueWarning]:
    read = {i.source for n in graph.nodes for i in n.inputs} | {r.filter for r in graph.resample}
    return [
        UnusedValueWarning(f"node {n.name!r}: its outputs ({', '.join(n.outputs.names)}) are never read; drop the node or use its value")
        for n in graph.nodes if n.outputs.fields and n.name not in read
    ]


def validate(graph: Graph) -> list[UnusedValueWarning]:
    """Check ``graph``; raise the first error, return (and warn) the warnings."""
    if not isinstance(graph, Graph):
        raise GraphError(f"validate() takes a Graph, got {type(graph).__name__}")
    _check_names(graph)
    _check_roles(graph)
    check_rollout_inputs(graph)
    _check_producers(graph)
    _check_order(graph)
    producers = graph.producers()
    for node in graph.nodes:
        _check_node(graph, node, producers)
    check_resample(graph)
    _check_updates(graph)
    found = _unused(graph)
    for warning in found:
        warnings.warn(warning, stacklevel=2)
    return found
