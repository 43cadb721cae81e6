"""Graph drawings: every node and role appears, shape by kind, colour by role, edges labelled with fields."""
from __future__ import annotations

import re
import shutil

from hybridflow.algorithms import ALGORITHMS
from hybridflow.graph import CONTROLLER
from hybridflow.graph import edge_lags
from hybridflow.viz.graph import KIND_SHAPES, LAG_COLOUR, ROLE_COLOURS, draw_graph, graph_to_dot


def _node_line(source: str, name: str) -> str:
    return next(line for line in source.splitlines() if line.strip().startswith((f'"{name}" [', f"{name} [")))


def test_dot_shapes_colours_and_edge_labels():
    graph = ALGORITHMS["ppo"].build()
    source = graph_to_dot(graph).source
    for node in graph.nodes:
        line = _node_line(source, node.name)
        assert f"shape={KIND_SHAPES[node.kind]['shape']}" in line
        assert f'fillcolor="{ROLE_COLOURS[node.role]}"' in line
    assert "box3d" in _node_line(source, "actor.generate") and "doubleoctagon" in _node_line(source, "critic.update")
    assert re.search(r'"reward.score" -> kl_in_reward \[label=scores\]', source)
    assert re.search(r'"critic.values" -> gae \[label=values\]', source)
    assert "ppo_clip" in _node_line(source, "actor.update") and "gamma=1, lam=0.95" in _node_line(source, "gae")
    assert "cluster_legend" in source and f"legend.role.{CONTROLLER}" in source


def test_renamed_fields_show_both_names():
    source = graph_to_dot(ALGORITHMS["safe_rlhf"].build()).source
    assert "advantages → cost_advantages" in source and "costs → scores" in source


def test_lagged_edges_are_dashed_and_labelled_with_their_lag():
    graph = ALGORITHMS["grpo_is"].build()
    source = graph_to_dot(graph, edge_lags(graph, 1)).source
    lagged = re.search(r'"actor.generate" -> truncated_is_weight \[(.*?)\]', source, re.S).group(1)
    assert "\nlag=1" in lagged and "style=dashed" in lagged and LAG_COLOUR in lagged
    assert re.search(r'grpo_advantage -> "actor.update" \[label="advantages\nlag=1" ', source)
    fresh = re.search(r'"actor.logprob" -> truncated_is_weight \[(.*?)\]', source, re.S).group(1)
    assert "lag=" not in fresh and "dashed" not in fresh  # recomputed on the trained weights: lag 0
    on_policy = graph_to_dot(graph, edge_lags(graph, 0)).source
    assert "lag=" not in on_policy and on_policy == graph_to_dot(graph).source


def test_grpo_shows_n_and_the_loss_terms():
    source = graph_to_dot(ALGORITHMS["grpo"].build(n=4)).source
    assert "n=4" in _node_line(source, "actor.generate")
    assert "ppo_clip + 0.001·kl_loss" in _node_line(source, "actor.update")


def test_draw_writes_dot_and_svg(tmp_path):
    graph = ALGORITHMS["grpo"].build()
    rendered = draw_graph(graph, tmp_path / "out" / "grpo")
    assert rendered.dot == tmp_path / "out" / "grpo.dot" and rendered.dot.read_text().startswith("digraph grpo")
    if shutil.which("dot"):
        svg = rendered.svg.read_text()
        assert svg.lstrip().startswith("<?xml") and "<svg" in svg
        for name in [n.name for n in graph.nodes] + [r.name for r in graph.roles]:
            assert name in svg
    else:
        assert rendered.svg is None and "apt-get install graphviz" in rendered.message


def test_without_the_dot_program_writes_dot_and_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    rendered = draw_graph(ALGORITHMS["rloo"].build(), tmp_path / "rloo")
    assert rendered.dot.exists() and rendered.svg is None and not (tmp_path / "rloo.svg").exists()
    for how in ("apt-get install graphviz", "brew install graphviz", "conda install graphviz", "dot -Tsvg"):
        assert how in rendered.message
