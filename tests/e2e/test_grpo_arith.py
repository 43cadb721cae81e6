"""End to end: GRPO learns single-digit addition on this CPU (examples/grpo_arith, shortened).

The model starts from random weights and a format-only warm-up on wrong answers, so its
greedy accuracy starts near 0; the test asserts that RL alone raises it by >= 0.5.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo_arith" / "train.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("grpo_arith_train", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.e2e
def test_grpo_raises_greedy_accuracy_by_half(tmp_path):
    summary = _load_example().main(["--out", str(tmp_path), "--max-time", "240", "--target", "0.7"])
    curve = summary["curve"]
    before, after = curve[0][2], curve[-1][2]
    assert curve[0][0] == 0  # the first point is the validation before any RL step
    assert after >= before + 0.5, f"greedy accuracy {before:.2f} -> {after:.2f}: {curve}"
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged[-1]["val/score/greedy"] == after
