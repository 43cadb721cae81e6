"""Validation scores: exact fractions of the validation prompts."""
from __future__ import annotations

import torch


class _NinetyOfAHundred:
    """A reward source scoring 1 for the prompts whose sum is <= 14, whatever the response."""

    def score(self, batch):
        from hybridflow.runtime.engines.rule_reward import RewardOutput

        return RewardOutput(torch.tensor([float(int(t) <= 14) for t in batch["ground_truth"]]), {})


def test_validation_scores_are_exact_fractions(fast_config):
    # 90 of the 100 built-in prompts have a sum <= 14. In float32, 90 / 100 is 0.89999998 < 0.9: a run
    # told to stop at 0.9 would not stop, and a test asserting >= 0.9 would fail at exactly 90 correct.
    from hybridflow.trainer import Trainer

    trainer = Trainer(fast_config(max_steps=1, stop_at_val_score=0.9), algorithm="grpo")
    trainer.set_reward_model(_NinetyOfAHundred())
    trainer.train()
    assert trainer.validations[0]["val/score/greedy"] == 0.9
    assert trainer.target_reached and trainer.step == 1
