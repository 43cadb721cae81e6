"""End to end: GRPO learns single-digit addition on this CPU (examples/grpo_arith, as a user runs it).

The model starts from random weights and a format-only warm-up on wrong answers, so its
greedy accuracy starts near 0.1; RL alone must raise it to 0.9. The run has a fixed step
budget (the recipe's 1,000 steps, stopping early at the target), so the outcome does not
depend on how fast the machine is, and it is checked on two seeds the recipe was not tuned
on: it was chosen in sweeps over seeds 0-29 (and measured with tools/bench_learning.py on
seeds 0-4); seeds 40 and 41 were never looked at before they were written here.

Margin, measured on seeds the test does not use (``python tools/bench_learning.py --algo grpo
--seeds 100,...,115``, one thread per run): all 16 reached 0.9, first at step 250-475 (median
400; log-steps mean 5.94, sd 0.18); the recipe sweep gave 200-575 on seeds 0-29. So 0 of 46
seeds missed the 1,000-step budget. A log-normal fit to the 16 new seeds puts a seed past the
budget at z = 5.4 (about 4e-8), so the chance that this test fails on correct code is far below
1% through slowness; a plateau (a seed that never gets there, as seed 1 did before the recipe's
entropy bonus) has not been seen in 46 seeds, which bounds its rate only to under 6.5% per seed
at 95% confidence (rule of three): that bound, not the fit, is the honest ceiling.
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
@pytest.mark.parametrize("seed", [40, 41])
def test_grpo_reaches_ninety_percent_greedy_accuracy(tmp_path, seed):
    summary = _load_example().main(["--out", str(tmp_path), "--seed", str(seed), "--target", "0.9"])
    curve = summary["curve"]
    (first_step, _, before), (last_step, _, after) = curve[0], curve[-1]
    assert first_step == 0 and before <= 0.3  # validated before any RL step: the warm-up taught no sums
    assert after >= 0.9, f"seed {seed}: greedy accuracy {before:.2f} -> {after:.2f} in {last_step} steps: {curve}"
    assert last_step <= 1000
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged[-1]["val/score/greedy"] == after and logged[-1]["step"] == last_step
