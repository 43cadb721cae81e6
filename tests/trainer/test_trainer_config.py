"""PPOConfig validation, YAML run files and key=value overrides: every bad input names its field path."""
from __future__ import annotations

import pytest

from hybridflow import PPOConfig
from hybridflow.errors import ConfigError
from hybridflow.trainer.config import config_hash, ops_table_choices
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


def test_lr_schedules_per_role_from_yaml_name_mapping_and_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algorithm: ppo\nactor_lr_schedule: cosine\ncritic_lr_schedule: {name: linear, warmup_ratio: 0.1}\n")
    _, config = load_run_config(path, ["actor_lr_schedule.min_lr_ratio=0.05", "critic_lr_schedule.decay_steps=40"])
    assert (config.actor_lr_schedule.name, config.actor_lr_schedule.min_lr_ratio) == ("cosine", 0.05)
    assert (config.critic_lr_schedule.name, config.critic_lr_schedule.decay_steps) == ("linear", 40)
    # warmup_ratio counts in steps of the schedule's span; decay_steps None spans max_steps
    assert config.critic_lr_schedule.engine_settings(max_steps=100) == {
        "lr_schedule": "linear", "warmup_steps": 4, "total_steps": 40, "min_lr_ratio": 0.0}
    assert config.actor_lr_schedule.engine_settings(max_steps=100)["total_steps"] == 100
    _, default = load_run_config(None, ["actor_lr_schedule.warmup_steps=3"])  # override into the default record
    assert (default.actor_lr_schedule.name, default.actor_lr_schedule.warmup_steps) == ("constant", 3)


@pytest.mark.parametrize("override, message", [
    ("actor_lr_schedule=exponential", "actor_lr_schedule.name"),
    ("actor_lr_schedule.min_lr_ratio=2", "actor_lr_schedule.min_lr_ratio"),
    ("actor_lr_schedule.warmup=3", "actor_lr_schedule.warmup"),
    ("warmup_steps=3", "actor_lr_schedule.warmup_steps"),
])
def test_bad_lr_schedules_name_the_field(override, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_run_config(None, [override])


def test_trainer_steps_the_actor_lr_along_its_schedule(fast_config):
    # cosine from 1e-2 to 0.1 * 1e-2 over 4 steps after 1 warm-up step; each step logs the lr it used:
    # f(0) = 1 (warm-up 1/1), then p = (k - 1) / 3: f = 0.1 + 0.9 * (1 + cos(pi p)) / 2 -> 1, 0.775, 0.325
    from hybridflow.trainer import Trainer

    schedule = {"name": "cosine", "warmup_steps": 1, "min_lr_ratio": 0.1}
    config = fast_config(max_steps=4, actor_lr=1e-2, actor_lr_schedule=schedule)
    history = Trainer(config, algorithm="grpo").train()
    got = [m["actor/lr"] for m in history]
    assert got == pytest.approx([1e-2, 1e-2, 0.775e-2, 0.325e-2], rel=1e-6)


def test_config_accepts_every_kl_estimator_and_aggregation_mode_the_ops_have():
    from hybridflow_ops.kl import KL_TYPES
    from hybridflow_ops.losses.aggregate import LOSS_AGG_MODES

    for field, table in (("kl_type", KL_TYPES), ("loss_agg_mode", LOSS_AGG_MODES)):
        assert ops_table_choices(field) == tuple(table)  # the ops' table is the one list of choices
        for name in table:
            assert getattr(PPOConfig(**{field: name}), field) == name
    config = PPOConfig(kl_type="k3+", loss_agg_mode="token-sum")
    assert (config.kl_type, config.loss_agg_mode) == ("k3+", "token-sum")


@pytest.mark.parametrize("field, bad", [("kl_type", "k4"), ("kl_type", 3), ("loss_agg_mode", "mean")])
def test_a_name_missing_from_the_ops_table_is_a_config_error_listing_the_table(field, bad):
    expected = " or ".join([", ".join(repr(c) for c in ops_table_choices(field)[:-1]),
                            repr(ops_table_choices(field)[-1])])
    with pytest.raises(ConfigError) as err:
        PPOConfig(**{field: bad})
    assert f"{field}: Input should be {expected} (got {bad!r})" in str(err.value)
    with pytest.raises(ConfigError, match=f"PPOConfig.{field}"):
        setattr(PPOConfig(), field, bad)


def test_lora_fields_are_validated_and_become_the_actors_settings():
    assert PPOConfig().lora_settings() is None  # lora_rank 0: a full fine-tune
    config = PPOConfig(lora_rank=8, lora_alpha=16, lora_target_modules="q_proj, v_proj")
    assert config.lora_target_modules == ["q_proj", "v_proj"]
    settings = config.lora_settings()
    assert (settings.rank, settings.alpha, settings.target_modules) == (8, 16.0, ("q_proj", "v_proj"))
    assert PPOConfig(lora_rank=4).lora_settings().target_modules == "all-linear"
    for bad in (dict(lora_rank=-1), dict(lora_alpha=0), dict(lora_target_modules=[]), dict(lora_target_modules="q-proj")):
        with pytest.raises(ConfigError, match="lora_"):
            PPOConfig(**bad)


def test_packing_and_token_budget_reach_the_actor_critic_and_reference(fast_config):
    from hybridflow.trainer import Trainer

    trainer = Trainer(fast_config(pack_sequences=True, max_tokens_per_micro_batch=12, micro_batch_size=2),
                      algorithm="ppo")
    trainer.prepare()  # the plan and the engines, no step
    configs = {role: trainer.describe(role)[0]["train_config"] for role in ("actor", "critic", "ref")}
    for role, config in configs.items():
        assert config.pack_sequences and config.max_tokens_per_micro_batch == 12, role
    assert configs["actor"].micro_batch_size == 2 and configs["ref"].micro_batch_size is None  # as before
    # the cost model prices the train engines' forwards at the real length: mean prompt tokens + the response limit
    from hybridflow.compiler import local_machine
    from hybridflow.trainer.run_spec import derive
    from hybridflow.trainer.setup import run_inputs

    prompts = [len(trainer.tokenizer(row["prompt"])["input_ids"]) for row in trainer.train_rows[:8]]
    options = trainer.run_spec.options
    assert options.real_seq_len == pytest.approx(sum(prompts) / 8 + 3) and options.shared_prompt_min_saved is None
    padded = fast_config(calibrate=False)  # no packing: the padded width
    assert derive(padded, trainer.graph, local_machine(), run_inputs(padded, trainer.output_dir)).options.real_seq_len is None


def test_partial_rollouts_need_a_generation_ahead():
    config = PPOConfig(staleness=1, partial_rollouts="continue", partial_segment_tokens=4)
    assert (config.partial_rollouts, config.partial_segment_tokens) == ("continue", 4)
    assert PPOConfig().partial_rollouts == "finish"
    with pytest.raises(ConfigError, match="partial_rollouts=continue .* needs staleness >= 1"):
        PPOConfig(partial_rollouts="continue")
    with pytest.raises(ConfigError, match="partial_segment_tokens"):
        PPOConfig(staleness=1, partial_rollouts="continue", partial_segment_tokens=0)


def test_staged_weight_sync_needs_staleness_and_ray():
    config = PPOConfig(staleness=2, executor="ray", async_weight_sync="staged")
    assert config.async_weight_sync == "staged" and PPOConfig().async_weight_sync == "collective"
    with pytest.raises(ConfigError, match="async_weight_sync=staged .* needs staleness >= 1"):
        PPOConfig(executor="ray", async_weight_sync="staged")
    with pytest.raises(ConfigError, match=r"async_weight_sync=staged needs .*executor='ray'"):
        PPOConfig(staleness=2, async_weight_sync="staged")
    with pytest.raises(ConfigError, match="async_weight_sync=staged with partial_rollouts=continue"):
        PPOConfig(staleness=1, executor="ray", async_weight_sync="staged", partial_rollouts="continue")
    with pytest.raises(ConfigError, match="async_weight_sync"):
        PPOConfig(staleness=1, executor="ray", async_weight_sync="eager")


def test_the_weight_sync_setting_reaches_the_cost_model(fast_config, tmp_path):
    # the compiler predicts the step (and the placement search chooses the split) with the sync the run does
    from hybridflow.algorithms import grpo_is
    from hybridflow.compiler import local_machine
    from hybridflow.trainer.run_spec import derive
    from hybridflow.trainer.setup import run_inputs

    graph = grpo_is.build(n=2)
    for sync in ("collective", "staged"):
        config = fast_config(staleness=2, executor="ray", async_weight_sync=sync, calibrate=False)
        assert derive(config, graph, local_machine(), run_inputs(config, tmp_path)).options.async_weight_sync == sync
