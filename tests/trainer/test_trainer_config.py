"""PPOConfig validation, YAML run files and key=value overrides: every bad input names its field path."""
from __future__ import annotations

import pytest

from hybridflow import PPOConfig
from hybridflow.errors import ConfigError
from hybridflow.trainer.config import config_hash
from hybridflow.trainer.config_files import apply_override, load_run_config


def test_seed_article_fields_and_device_map_assignment():
    config = PPOConfig(actor_model_name="a", reward_model_name="r", max_steps=100, batch_size=4, rollout_batch_size=8)
    config.device_map = {"actor": "cuda:0", "actor_lora": "cuda:1", "critic": "CUDA:0", "rm": "cpu"}
    assert config.device_map == {"actor": "cuda:0", "actor_lora": "cuda:1", "critic": "cuda:0", "rm": "cpu"}


def test_invalid_assignment_names_the_field_and_keeps_the_old_value():
    config = PPOConfig()
    with pytest.raises(ConfigError, match=r"device_map\['actor'\] = 'gpu0' is not a device"):
        config.device_map = {"actor": "gpu0"}
    with pytest.raises(ConfigError, match="batch_size.*greater than or equal to 1"):
        config.batch_size = 0
    assert config.device_map == {} and config.batch_size is None


def test_unknown_field_suggests_the_close_one():
    with pytest.raises(ConfigError, match="max_stesp: unknown field; did you mean 'max_steps'"):
        PPOConfig(max_stesp=3)
    with pytest.raises(ConfigError, match="no field 'actor_model'; did you mean 'actor_model_name'"):
        PPOConfig().actor_model = "x"


def test_every_field_has_a_description():
    missing = [name for name, field in PPOConfig.model_fields.items() if not field.description]
    assert missing == []


def test_config_hash_ignores_run_control_fields_only():
    base = PPOConfig(actor_lr=1e-3)
    assert config_hash(base) == config_hash(PPOConfig(actor_lr=1e-3, max_steps=7, output_dir="elsewhere", resume="never"))
    assert config_hash(base) != config_hash(PPOConfig(actor_lr=2e-3))


def test_yaml_file_with_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algorithm: grpo\nmax_steps: 5\nactor_lr: 1.0e-3\ndevice_map: {actor: cpu}\n")
    algorithm, config = load_run_config(path, ["max_steps=7", "actor_lr=3e-4", "device_map.ref=cpu", "trackers=[console]"])
    assert algorithm == "grpo"
    assert (config.max_steps, config.actor_lr, config.trackers) == (7, 3e-4, ("console",))
    assert config.device_map == {"actor": "cpu", "ref": "cpu"}


def test_override_into_a_default_mapping_and_algorithm_override(tmp_path):
    algorithm, config = load_run_config(None, ["device_map.actor=cuda", "algorithm=rloo"])
    assert algorithm == "rloo" and config.device_map == {"actor": "cuda"}


@pytest.mark.parametrize("override, message", [
    ("max_step=3", "override 'max_step=3': unknown config field 'max_step'; did you mean 'max_steps'"),
    ("max_steps=many", r"max_steps: Input should be a valid integer.*'many'"),
    ("actor_lr.x=1", "actor_lr is not a mapping"),
    ("max_steps", "must be written key=value"),
    ("device_map.actor=gpu", r"device_map\['actor'\] = 'gpu' is not a device"),
    ("algorithm=dpo", "unknown algorithm 'dpo'; choose one of ppo, grpo"),
])
def test_bad_overrides_name_the_field(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(None, [override])


def test_bad_yaml_files(tmp_path):
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("rollout_batch: 4\n")
    with pytest.raises(ConfigError, match="unknown.yaml: unknown config field 'rollout_batch'; did you mean 'rollout_batch_size'"):
        load_run_config(unknown)
    broken = tmp_path / "broken.yaml"
    broken.write_text("max_steps: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        load_run_config(broken)
    with pytest.raises(ConfigError, match="does not exist"):
        load_run_config(tmp_path / "missing.yaml")


def test_apply_override_builds_nested_mappings():
    data = {}
    apply_override(data, "device_map.actor=cpu")
    apply_override(data, "reward_model_name=null")
    assert data == {"device_map": {"actor": "cpu"}, "reward_model_name": None}


def test_cli_run_reports_config_errors_without_traceback(tmp_path, capsys):
    from hybridflow.cli import main

    path = tmp_path / "run.yaml"
    path.write_text("max_steps: 2\n")
    assert main(["run", str(path), "rollout_batch_size=zero"]) == 1
    err = capsys.readouterr().err
    assert "hybridflow run: error:" in err and "rollout_batch_size" in err and "Traceback" not in err


def test_example_configs_load():
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "examples" / "configs"
    loaded = {p.name: load_run_config(p) for p in sorted(folder.glob("*.yaml"))}
    assert loaded["quickstart.yaml"][0] == "ppo" and loaded["grpo_arith.yaml"][0] == "grpo"
