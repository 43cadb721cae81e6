"""One-step-off overlap from a config: ``hybridflow run grpo_arith.yaml executor=ray staleness=1``.

The command's ``main()``, run in this process: it joins the shared Ray instance of the Ray tests and takes the
slots an earlier module parked (a subprocess would pay ~4 s of imports, a Ray start and fresh slots). The
rollout has a slot of its own (``actor+ref@1;actor.generate@1``), the trainer sends each step's next prompts
along, and the trace records (in the order the interpreter issued its ops, not in times, which depend on the
machine's speed) that the generation of step i+1 is sent while step i trains.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridflow.cli import main
from hybridflow.compiler.plan import read_plan

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.e2e
def test_grpo_with_staleness_one_overlaps_generation_from_the_config(ray_cluster, tmp_path, capsys):
    out = tmp_path / "run"
    command = ["run", str(ROOT / "examples/configs/grpo_arith.yaml"),
               "placement=actor+ref@1;actor.generate@1", "executor=ray", "staleness=1",
               "allow_uncorrected_staleness=true", "max_steps=5", "rollout_batch_size=8",
               f"output_dir={out}", "trackers=[jsonl]", "progress_bar=false", "save_freq=0", "val_samples=1"]
    assert main(command) == 0
    assert "done: 5 steps of grpo" in capsys.readouterr().out
    plan = json.loads((out / "plan.json").read_text())
    actor = next(p for p in plan["placements"] if p["role"] == "actor")
    assert plan["staleness"] == 1 and actor["generation_pool"] not in (None, actor["pool"])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    staleness = [r["rollout/staleness"] for r in rows if "rollout/staleness" in r]
    assert staleness == [0.0, 1.0, 1.0, 1.0, 1.0]  # step 1's rollout is on-policy, the others one update old
    # What the compiler decided: the generation ops work one iteration ahead, and nothing the actor's update
    # produces is on their way (no path in the plan's deps from the update to the generation).
    ops = {op["name"]: op for op in plan["ops"]}
    ahead = {name for name, op in ops.items() if op.get("iteration_offset", 0) == 1}
    assert ahead == {"actor.weight_sync", "actor.generate"}, ahead
    assert "actor.update" not in read_plan((out / "plan.json").read_text()).upstream("actor.generate")
    # What the interpreter did, in the order it issued and collected ops (event numbers, not times):
    # during the call that trains step i, it queued step i+1's weight sync on the train pool ahead of step
    # i's update, and sent step i+1's generation before that call returned.
    events = [e["args"] for e in json.loads((out / "trace.json").read_text())["traceEvents"] if e["ph"] == "X"]

    def op_record(op: str, iteration: int, pool: str) -> dict:
        found = [e for e in events if e["op"] == op and e["iteration"] == iteration and e["device"] == pool]
        assert len(found) == 1, (op, iteration, pool, found)
        return found[0]

    for i in range(4):  # iterations are numbered from 0; the run validates at the end (iteration 5), beside them
        update = op_record("actor.update", i, actor["pool"])
        sync = op_record("actor.weight_sync", i + 1, actor["pool"])
        generate = op_record("actor.generate", i + 1, actor["generation_pool"])
        assert sync["call"] == generate["call"] == update["call"], (i, sync, generate, update)
        assert sync["sent"] < update["sent"], (i, sync, update)
        assert sync["done"] < generate["sent"], (i, sync, generate)
