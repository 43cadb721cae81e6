"""The compiled plan is what runs: config -> compile -> bind -> executor, for every placement form.

Each placement trains three PPO steps on the local executor from the config alone, writes the
plan it ran to plan.json, and gives the same metrics as the others (the same engines do the same
math on different in-process slots). A compiled plan file runs through ``plan=``; another
algorithm's plan, or one that needs more devices than the run has, is a named error.
"""
from __future__ import annotations

import json
import sys

import pytest

from hybridflow.cli import main
from hybridflow.compiler.plan import ExecutionPlan
from hybridflow.errors import BindError, PlanError
from hybridflow.trainer import PPOTrainer

LEARNED = ("critic/score/mean", "actor/pg_loss", "actor/entropy", "critic/vf_loss", "actor/grad_norm")

PLACEMENTS = {
    # name -> config overrides
    "auto": {},
    "colocate": {"placement": "colocate"},
    "split": {"placement": "split", "cpu_slots": 2},  # actor+ref | critic
    "standalone": {"placement": "standalone", "cpu_slots": 3},  # a slot per model role
    "device_map": {"device_map": {"actor": "cpu", "critic": "cpu"}},
    "rollout_pool": {"placement": "actor+critic+ref@1;actor.generate@1", "cpu_slots": 2},
}


def _run(fast_config, tmp_path, name, **overrides):
    settings = dict(max_steps=3, batch_size=4, calibrate=False, output_dir=str(tmp_path / name))
    config = fast_config(**{**settings, **PLACEMENTS.get(name, {}), **overrides})
    trainer = PPOTrainer(config=config)
    return trainer, trainer.train()


def test_every_placement_trains_from_the_config_and_agrees(fast_config, tmp_path):
    _, reference = _run(fast_config, tmp_path, "colocate")
    for name in PLACEMENTS:
        trainer, history = _run(fast_config, tmp_path, name)
        written = ExecutionPlan.from_json((tmp_path / name / "plan.json").read_text())
        assert written == trainer.plan and written.machine.startswith("local: ")
        slots = {p.name: p.slots for p in written.pools}
        if name == "device_map":  # the map's own device names
            assert slots["cpu"] == ("cpu",) and written.strategy == "device_map"
        else:
            assert len([p for p, s in slots.items() if s[0].startswith("n0.")]) == PLACEMENTS[name].get("cpu_slots", 1), name
        for step, (got, want) in enumerate(zip(history, reference), start=1):
            for key in LEARNED:
                assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), (name, step, key)
    assert written.placement("actor").generation_pool == "pool1"  # the rollout_pool run generated on its own pool


def test_a_compiled_plan_file_runs_and_a_wrong_one_is_a_named_error(tmp_path, tiny_model_dir, capsys):
    config = tmp_path / "ppo.yaml"
    config.write_text(f"algorithm: ppo\nactor_model_name: {tiny_model_dir}\nrollout_batch_size: 4\nbatch_size: 4\n"
                      f"max_response_length: 3\nval_samples: 1\nprogress_bar: false\ntrackers: [jsonl]\n"
                      f"num_threads: 1\ncalibrate: false\nmax_steps: 2\n")
    plan = tmp_path / "split.plan.json"
    assert main(["compile", "ppo", "--cluster", "local", "--cpu-slots", "2", "--placement", "split", "--model",
                 f"actor={tiny_model_dir}", "reward=rule", "--prompts", "4", "--prompt-len", "8", "--response-len", "3",
                 "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["run", str(config), f"plan={plan}", "cpu_slots=2", f"output_dir={tmp_path / 'ran'}"]) == 0
    assert "done: 2 steps of ppo" in capsys.readouterr().out
    ran = ExecutionPlan.from_json((tmp_path / "ran" / "plan.json").read_text())
    compiled = ExecutionPlan.from_json(plan.read_text())
    # compiled for --cluster local, the plan is bound to this machine: the run wrote exactly the plan it was given
    assert compiled.machine is not None and ran == compiled
    # the same file on a run with one CPU slot: pool1 has no device
    with pytest.raises(BindError, match=r"pool 'pool1' \(critic\) needs 1 device\(s\) n0.d1; n0.d1 is not on this machine"):
        PPOTrainer(config=_plan_config(config, plan, tmp_path / "one_slot")).train()
    # another algorithm's plan
    grpo = tmp_path / "grpo.plan.json"
    assert main(["compile", "grpo", "--cluster", "local", "--model", f"actor={tiny_model_dir}", "reward=rule",
                 "--prompts", "4", "-o", str(grpo)]) == 0
    with pytest.raises(PlanError, match="runs graph 'grpo', but this config builds 'ppo'"):
        PPOTrainer(config=_plan_config(config, grpo, tmp_path / "other")).train()
    # a plan of the same algorithm with other attributes (the config's kl_coef)
    with pytest.raises(PlanError, match="has a different node"):
        PPOTrainer(config=_plan_config(config, plan, tmp_path / "kl", cpu_slots=2, kl_coef=0.5)).train()
    # a plan file that is not one
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"version": 1, "graph": {}}))
    with pytest.raises(PlanError):
        PPOTrainer(config=_plan_config(config, broken, tmp_path / "broken")).train()
    # a plan file's fault is named before a Ray cluster is started or joined for the run: this address is never
    # tried (joining it would be a ConfigError: nothing answers there); the suite runs this test without Ray started
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
    with pytest.raises(PlanError, match="plan='.*missing.json' cannot be read"):
        PPOTrainer(config=_plan_config(config, tmp_path / "missing.json", tmp_path / "missing", executor="ray",
                                       ray_address="127.0.0.1:9")).train()


def _plan_config(config_path, plan, out, **overrides):
    from hybridflow.trainer.config_files import load_run_config

    _, config = load_run_config(str(config_path), [f"plan={plan}", f"output_dir={out}"]
                                + [f"{k}={v}" for k, v in overrides.items()])
    return config


def test_staleness_on_the_local_executor_is_a_named_error(fast_config, tmp_path):
    from hybridflow.errors import ExecutionError

    with pytest.raises(ExecutionError, match="staleness 1.*cannot run.*executor='ray'"):
        _run(fast_config, tmp_path, "stale", placement="split", staleness=1, allow_uncorrected_staleness=True, cpu_slots=2)


def test_calibrated_plan_predicts_this_machine_and_checks_itself_after_its_first_steps(fast_config, tmp_path, monkeypatch):
    from hybridflow.runtime.calibration import _level_file
    from hybridflow.trainer.calibration_check import CHECK_STEPS, drift_check

    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))  # an empty cache: this run measures
    trainer, history = _run(fast_config, tmp_path, "calibrated", calibrate=True, max_steps=CHECK_STEPS + 1)
    uncalibrated, _ = _run(fast_config, tmp_path, "datasheet")
    assert trainer.plan.predicted_iteration_s != uncalibrated.plan.predicted_iteration_s
    assert all(op.predicted_end_s > op.predicted_start_s for op in trainer.plan.ops if op.kind == "node")
    # the drift check ran once its steps were recorded, on those steps, and the cache follows its verdict
    verdict = trainer.calibration_check
    assert verdict == drift_check(trainer.plan, trainer.executor.recorder.spans, trainer.config.calibrate_drift)
    assert [("perf/measured_over_predicted" in m) for m in history] == [False] * CHECK_STEPS + [True]
    (profile, cached), = trainer.run_spec.profiles
    assert not cached and profile.measured_layers == () and profile.cache_level is not None  # 2 layers: measured whole
    assert _level_file(profile.cache_key, profile.cache_level).is_file() == (not verdict.drifted)
    assert uncalibrated.calibration_check is None


def test_the_rollout_pools_copy_samples_with_the_trained_weights_after_validation(fast_config, tmp_path):
    """A policy generating on a pool of its own samples with a copy of its weights, which the plans' weight syncs
    refresh: after the run (whose last step validated after a sync), what the copy samples scores the same under
    the train engine (a probe plan on the training plan's pools; its own sync first changes nothing)."""
    from run_testkit import sampled_log_prob_gap

    trainer, history = _run(fast_config, tmp_path, "rollout_pool", max_steps=2)
    assert trainer.plan.placement("actor").generation_pool == "pool1"
    assert any(abs(m["actor/pg_loss"]) > 0 for m in history)  # the updates moved the train engine's weights
    assert sampled_log_prob_gap(trainer, trainer.train_rows[:4], n=2, seed=3) < 1e-5
