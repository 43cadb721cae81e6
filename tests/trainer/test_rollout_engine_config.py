"""``rollout_engine`` / ``rollout_engine_options`` in the config: checked when the config is made, recorded in the plan."""
from __future__ import annotations

import pytest

from hybridflow import PPOConfig
from hybridflow.algorithms import GRPOTrainer
from hybridflow.errors import ConfigError, PlanError


def test_engine_names_and_options_are_checked_at_config_time():
    with pytest.raises(ConfigError, match="rollout_engine"):
        PPOConfig(rollout_engine="sglang")
    with pytest.raises(ConfigError, match="max_model_length.*max_model_len"):
        PPOConfig(rollout_engine="vllm", rollout_engine_options={"max_model_length": 64})
    with pytest.raises(ConfigError, match="micro_batch_size"):
        PPOConfig(rollout_engine_options={"micro_batch_size": 0})
    assert PPOConfig(rollout_engine="vllm", rollout_engine_options={"kv_cache_gib": 2}).rollout_engine == "vllm"


def test_the_plan_records_the_engine_and_a_plan_file_must_agree(fast_config, tmp_path):
    trainer = GRPOTrainer(config=fast_config(max_steps=1, n_samples=2, rollout_batch_size=4))
    trainer.train()
    assert trainer.plan.placement("actor").rollout_engine == "hf"
    plan_file = tmp_path / "run" / "plan.json"
    clash = fast_config(max_steps=1, n_samples=2, rollout_batch_size=4, plan=str(plan_file), rollout_engine="vllm",
                        output_dir=str(tmp_path / "other"))
    with pytest.raises(PlanError, match="rollout engine hf.*'vllm'"):
        GRPOTrainer(config=clash).train()
