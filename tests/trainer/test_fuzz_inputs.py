"""Random edits of the files a user hands to the commands only ever end in project errors.

A plan JSON (``hybridflow viz plan.json``, ``ExecutionPlan``/``read_plan``) and a standard
algorithm's graph JSON (``hybridflow compile graph.json``, ``viz``) are edited at random —
a key deleted, a value replaced by random JSON, a string swapped for one from elsewhere in
the document, an entry duplicated, the text cut short — and read the way the commands read
them. Each must either be read (and then survive its text form and compilation) or be
rejected with a :class:`HybridflowError`; a KeyError, TypeError, AssertionError, ValueError
... from inside is a bug. (Random config override strings are in test_bad_inputs.py, random
graphs of random ops in tests/graph/test_graph_properties.py.)
"""
from __future__ import annotations

import json
import warnings

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler.local_plan import plan_local
from hybridflow.compiler.plan import read_plan
from hybridflow.errors import HybridflowError
from hybridflow.graph import Graph, validate

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
GRAPHS = {name: json.loads(algorithm.build().to_json()) for name, algorithm in sorted(ALGORITHMS.items())}
PLANS = {name: json.loads(plan_local(algorithm.build()).to_json()) for name, algorithm in sorted(ALGORITHMS.items())}

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**6) | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def _paths(value, prefix=()):
    yield prefix
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        yield from _paths(child, prefix + (key,))


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return [s for child in children for s in _strings(child)]


def _edit(doc, data) -> None:
    path = data.draw(st.sampled_from([p for p in _paths(doc) if p]))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    key, how = path[-1], data.draw(st.sampled_from(["delete", "replace", "swap_string", "duplicate"]))
    if how == "delete":
        del parent[key]
    elif how == "replace":
        parent[key] = data.draw(JSON_VALUES)
    elif how == "swap_string":  # a plausible value: a node, pool or role name, a dtype, a device ...
        parent[key] = data.draw(st.sampled_from(_strings(doc) + ["B*2", "float32", "cuda:0", "cpu", "", "controller"]))
    elif isinstance(parent, list):
        parent.insert(key, json.loads(json.dumps(parent[key])))
    else:
        parent[key] = [parent[key], parent[key]]


def _edited(docs: dict, data) -> str:
    doc = json.loads(json.dumps(docs[data.draw(st.sampled_from(sorted(docs)))]))
    for _ in range(data.draw(st.integers(1, 3))):
        _edit(doc, data)
    text = json.dumps(doc)
    if data.draw(st.integers(0, 9)) == 0:  # now and then, cut short as by a full disk
        text = text[: data.draw(st.integers(0, len(text)))]
    return text


@settings(max_examples=300, **SETTINGS)
@given(st.data())
def test_edited_plan_json_is_read_or_rejected_with_a_project_error(data):
    text = _edited(PLANS, data)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = read_plan(text)
        plan.to_text()
    except HybridflowError:
        return


@settings(max_examples=300, **SETTINGS)
@given(st.data())
def test_edited_graph_json_is_read_or_rejected_with_a_project_error(data):
    text = _edited(GRAPHS, data)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = Graph.from_json(text)
            validate(graph)
            plan_local(graph)
        graph.to_text()
    except HybridflowError:
        return
