"""Mistakes a user makes get errors that name what is wrong and how to fix it."""
from __future__ import annotations

import json

import pytest

from hybridflow.errors import ConfigError, DataError, ModelLoadError, PlacementError
from hybridflow.trainer import PPOTrainer, ReMaxTrainer, Trainer


def test_missing_model_folder(fast_config, tmp_path):
    with pytest.raises(ModelLoadError, match="model folder './no/such/model' does not exist"):
        PPOTrainer(config=fast_config(actor_model_name="./no/such/model")).train()


def test_hub_name_offline_says_the_hub_cannot_be_reached(fast_config, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="hub cannot be reached: offline mode is on"):
        PPOTrainer(config=fast_config(actor_model_name="facebook/opt-125m-not-cached")).train()


def test_dataset_without_a_required_column(fast_config, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"{i}+1=", "ground_truth": str(i + 1), "data_source": "arithmetic"})
                              for i in range(10)))
    with pytest.raises(DataError, match="missing required column 'prompt'; columns found: \\['data_source', 'ground_truth', 'question'\\]"):
        PPOTrainer(config=fast_config(train_files=str(data))).train()


def test_fewer_prompts_than_a_rollout_batch(fast_config, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "ground_truth": "2", "data_source": "arithmetic"}))
    with pytest.raises(DataError, match="has 1 prompts, fewer than rollout_batch_size=8"):
        PPOTrainer(config=fast_config(train_files=str(data))).train()


def test_batch_size_that_does_not_divide_names_the_sizes(fast_config):
    with pytest.raises(ConfigError, match=r"batch_size \(6\) does not divide the 16 responses of a step "
                                          r"\(rollout_batch_size 8 x 2 per prompt for grpo\); use a divisor of 16, e.g. 4"):
        Trainer(fast_config(batch_size=6, n_samples=2), algorithm="grpo").train()
    with pytest.raises(ConfigError, match=r"batch_size \(16\) is larger than the 8 responses"):
        PPOTrainer(config=fast_config(batch_size=16)).train()
    with pytest.raises(ConfigError, match=r"micro_batch_size \(8\) must not exceed batch_size \(4\)"):
        fast_config(batch_size=4, micro_batch_size=8)


def test_device_map_role_the_graph_lacks(fast_config):
    with pytest.raises(PlacementError, match="device_map names 'actor_lora', which is not a role of graph 'ppo'"):
        PPOTrainer(config=fast_config(device_map={"actor_lora": "cpu"})).train()


def test_unknown_algorithm_fails_at_construction(fast_config):
    from hybridflow.errors import GraphError

    with pytest.raises(GraphError, match="unknown algorithm 'dpo'"):
        Trainer(fast_config(), algorithm="dpo")


def test_ignored_graph_fields_are_reported(fast_config, caplog):
    trainer = ReMaxTrainer(config=fast_config(value_clip=0.3))  # ReMax has no critic, so no value clip
    with caplog.at_level("WARNING", logger="hybridflow.trainer"):
        trainer.build_graph()
    assert "remax has no attribute for value_clip; these config fields are ignored" in caplog.text
