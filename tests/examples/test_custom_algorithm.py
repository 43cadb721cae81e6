"""examples/custom_algorithm: a user op and an algorithm using it, under 40 lines, validated and drawn."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from hybridflow.graph import Graph, validate
from hybridflow.viz.graph import draw_graph

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_algorithm" / "median_baseline.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("median_baseline_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_is_under_40_lines():
    assert len(EXAMPLE.read_text().splitlines()) <= 40


def test_example_graph_validates_and_draws(example, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graph = example.median_grpo.build(n=3)
        assert validate(graph) == []
    node = graph.node("median_advantage")
    assert node.attrs.params == (("scale", 1.0),) and node.outputs.get("advantages").dims == ("B*3", "R")
    assert Graph.from_text(graph.to_text()) == graph
    rendered = draw_graph(graph, tmp_path / "median")
    assert "median_advantage" in rendered.dot.read_text()


def test_example_op_by_hand(example):
    # group 0 scores 1, 5, 3 -> median 3 -> -2, 2, 0; group 1 scores 0, 2, 10 -> median 2 -> -2, 0, 8.
    scores = torch.tensor([1.0, 5.0, 3.0, 0.0, 2.0, 10.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    mask = torch.tensor([[1.0, 1.0]] * 5 + [[1.0, 0.0]])
    adv = example.median_advantage(scores, groups, mask, scale=0.5).advantages
    assert torch.equal(adv[:, 0], torch.tensor([-1.0, 1.0, 0.0, -1.0, 0.0, 4.0]))
    assert adv[5, 1] == 0.0


def test_example_runs_as_a_script(tmp_path):
    done = subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "node median_advantage: compute @controller median_advantage(" in done.stdout
    assert (tmp_path / "median_grpo.dot").exists()
