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
    sampling = next(r["sampling"] for r in trainer.describe("actor") if r["sampling"] is not None)
    assert sampling.seed == stream_seed(5, "rollout") != config.seed
