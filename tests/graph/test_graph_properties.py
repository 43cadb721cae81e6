"""Hypothesis: random well-formed graphs validate and round-trip; random corruptions of them are
rejected with the right project exception; random mutations of their JSON and text forms are either
read and validated or rejected with a project exception, never a bare Python one.

A random graph is a rollout (n samples per prompt), a score, log-probs (and maybe reference log-probs
and critic values), a chain of compute nodes running freshly registered ops over randomly picked
fields, and an update of the actor (and of the critic when there is one).
"""
from __future__ import annotations

import dataclasses
import json
import warnings
from contextlib import contextmanager
from typing import NamedTuple

import networkx as nx
from hypothesis import HealthCheck, given, settings, strategies as st
from json_edits import edit

from hybridflow.errors import HybridflowError
from hybridflow.graph import (
    Algorithm, CycleError, DoubleUpdateError, FrozenRoleUpdateError, Graph, Input, LossTerm, MissingFieldError,
    ROLLOUT, TypeMismatchError, UndeclaredRoleError, UnknownAttrError, UnknownOpError, UpdateAttrs, ComputeAttrs,
    compute, validate,
)
from hybridflow.graph.serialize import graph_from_dict, graph_to_dict
from hybridflow_ops.registry import DTYPES, FieldSpec, register_op, unregister_op

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
OUT_NAMES = ("f0", "f1", "f2", "f3", "f4", "scores", "advantages")
OUT_DTYPES = ("float32", "int64", "bool")


class _Loss(NamedTuple):
    loss: object


@register_op("hyp_pg", model_inputs=("log_probs: float32[B, R]",), inputs=("old_log_probs: float32[B, R]", "response_mask: float32[B, R]"),
             outputs=("loss: float32",), kind="loss", replace=True)
def _hyp_pg(log_probs, old_log_probs, response_mask, *, clip=0.2):
    return _Loss(None)


@register_op("hyp_vloss", model_inputs=("value_preds: float32[B, R]",), inputs=("values: float32[B, R]", "response_mask: float32[B, R]"),
             outputs=("loss: float32",), kind="loss", replace=True)
def _hyp_vloss(value_preds, values, response_mask):
    return _Loss(None)


def _op1(a, *, scale=1.0): ...
def _op2(a, b, *, scale=1.0): ...
def _op3(a, b, c, *, scale=1.0): ...


ARITY = {1: _op1, 2: _op2, 3: _op3}


@dataclasses.dataclass(frozen=True)
class Step:
    picks: tuple[str, ...]
    outputs: tuple[tuple[str, str, int], ...]  # (name, dtype, rank): rank 1 is [B], rank 2 is [B, R]
    scale: float | None


@dataclasses.dataclass(frozen=True)
class Program:
    n: int
    use_ref: bool
    use_critic: bool
    steps: tuple[Step, ...]


@st.composite
def programs(draw) -> Program:
    n, use_ref, use_critic = draw(st.integers(1, 4)), draw(st.booleans()), draw(st.booleans())
    pool = list(ROLLOUT.names) + ["scores", "old_log_probs"] + ["ref_log_probs"] * use_ref + ["values"] * use_critic
    steps = []
    for _ in range(draw(st.integers(0, 6))):
        picks = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True))
        outputs = draw(st.lists(st.tuples(st.sampled_from(OUT_NAMES), st.sampled_from(OUT_DTYPES), st.integers(1, 2)),
                                min_size=1, max_size=2, unique_by=lambda o: o[0]))
        scale = draw(st.none() | st.floats(-10, 10, allow_nan=False))
        steps.append(Step(tuple(picks), tuple(outputs), scale))
        pool += [name for name, _, _ in outputs if name not in pool]
    return Program(n, use_ref, use_critic, tuple(steps))


def _op_field(spec: FieldSpec) -> str:
    """A graph field as an op declares it: batch dim B, other dims as they are."""
    return str(FieldSpec(spec.name, spec.dtype, ("B",) + spec.dims[1:]))


def _trace(program: Program, registered: list[str]) -> Graph:
    def random_algorithm(prompts, actor, critic, ref, reward):
        rollout = actor.generate(prompts, n=program.n)
        old = actor.logprob(rollout)
        pool = {name: rollout for name in rollout.fields.names} | {"scores": reward.score(rollout), "old_log_probs": old}
        if program.use_ref:
            pool["ref_log_probs"] = ref.logprob(rollout)
        if program.use_critic:
            pool["values"] = values = critic.values(rollout)
        for k, step in enumerate(program.steps):
            name = f"hyp_op_{k}"
            inputs = tuple(_op_field(pool[p].fields.get(p)) for p in step.picks)
            outputs = tuple(f"{o}: {dtype}[{'B' if rank == 1 else 'B, R'}]" for o, dtype, rank in step.outputs)
            register_op(name, inputs=inputs, outputs=outputs, replace=True)(ARITY[len(inputs)])
            registered.append(name)
            attrs = {} if step.scale is None else {"scale": step.scale}
            value = compute(name, *(pool[p].select(p) for p in step.picks), **attrs)
            pool.update((field, value) for field in value.fields.names)
        actor.update(rollout, old, loss="hyp_pg")
        if program.use_critic:
            critic.update(rollout, values, loss="hyp_vloss")

    return Algorithm(random_algorithm, name="random").trace()


@contextmanager
def built(program: Program):
    """The program's graph, with its ops registered for as long as the block runs."""
    registered: list[str] = []
    try:
        yield _trace(program, registered)
    finally:
        for name in registered:
            unregister_op(name)


def _quiet_validate(graph: Graph) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return validate(graph)


@settings(max_examples=200, **SETTINGS)
@given(programs())
def test_random_well_formed_graphs_validate_and_round_trip(program):
    with built(program) as graph:
        _quiet_validate(graph)
        assert Graph.from_json(graph.to_json()) == graph
        assert Graph.from_text(graph.to_text()) == graph
        view = graph.to_networkx()
        assert nx.is_directed_acyclic_graph(view) and view.number_of_nodes() == len(graph.nodes) + 1
        batch = "B" if program.n == 1 else f"B*{program.n}"
        assert all(f.dims[0] == batch for n in graph.nodes for f in n.outputs)  # one batch dim everywhere


# -- corruptions: each returns (corrupted graph, the exception validation must raise) ----------------

def _replace(graph: Graph, old, new) -> Graph:
    return graph.with_nodes(tuple(new if n is old else n for n in graph.nodes))


def drop_producer(graph, data):
    read = {i.source for n in graph.nodes for i in n.inputs}
    victim = data.draw(st.sampled_from([n for n in graph.nodes if n.name in read]))
    return graph.with_nodes(tuple(n for n in graph.nodes if n is not victim)), MissingFieldError


def change_dtype(graph, data):
    holders = [n for n in graph.nodes if n.outputs.fields]
    if data.draw(st.booleans()):
        graph_input = graph.inputs[0]
        k = data.draw(st.integers(0, len(graph_input.schema) - 1))
        old = graph_input.schema.fields[k]
        new = FieldSpec(old.name, data.draw(st.sampled_from([d for d in DTYPES if d != old.dtype])), old.dims)
        schema = dataclasses.replace(graph_input.schema, fields=graph_input.schema.fields[:k] + (new,) + graph_input.schema.fields[k + 1:])
        return dataclasses.replace(graph, inputs=(dataclasses.replace(graph_input, schema=schema),)), TypeMismatchError
    node = data.draw(st.sampled_from(holders))
    k = data.draw(st.integers(0, len(node.outputs) - 1))
    old = node.outputs.fields[k]
    new = FieldSpec(old.name, data.draw(st.sampled_from([d for d in DTYPES if d != old.dtype])), old.dims)
    outputs = dataclasses.replace(node.outputs, fields=node.outputs.fields[:k] + (new,) + node.outputs.fields[k + 1:])
    return _replace(graph, node, dataclasses.replace(node, outputs=outputs)), TypeMismatchError


def add_cycle(graph, data):
    view = graph.to_networkx()
    pairs = [(a, b) for a in graph.nodes if a.inputs for b in graph.nodes
             if b.outputs.fields and (b is a or b.name in nx.descendants(view, a.name))]
    a, b = data.draw(st.sampled_from(pairs))
    k = data.draw(st.integers(0, len(a.inputs) - 1))
    looped = Input(a.inputs[k].name, b.name, data.draw(st.sampled_from(b.outputs.names)))
    return _replace(graph, a, dataclasses.replace(a, inputs=a.inputs[:k] + (looped,) + a.inputs[k + 1:])), CycleError


def unknown_op(graph, data):
    node = data.draw(st.sampled_from(graph.nodes))
    if node.kind == "update":
        new = dataclasses.replace(node, attrs=UpdateAttrs((LossTerm("hyp_no_such_op"),) + node.attrs.terms[1:]))
    else:
        new = dataclasses.replace(node, op="hyp_no_such_op")
    return _replace(graph, node, new), UnknownOpError


def update_frozen(graph, data):
    update = data.draw(st.sampled_from([n for n in graph.nodes if n.kind == "update"]))
    if data.draw(st.booleans()):  # declare the updated role frozen
        roles = tuple(dataclasses.replace(r, trainable=False) if r.name == update.role else r for r in graph.roles)
        return dataclasses.replace(graph, roles=roles), FrozenRoleUpdateError
    frozen = data.draw(st.sampled_from([r.name for r in graph.roles if not r.trainable]))
    extra = dataclasses.replace(update, name=f"{frozen}.update", role=frozen)
    return graph.with_nodes(graph.nodes + (extra,)), FrozenRoleUpdateError


def double_update(graph, data):
    update = data.draw(st.sampled_from([n for n in graph.nodes if n.kind == "update"]))
    return graph.with_nodes(graph.nodes + (dataclasses.replace(update, name=update.name + "_again"),)), DoubleUpdateError


def undeclared_role(graph, data):
    role = data.draw(st.sampled_from(graph.roles))
    return dataclasses.replace(graph, roles=tuple(r for r in graph.roles if r is not role)), UndeclaredRoleError


def unknown_attr(graph, data):
    node = data.draw(st.sampled_from([n for n in graph.nodes if n.kind in ("compute", "update")]))
    if node.kind == "compute":
        new = dataclasses.replace(node, attrs=ComputeAttrs(node.attrs.params + (("hyp_bogus", 1),)))
    else:
        first = node.attrs.terms[0]
        term = dataclasses.replace(first, params=first.params + (("hyp_bogus", 1),))
        new = dataclasses.replace(node, attrs=UpdateAttrs((term,) + node.attrs.terms[1:]))
    return _replace(graph, node, new), UnknownAttrError


CORRUPTIONS = (drop_producer, change_dtype, add_cycle, unknown_op, update_frozen, double_update, undeclared_role, unknown_attr)


@settings(max_examples=300, **SETTINGS)
@given(programs(), st.sampled_from(CORRUPTIONS), st.data())
def test_random_corruptions_are_rejected_with_the_right_project_exception(program, corruption, data):
    with built(program) as graph:
        broken, expected = corruption(graph, data)
        try:
            _quiet_validate(broken)
        except expected as err:
            assert isinstance(err, HybridflowError) and err.node
        else:
            raise AssertionError(f"{corruption.__name__} was not rejected:\n{broken.to_text()}")


# -- malformed JSON and text: read and validate, or a project exception ----------------------------

def _mutate(doc, data):
    edit(doc, data, ("B*2", "float32", "int64", "", "controller"))


def _read_and_validate(read, source) -> None:
    try:
        graph = read(source)
        _quiet_validate(graph)
    except HybridflowError:
        return
    assert Graph.from_json(graph.to_json()) == graph and Graph.from_text(graph.to_text()) == graph


@settings(max_examples=200, **SETTINGS)
@given(programs(), st.integers(1, 3), st.data())
def test_mutated_json_is_read_or_rejected_with_a_project_exception(program, mutations, data):
    with built(program) as graph:
        doc = json.loads(json.dumps(graph_to_dict(graph)))
        for _ in range(mutations):
            _mutate(doc, data)
        _read_and_validate(graph_from_dict, doc)
        _read_and_validate(Graph.from_json, json.dumps(doc)[: data.draw(st.integers(0, 10**6))])


@settings(max_examples=100, **SETTINGS)
@given(programs(), st.data())
def test_mutated_text_is_read_or_rejected_with_a_project_exception(program, data):
    with built(program) as graph:
        lines = graph.to_text().splitlines()
        k = data.draw(st.integers(0, len(lines) - 1))
        how = data.draw(st.sampled_from(["drop_line", "swap_lines", "drop_char", "insert"]))
        if how == "drop_line":
            del lines[k]
        elif how == "swap_lines":
            j = data.draw(st.integers(0, len(lines) - 1))
            lines[k], lines[j] = lines[j], lines[k]
        else:
            at = data.draw(st.integers(0, len(lines[k])))
            extra = "" if how == "drop_char" else data.draw(st.text(max_size=4))
            lines[k] = lines[k][:at] + extra + lines[k][at + (how == "drop_char"):]
        _read_and_validate(Graph.from_text, "\n".join(lines))
