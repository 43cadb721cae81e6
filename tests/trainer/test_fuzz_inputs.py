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
from json_edits import edit

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler import compile_for
from hybridflow.compiler.passes import BatchShape
from hybridflow.compiler.plan import read_plan
from hybridflow.errors import HybridflowError
from hybridflow.graph import Graph, validate

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
GRAPHS = {name: json.loads(algorithm.build().to_json()) for name, algorithm in sorted(ALGORITHMS.items())}
SMALL = BatchShape(prompts=4, prompt_len=8, response_len=4)
PLANS = {name: json.loads(compile_for(algorithm.build(), "qwen2.5-0.5b", batch=SMALL)
                          .to_json()) for name, algorithm in sorted(ALGORITHMS.items())}

def _edited(docs: dict, data) -> str:
    doc = json.loads(json.dumps(docs[data.draw(st.sampled_from(sorted(docs)))]))
    for _ in range(data.draw(st.integers(1, 3))):
        edit(doc, data, ("B*2", "float32", "cuda:0", "cpu", "", "controller"))
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
            compile_for(graph, "qwen2.5-0.5b", batch=SMALL)
        graph.to_text()
    except HybridflowError:
        return
