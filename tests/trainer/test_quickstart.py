"""`hybridflow quickstart`: a short run prints progress and a summary, and leaves every file it names."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time

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
def test_full_quickstart_within_three_minutes(tmp_path):
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hybridflow.cli", "quickstart", "--out", str(tmp_path / "qs")],
                          capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-3000:]
    before, after = map(float, re.search(r"val/score/greedy\s+(\S+) at step 0\s+->\s+(\S+) at step", done.stdout).groups())
    assert after >= before
    assert wall < 180, f"quickstart took {wall:.0f} s"
