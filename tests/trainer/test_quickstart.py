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


@pytest.mark.e2e
@pytest.mark.parametrize("seed", [7, 8])
def test_full_quickstart_raises_greedy_accuracy_by_half(tmp_path, seed):
    # The quickstart as a user runs it, on two seeds the recipe was not tuned on (0-4), with its
    # step count fixed (--time-budget 0) so that the outcome does not depend on the machine's speed,
    # stopping at the validation that first reaches 0.6 (the runs start near 0.08).
    done = subprocess.run([sys.executable, "-m", "hybridflow.cli", "quickstart", "--out", str(tmp_path / "qs"),
                           "--seed", str(seed), "--time-budget", "0", "--target", "0.6"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    before, after, step = re.search(r"val/score/greedy\s+(\S+) at step 0\s+->\s+(\S+) at step (\d+)",
                                    done.stdout).groups()
    assert int(step) <= 400  # within the quickstart's steps
    assert float(after) >= float(before) + 0.5, done.stdout[-2000:]
