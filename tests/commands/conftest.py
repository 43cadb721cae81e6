"""Fixtures of the command tests that need a real run: a tiny model folder and a fast PPOConfig factory (as
tests/trainer's)."""
from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from hybridflow.data import create_tiny_model_dir

    return str(create_tiny_model_dir(tmp_path_factory.mktemp("models") / "tiny", seed=0))


@pytest.fixture
def fast_config(tmp_path, tiny_model_dir):
    """``fast_config(**overrides)``: a PPOConfig for a few quick steps on the tiny arithmetic model."""
    from hybridflow import PPOConfig

    def make(**overrides):
        settings = dict(actor_model_name=tiny_model_dir, output_dir=str(tmp_path / "run"), max_steps=2,
                        rollout_batch_size=8, max_response_length=3, actor_lr=2e-3, critic_lr=1e-3, val_samples=2,
                        trackers=("jsonl",), progress_bar=False, num_threads=1)
        settings.update(overrides)
        return PPOConfig(**settings)

    return make
