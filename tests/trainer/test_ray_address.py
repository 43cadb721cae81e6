"""``ray_address``: a config field and a ``hybridflow run`` override; it needs ``executor='ray'``."""
from __future__ import annotations

import pytest

from hybridflow import PPOConfig
from hybridflow.errors import ConfigError
from hybridflow.trainer import PPOTrainer
from hybridflow.trainer.config import RUN_CONTROL_FIELDS, config_hash
from hybridflow.trainer.config_files import load_run_config


def test_ray_address_from_the_command_line(tmp_path):
    run_file = tmp_path / "run.yaml"
    run_file.write_text("algorithm: grpo\nexecutor: ray\n")
    _, config = load_run_config(run_file, ["ray_address=auto"])
    assert config.ray_address == "auto" and config.executor == "ray"
    _, config = load_run_config(run_file, ["ray_address=10.0.0.1:6379"])
    assert config.ray_address == "10.0.0.1:6379"
    assert PPOConfig().ray_address is None  # default: a Ray instance of the run's own
    # where the cluster is does not change what is learned: a run may resume on another cluster
    assert "ray_address" in RUN_CONTROL_FIELDS
    assert config_hash(PPOConfig(ray_address="auto")) == config_hash(PPOConfig())


def test_ray_address_without_the_ray_executor_is_an_error(tmp_path):
    trainer = PPOTrainer(config=PPOConfig(ray_address="auto", output_dir=str(tmp_path), max_steps=1,
                                          trackers=("jsonl",), progress_bar=False, calibrate=False))
    with pytest.raises(ConfigError, match="ray_address='auto' is for executor='ray'"):
        trainer.train()
