"""The rollout sampler never replays the stream the run's seed gave the model's initialisation."""
from __future__ import annotations

import torch

from hybridflow.trainer.seeds import stream_seed


def test_streams_are_reproducible_distinct_and_unlike_the_run_seed():
    seeds = {stream_seed(s, name) for s in range(50) for name in ("rollout", "shuffle")}
    assert len(seeds) == 100 and all(0 <= s < 2**63 for s in seeds)
    assert stream_seed(3, "rollout") == stream_seed(3, "rollout")
    for seed in range(20):
        torch.manual_seed(seed)  # what the tiny model's initialisation draws from
        init_stream = torch.rand(16)
        rollout_stream = torch.rand(16, generator=torch.Generator().manual_seed(stream_seed(seed, "rollout")))
        assert not torch.equal(init_stream, rollout_stream)


def test_the_trainer_samples_rollouts_from_their_own_stream(fast_config):
    from hybridflow.trainer import Trainer

    config = fast_config(seed=5, max_steps=1)
    trainer = Trainer(config, algorithm="grpo")
    trainer.train()
    sampling = trainer.actor_engines().rollout.sampling
    assert sampling.seed == stream_seed(5, "rollout") != config.seed


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
