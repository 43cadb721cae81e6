"""``trainer.set_reward_model`` after the workers exist: a ``set_reward`` plan builds the new source on them."""
from __future__ import annotations


def always_one(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0


def test_a_reward_set_after_start_scores_the_next_steps(fast_config):
    from hybridflow.trainer import Trainer

    trainer = Trainer(fast_config(max_steps=1, save_freq=0, unfinished_score=None), algorithm="grpo")
    trainer.prepare()
    (before,) = trainer.describe("reward")
    assert before["reward_fn"] is not always_one and before["engines"] == {"reward": "RuleRewardSource"}
    trainer.set_reward_model(always_one)
    (after,) = trainer.describe("reward")
    assert after["reward_fn"] is always_one  # built on the reward's worker from the spec the plan carried
    trainer.step = 1
    metrics = trainer.train_step(trainer.loader.next_batch())
    assert metrics["reward/score/mean"] == 1.0 and metrics["reward.score/scores/min"] == 1.0
