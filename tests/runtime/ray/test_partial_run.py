"""Partial rollouts from a config on Ray: ``hybridflow run grpo_arith.yaml ... staleness=1 partial_rollouts=continue``.

The command's ``main()``, run in this process: it joins the shared Ray instance of the Ray tests and takes the
slots an earlier module parked (a subprocess would pay ~4 s of imports, a Ray start and fresh slots); the rollout
has a slot of its own (``actor+ref@1;actor.generate@1``). Whether a generation is still running when the step
beside it finishes its update depends on the machine's speed, so the test checks what the interpreter decided, in
event numbers: every generation sent ahead ran in segments of one token, a mid-generation weight sync was sent only
after that step's update was done, the segments after it only once it was in, and the step's metrics agree with
the trace (its tokens' mean lag is 1 without a midway sync, above 0 with one).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridflow.cli import main

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.e2e
def test_grpo_with_partial_rollouts_continues_generations_under_the_updated_weights(ray_cluster, tmp_path, capsys):
    out = tmp_path / "run"
    command = ["run", str(ROOT / "examples/configs/grpo_arith.yaml"),
               "placement=actor+ref@1;actor.generate@1", "executor=ray", "staleness=1",
               "allow_uncorrected_staleness=true",
               "partial_rollouts=continue", "partial_segment_tokens=1", "max_steps=4",
               "rollout_batch_size=8", f"output_dir={out}", "trackers=[jsonl]", "progress_bar=false", "save_freq=0",
               "val_samples=1"]
    assert main(command) == 0
    assert "done: 4 steps of grpo" in capsys.readouterr().out
    plan = json.loads((out / "plan.json").read_text())
    actor = next(p for p in plan["placements"] if p["role"] == "actor")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/staleness" in r]
    assert len(steps) == 4 and steps[0]["rollout/staleness"] == 0.0
    assert "actor.generate/segments" not in steps[0]  # step 1's rollout: generated on-policy, whole
    events = [e["args"] for e in json.loads((out / "trace.json").read_text())["traceEvents"] if e["ph"] == "X"]

    def records(prefix: str, iteration: int, pool: str) -> list[dict]:
        found = [e for e in events if e["op"].split("#")[0] == prefix and e["iteration"] == iteration and e["device"] == pool]
        return sorted(found, key=lambda e: e["sent"])

    for i in range(3):  # the generation of iteration i + 1 ran beside step i
        (update,) = records("actor.update", i, actor["pool"])
        segments = records("actor.generate", i + 1, actor["generation_pool"])
        syncs = records("actor.weight_sync", i + 1, actor["pool"])
        assert [e["op"] for e in segments] == ["actor.generate", "actor.generate#2", "actor.generate#3"]  # 3 tokens
        assert all(a["done"] < b["sent"] for a, b in zip(segments, segments[1:]))  # one segment after the other
        assert syncs[0]["op"] == "actor.weight_sync" and syncs[0]["sent"] < update["sent"]
        midway = syncs[1:]
        assert len(midway) == steps[i + 1]["actor.generate/midway_syncs"] <= 1
        assert steps[i + 1]["actor.generate/segments"] == 3.0
        for sync in midway:
            assert sync["sent"] > update["done"], (i, sync, update)
            after = [e for e in segments if e["sent"] > sync["sent"]]
            assert after and all(e["sent"] > sync["done"] for e in after), (i, sync, segments)
        # the tokens' mean lag: 1 without a midway sync; with one, 1 for the tokens sampled before it (the first
        # segment's at least) and 0 for those after it (none when every row ended before the sync)
        staleness = steps[i + 1]["rollout/staleness"]
        assert (0.0 < staleness <= 1.0) if midway else staleness == 1.0, (i, staleness, len(midway))
