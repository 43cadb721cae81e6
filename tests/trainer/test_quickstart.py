"""`hybridflow quickstart`: a short run prints progress and a summary, and leaves every file it names."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from hybridflow.cli import main


def test_short_quickstart_summary_names_files_that_exist(tmp_path, capsys):
    out = tmp_path / "qs"
    assert main(["quickstart", "--out", str(out), "--steps", "2", "--threads", "1"]) == 0
    text = capsys.readouterr().out
    assert "PPOTrainer(config=config).train()" in text
    assert re.search(r"val/score/greedy\s+\d\.\d{3} at step 0\s+->\s+\d\.\d{3} at step 2", text)
    assert "greedy answers after training: 2+3=" in text
    for name in ("metrics.jsonl", "plan.json", "trace.json", "checkpoints/step_00000002/trainer_state.json"):
        assert (out / name).is_file(), name
    assert (out / "ppo_graph.svg").is_file() or (out / "ppo_graph.dot").is_file()
    assert f"checkpoint: {out / 'checkpoints' / 'step_00000002'}" in text
    trace = json.loads((out / "trace.json").read_text())
    assert {"actor.generate", "critic.update"} <= {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"} or \
        any("generate" in e["name"] for e in trace["traceEvents"])
    assert main(["quickstart", "--out", str(out), "--steps", "1", "--threads", "1"]) == 0  # a rerun starts fresh
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000001"]


SEEDS = (7, 8)


@pytest.mark.e2e
def test_full_quickstart_raises_greedy_accuracy(tmp_path):
    """The quickstart as a user runs it, on two seeds the recipe was not tuned on (0-4), with its step count
    fixed (--time-budget 0) so that the outcome does not depend on the machine's speed, each stopping at the
    validation that first reaches 0.6 (the runs start near 0.05), or at its 400th step.

    Margin, measured on 14 seeds the test does not use (``python tools/bench_learning.py --algo ppo
    --ppo-time-budget 0 --seeds 100,...,113``: the quickstart's 400 steps, one thread): 12 reached 0.6,
    at steps 80-320 (a gain of 0.52-0.67 at that validation); two learned slowly and stood at +0.20 and
    +0.41 at step 400 (seed 105, 0.25 at the end, reached 0.61 at step 380 of a 1,000-step run; seed 106
    of such a run ended at 0.41). So the recipe does not raise every seed by half within 400 steps, and a
    per-seed check of +0.5 on two seeds would fail on about one float-order change in four. The test asks
    for a mean gain over its two seeds of at least 0.3: resampling the 14 seeds' gains two at a time, the
    mean fell under 0.3 in 0.5% of 400,000 draws.
    """
    procs = {seed: subprocess.Popen([sys.executable, "-m", "hybridflow.cli", "quickstart", "--out", str(tmp_path / f"qs{seed}"),
                                     "--seed", str(seed), "--time-budget", "0", "--target", "0.6"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for seed in SEEDS}  # side by side: each is one torch thread
    gains, report = [], []
    for seed, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-3000:]
        before, after, step = re.search(r"val/score/greedy\s+(\S+) at step 0\s+->\s+(\S+) at step (\d+)", stdout).groups()
        assert int(step) <= 400  # within the quickstart's steps
        gains.append(float(after) - float(before))
        report.append(f"seed {seed}: {before} -> {after} at step {step}")
    assert sum(gains) / len(gains) >= 0.3, report
