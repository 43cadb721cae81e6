"""JSON and text forms round-trip exactly; malformed input is a GraphError; the networkx view."""
from __future__ import annotations

import json

import pytest
from tiny_ops import tiny

from hybridflow.errors import GraphError
from hybridflow.graph import Graph, GraphInput, Input, Node, Schema, GenerateAttrs


@pytest.fixture(scope="module")
def graph() -> Graph:
    return tiny.build(scale=0.25)


def test_json_round_trip_is_exact(graph):
    back = Graph.from_json(graph.to_json())
    assert back == graph and back.nodes[0].attrs == graph.nodes[0].attrs
    assert Graph.from_json(graph.to_json(indent=None)) == graph


def test_text_round_trip_is_exact(graph):
    text = graph.to_text()
    assert Graph.from_text(text) == graph
    assert text.startswith("graph tiny\n") and "node t_adv: compute @controller t_adv(scores=reward.score.scores" in text


def test_text_form_ignores_comments_and_blank_lines(graph):
    text = "# a comment\n\n" + graph.to_text().replace("\nrole ", "\n\n# roles\nrole ", 1)
    assert Graph.from_text(text) == graph


def test_json_form_is_documented_shape(graph):
    data = json.loads(graph.to_json())
    assert data["format"] == "hybridflow.graph" and data["version"] == 1
    assert data["inputs"] == [{"name": "prompts", "fields": ["prompt_ids: int64[B, P]", "prompt_mask: int64[B, P]"]}]
    node = next(n for n in data["nodes"] if n["name"] == "actor.update")
    assert node["attrs"]["terms"][1] == {"op": "t_kl", "weight": 0.1, "params": {}}


def test_odd_but_legal_values_round_trip():
    graph = Graph(
        name="odd-name.v2",
        roles=(),
        inputs=(GraphInput("prompts", Schema.of("prompt_ids: int64[B, P]", "flag: bool")),),
        nodes=(),
        attrs=(("note", 'quotes " and \\n newline\n, commas (and parens)'), ("none", None), ("big", 10**20), ("tiny", 1e-300)),
    )
    assert Graph.from_json(graph.to_json()) == graph
    assert Graph.from_text(graph.to_text()) == graph


@pytest.mark.parametrize("text", [
    "", "not json", "[]", "{}", '{"format": "hybridflow.graph"}',
    '{"format": "other", "version": 1, "name": "g", "attrs": {}, "roles": [], "inputs": [], "nodes": []}',
    '{"format": "hybridflow.graph", "version": 1, "name": "g", "attrs": [], "roles": [], "inputs": [], "nodes": []}',
    '{"format": "hybridflow.graph", "version": 1, "name": "g", "attrs": {}, "roles": [{"name": "a"}], "inputs": [], "nodes": []}',
    '{"format": "hybridflow.graph", "version": 1, "name": "g", "attrs": {}, "roles": [], "inputs": [], "nodes": [{"name": "x"}]}',
    '{"format": "hybridflow.graph", "version": 1, "name": "g", "attrs": {"x": [1]}, "roles": [], "inputs": [], "nodes": []}',
    '{"format": "hybridflow.graph", "version": 1, "name": ["g"], "attrs": {}, "roles": [], "inputs": [], "nodes": []}',
])
def test_malformed_json_is_a_graph_error(text):
    with pytest.raises(GraphError):
        Graph.from_json(text)


def test_malformed_node_json_names_the_node(graph):
    data = json.loads(graph.to_json())
    data["nodes"][0]["attrs"]["n"] = "eight"
    with pytest.raises(GraphError, match="n must be a positive int"):
        Graph.from_json(json.dumps(data))
    data["nodes"][0]["attrs"] = {"n": 1, "beam": 4}
    with pytest.raises(GraphError, match="node 'actor.generate'.*beam"):
        Graph.from_json(json.dumps(data))


@pytest.mark.parametrize("text", [
    "", "graph", "node x", "graph g\nbogus line", "graph g\nrole a: wizard, trainable",
    "graph g\nattr x = [1]", "graph g\nattr x = 1\nattr x = 2", "graph g\nattr x = {bad",
    "graph g\n    -> ()", "graph g\nnode a: compute @controller op() {}",
    "graph g\nnode a: compute @controller op(x=y) {}\n    -> ()",
    "graph g\ninput p (a: int64[B], a: int64[B])",
])
def test_malformed_text_is_a_graph_error(text):
    with pytest.raises(GraphError):
        Graph.from_text(text)


def test_edits_make_new_objects(graph):
    edited = graph.with_attrs(scale=2.0)
    assert edited.attr("scale") == 2.0 and graph.attr("scale") == 0.25
    with pytest.raises(AttributeError):
        graph.name = "other"  # frozen dataclass: FrozenInstanceError is an AttributeError
    with pytest.raises(GraphError, match="no node"):
        graph.node("missing")


def test_networkx_view(graph):
    view = graph.to_networkx()
    assert set(view.nodes) == {"prompts"} | {n.name for n in graph.nodes}
    assert view.nodes["prompts"]["kind"] == "input" and view.nodes["t_adv"]["role"] == "controller"
    assert view.edges["reward.score", "t_adv"]["fields"] == (("scores", "scores"),)
    assert set(view.predecessors("actor.update")) == {"actor.generate", "actor.logprob", "ref.logprob", "t_adv"}


def test_networkx_view_keeps_missing_producers():
    node = Node("a", "generate", "actor", "generate", (Input("prompt_ids", "ghost", "x"),), Schema(), GenerateAttrs())
    view = Graph("g", (), (), (node,)).to_networkx()
    assert view.nodes["ghost"]["kind"] == "missing"
