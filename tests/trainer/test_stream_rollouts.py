"""stream_rollouts: a run whose generate op streams trains on the same numbers as one that does not."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest


def test_a_streamed_grpo_run_logs_what_an_unstreamed_one_logs(fast_config, tmp_path):
    from hybridflow.trainer import Trainer

    runs = {}
    for stream in (False, True):
        # keep_products off: the decode's tape (which a streamed decode does not keep) changes the update's numbers
        # in the last bits, and AdamW turns the first step's KL gradient of rounding size into an lr-sized step
        # (tests/trainer/test_decode_tape_runs.py compares a run with the tape to one without)
        config = fast_config(output_dir=str(tmp_path / f"stream{stream}"), stream_rollouts=stream, max_response_length=12,
                             n_samples=4, rollout_batch_size=4, calibrate=False,
                             rollout_engine_options={"keep_products": False})
        runs[stream] = Trainer(config, algorithm="grpo").train()
        plan = json.loads((Path(config.output_dir) / "plan.json").read_text())
        assert [op["name"] for op in plan["ops"] if op.get("stream")] == (["actor.generate"] if stream else [])
    plain, streamed = runs[False], runs[True]
    assert len(plain) == len(streamed) == 2
    for before, after in zip(plain, streamed):
        for key, value in before.items():
            if key.startswith(("timing_s/", "perf/")) or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            assert after[key] == pytest.approx(value, abs=1e-5, rel=1e-5), key
