"""tools/bench_overhead.py: its hand-written GRPO step must do the same math as hybridflow's step.

From the same weights, prompts and sampling seed, both sides must sample the same responses and
end each step with the same weights (float32 summation order apart), with row skipping on and
off: otherwise the overhead the tool prints compares different work.
"""
from __future__ import annotations

import argparse
import copy
from pathlib import Path

import pytest
import torch
from tool_module import load_file

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_overhead.py"


@pytest.fixture(scope="module")
def bench():
    return load_file(TOOL, "bench_overhead")


@pytest.mark.parametrize("skip_rows", [True, False])
def test_hand_step_matches_our_step(bench, tmp_path, skip_rows):
    from hybridflow.trainer.seeds import stream_seed

    args = argparse.Namespace(seed=0, threads=1, prompts=4, group=4, new_tokens=6, lr=2e-3, no_contracts=False)
    trainer = bench._trainer(args, str(tmp_path), skip_rows)
    ours = trainer.policy_model()  # the actor's weights now (an export plan)
    hand = bench.HandGRPO(copy.deepcopy(ours), trainer.tokenizer, n=4, new_tokens=6, lr=2e-3,
                          seed=stream_seed(0, "rollout"), skip_rows=skip_rows)
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    for _ in range(2):
        rows = trainer.loader.next_batch()
        trainer.step += 1
        metrics = trainer.train_step(rows)
        norm = hand.step(rows)
        assert metrics["response_length/mean"] == pytest.approx(hand.mean_length, abs=1e-6)
        assert metrics["actor/grad_norm"] == pytest.approx(norm, rel=1e-4)
        # Adam's first steps move a weight by ~lr * g / (|g| + eps): where |g| is near eps (1e-8), float-order
        # differences of g show as up to a few % of lr (2e-3); different math would move most weights by ~lr.
        now = trainer.policy_model().state_dict()
        for name, value in hand.model.state_dict().items():
            torch.testing.assert_close(value, now[name], rtol=1e-4, atol=5e-5)
    assert any(not torch.equal(before[k], v) for k, v in trainer.policy_model().state_dict().items()), "the steps must train"
