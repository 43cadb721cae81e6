"""The algorithms added with dynamic sampling and the newer losses train on the local executor, and compile.

Each runs two steps of its own graph on the tiny arithmetic model: the step's update moves the
actor's weights, the loss metrics are finite, and DAPO reports its dynamic-sampling metrics.
The compiler prices DAPO's resampled nodes at the region's expected rounds and refuses to
overlap them (staleness 1).
"""
from __future__ import annotations

import math

import pytest
import torch

from hybridflow import PPOConfig
from hybridflow.algorithms import ALGORITHMS
from hybridflow.cli import main
from hybridflow.compiler.compile import compile
from hybridflow.compiler.plan import ExecutionPlan, verify_plan
from hybridflow.data import create_tiny_model_dir
from hybridflow.errors import PlanError
from hybridflow.trainer import Trainer

NEW = ("dapo", "gspo", "cispo", "gmpo", "clip_cov", "kl_cov", "opo", "gpg", "passk")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(create_tiny_model_dir(tmp_path_factory.mktemp("new_algos") / "tiny", seed=0))


def _by_parity(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str) % 2)


@pytest.mark.parametrize("name", NEW)
def test_trains_two_steps_locally(name, tiny, tmp_path):
    torch.set_num_threads(1)
    # pass@4 of a group of 4 is 1 whenever one response passes (no signal): it gets groups of 8
    config = PPOConfig(actor_model_name=tiny, output_dir=str(tmp_path), max_steps=2, rollout_batch_size=4,
                       n_samples=8 if name == "passk" else 4,
                       max_response_length=3, actor_lr=2e-3, val_samples=1, trackers=("jsonl",), progress_bar=False,
                       num_threads=1, calibrate=False)
    trainer = Trainer(config, algorithm=name)
    trainer.set_reward_model(_by_parity)  # a signal the random model gets in most groups
    history = trainer.train()
    assert len(history) == 2
    for metrics in history:
        assert math.isfinite(metrics["actor/loss"]) and math.isfinite(metrics["actor/grad_norm"])
    assert any(m["actor/grad_norm"] > 0 for m in history), "no step moved the actor"
    if name == "dapo":
        for m in history:
            assert 1.0 <= m["dynamic_sampling/rounds"] <= 3.0 and 0.0 <= m["dynamic_sampling/dropped_group_frac"] <= 1.0
            assert m["dynamic_sampling/extra_rounds"] == m["dynamic_sampling/rounds"] - 1


@pytest.mark.parametrize("name", NEW)
def test_compiles_with_the_cli(name, tmp_path, capsys):
    out = tmp_path / f"{name}.json"
    assert main(["compile", name, "--cluster", "a100-80g:1", "--model", "qwen2.5-7b", "--placement", "colocate",
                 "-o", str(out)]) == 0
    plan = ExecutionPlan.from_json(out.read_text())
    verify_plan(plan)
    assert plan.graph == ALGORITHMS[name].build()


def test_compiler_prices_resampled_nodes_at_the_expected_rounds():
    def durations(graph):
        plan = compile(graph, "a100-80g:1", "qwen2.5-7b", placement="colocate")
        return {op.name: op.predicted_end_s - op.predicted_start_s for op in plan.ops}

    once = durations(ALGORITHMS["dapo"].build(expected_keep=1.0))   # every group kept: one round
    graph = ALGORITHMS["dapo"].build(expected_keep=0.5, max_rounds=3)
    rounds = graph.resample[0].expected_rounds(1024)  # the default workload's prompts
    assert rounds == pytest.approx(2.4912, abs=1e-3)
    twice = durations(graph)
    for name in ("actor.generate", "reward.score"):
        assert twice[name] == pytest.approx(once[name] * rounds, rel=1e-6)
    assert twice["actor.update"] == pytest.approx(once["actor.update"], rel=1e-6)
    with pytest.raises(PlanError, match="staleness 0"):
        compile(graph, "a100-80g:2", "qwen2.5-7b", placement="split", staleness=1)
