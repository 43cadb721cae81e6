"""``hybridflow compile CONFIG.yaml`` compiles the plan ``hybridflow run CONFIG.yaml`` runs (the README's route).

The example configs are compiled for this machine and run with ``plan=`` (a few small steps: the overrides are
given to both commands, as a user would); the plan the run writes is the file it was given, byte for byte. With
calibration off (the cluster's figures then do not depend on the load of the machine) a run that compiles its own
plan writes the same plan as ``compile``: both derive it through the one run spec.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from hybridflow.cli import main
from hybridflow.compiler import local_machine
from hybridflow.compiler.plan import ExecutionPlan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "configs"
SMALL = {"grpo_arith.yaml": ["rollout_batch_size=4", "n_samples=4"],
         "quickstart.yaml": ["rollout_batch_size=4", "n_samples=4", "batch_size=8"]}
"""Overrides that make each example's steps small (quickstart's batch_size must divide the step's responses)."""
STEPS = ["max_steps=2", "eval_freq=0", "save_freq=0", "log_every=1", "trackers=[jsonl]", "progress_bar=false"]


@pytest.mark.parametrize("name", sorted(SMALL))
def test_a_plan_compiled_from_an_example_config_is_the_plan_its_run_runs(name, tmp_path, capsys):
    config, plan = str(EXAMPLES / name), tmp_path / "plan.json"
    small = [*SMALL[name], f"output_dir={tmp_path / 'run'}"]
    assert main(["compile", config, *small, "--cluster", "local", "-o", str(plan)]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"predicted step time: \d", printed) and f"plan={plan}" in printed
    compiled = ExecutionPlan.from_json(plan.read_text())
    assert compiled.machine == local_machine().describe()  # bound to this machine: runnable as it is
    assert compiled.graph.name == {"grpo_arith.yaml": "grpo", "quickstart.yaml": "ppo"}[name]
    assert not (tmp_path / "run").exists()  # compiling writes nothing into the run's output_dir
    assert main(["run", config, *small, *STEPS, f"plan={plan}"]) == 0
    assert "done: 2 steps" in capsys.readouterr().out
    assert (tmp_path / "run" / "plan.json").read_text() == plan.read_text()


def test_compile_derives_the_plan_the_run_derives(tmp_path, capsys):
    config, plan = str(EXAMPLES / "grpo_arith.yaml"), tmp_path / "plan.json"
    small = [*SMALL["grpo_arith.yaml"], "calibrate=false", "placement=colocate", f"output_dir={tmp_path / 'run'}"]
    assert main(["compile", config, *small, "-o", str(plan)]) == 0  # the config's executor: local
    assert "datasheet figures" in capsys.readouterr().out
    assert main(["run", config, *small, *STEPS]) == 0  # no plan=: the run compiles its own
    assert (tmp_path / "run" / "plan.json").read_text() == plan.read_text()
    # the config's n_samples reaches the graph: 4 responses per prompt, as the run samples them
    generate = next(n for n in ExecutionPlan.from_json(plan.read_text()).graph.nodes if n.kind == "generate")
    assert generate.attrs.n == 4


def test_a_plan_the_runtime_cannot_run_is_refused_at_compile_or_at_bind(tmp_path, capsys):
    config = str(EXAMPLES / "grpo_arith.yaml")
    tensor_parallel = ["calibrate=false", "placement=actor(dp1,tp2,pp1)+ref@2"]
    # for this machine: refused at compile, naming the role and the layout
    assert main(["compile", config, *tensor_parallel, "--cluster", "local", "--cpu-slots", "2",
                 "-o", str(tmp_path / "local.json")]) == 1
    assert "actor training dp1·tp2·pp1 with tensor or pipeline parallelism" in capsys.readouterr().err
    assert not (tmp_path / "local.json").exists()
    # for a cluster preset (a study): written unbound, and refused when a run binds it here
    study = tmp_path / "a100.json"
    assert main(["compile", config, *tensor_parallel, "--cluster", "a100-80g:1", "-o", str(study)]) == 0
    assert ExecutionPlan.from_json(study.read_text()).machine is None
    capsys.readouterr()
    assert main(["run", config, *STEPS, f"plan={study}", f"output_dir={tmp_path / 'run'}"]) == 1
    assert "tensor or pipeline parallelism, which hybridflow's runtime does not run" in capsys.readouterr().err


def test_the_algorithm_forms_flags_are_refused_for_a_config_with_the_field_to_use(tmp_path, capsys):
    config = str(EXAMPLES / "grpo_arith.yaml")
    cases = [(["--model", "actor=llama2-7b"], "--model (the config's actor_model_name"),
             (["--prompts", "8"], "--prompts (rollout_batch_size=...)"),
             (["--set", "n=4"], "--set (n_samples=..., kl_coef=...)"),
             (["--cluster", "a100-80g:1", "--cpu-slots", "2"], "--cpu-slots applies to --cluster local or ray"),
             (["plan=x.json"], "drop it to plan with the config")]
    for extra, message in cases:
        assert main(["compile", config, *extra, "-o", str(tmp_path / "x.json")]) == 1, extra
        assert message in capsys.readouterr().err, extra
    assert main(["compile", "grpo", "n_samples=4", "--model", "actor=llama2-7b", "-o", str(tmp_path / "x.json")]) == 1
    assert "are for a CONFIG.yaml" in capsys.readouterr().err
