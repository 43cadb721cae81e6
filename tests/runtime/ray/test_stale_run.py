"""One-step-off overlap from a config: ``hybridflow run grpo_arith.yaml placement=split executor=ray staleness=1``.

A real command in a subprocess (its own Ray instance): the compiler gives the rollout a CPU slot
of its own, the trainer sends each step's next prompts along, and the trace shows the generation
of step i+1 running while step i trains.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.e2e
def test_grpo_with_staleness_one_overlaps_generation_from_the_config(tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "hybridflow.cli", "run", str(ROOT / "examples/configs/grpo_arith.yaml"),
               "placement=split", "executor=ray", "staleness=1", "max_steps=5", "cpu_slots=2", "rollout_batch_size=8",
               f"output_dir={out}", "trackers=[jsonl]", "progress_bar=false", "save_freq=0", "val_samples=1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done: 5 steps of grpo" in done.stdout
    plan = json.loads((out / "plan.json").read_text())
    actor = next(p for p in plan["placements"] if p["role"] == "actor")
    assert plan["staleness"] == 1 and actor["generation_pool"] not in (None, actor["pool"])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    staleness = [r["rollout/staleness"] for r in rows if "rollout/staleness" in r]
    assert staleness == [0.0, 1.0, 1.0, 1.0, 1.0]  # step 1's rollout is on-policy, the others one update old
    events = [e for e in json.loads((out / "trace.json").read_text())["traceEvents"] if e["ph"] == "X"]

    def span(op: str, iteration: int, pool: str) -> tuple[float, float]:
        found = [e for e in events if e["name"] == op and e["args"]["iteration"] == iteration and e["args"]["device"] == pool]
        assert found, (op, iteration, pool)
        return found[0]["ts"], found[0]["ts"] + found[0]["dur"]

    for i in range(1, 4):  # the generation for step i+1 started before step i's update ended
        generate, update = span("actor.generate", i + 1, actor["generation_pool"]), span("actor.update", i, actor["pool"])
        assert generate[0] < update[1], (i, generate, update)
