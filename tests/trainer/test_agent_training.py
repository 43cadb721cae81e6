"""A multi-turn algorithm trains through the Trainer: agent metrics per turn, the trajectory log and its
command, and validation that runs the training rollout's environment."""
from __future__ import annotations

import json

import pytest

from hybridflow.algorithms.agent_grpo import agent_grpo
from hybridflow.cli import main as cli
from hybridflow.data import create_tiny_model_dir
from hybridflow.data.datasets import write_prompt_dataset
from hybridflow.data.tasks.agent_calc import make_sum3_rows
from hybridflow.trainer import Trainer


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from hybridflow import PPOConfig

    root = tmp_path_factory.mktemp("agent")
    model = create_tiny_model_dir(root / "model", task="agent_calc", seed=0, hidden=32, layers=1)
    data = write_prompt_dataset(make_sum3_rows(16, seed=0), root / "train.jsonl")
    config = PPOConfig(actor_model_name=str(model), train_files=str(data), output_dir=str(root / "run"), max_steps=2,
                       rollout_batch_size=4, n_samples=2, max_response_length=24, val_samples=1, trackers=("jsonl",),
                       progress_bar=False, num_threads=1, calibrate=False, trajectory_log_samples=3,
                       algorithm_args={"max_turns": 2, "max_tokens_per_turn": 8, "max_total_tokens": 24})
    trainer = Trainer(config, algorithm=agent_grpo)
    return trainer, trainer.train(), root / "run"


def test_steps_report_agent_metrics_per_turn(trained):
    _, history, _ = trained
    assert len(history) == 2
    for metrics in history:
        assert metrics["agent/turn0/reached"] == 1.0
        assert 1.0 <= metrics["agent/num_turns/mean"] <= 2.0
        assert 0.0 <= metrics["agent/tool_error_rate"] <= 1.0


def test_validation_runs_the_same_environment(trained):
    trainer, _, _ = trained
    generates = [n for n in trainer._validation_plan.graph.nodes if n.kind == "generate"]
    assert [n.attrs.env for n in generates] == ["calc", "calc"]
    assert generates[0].attrs.greedy and generates[0].attrs.max_total_tokens == 24


def test_the_trajectory_log_and_its_command(trained, capsys):
    _, _, run = trained
    records = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 1, 1, 2, 2, 2]
    first = records[0]
    assert first["segments"][0]["model"] and first["num_turns"] == sum(s["model"] for s in first["segments"])
    assert cli(["trajectories", str(run), "--step", "-1", "--index", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("step 2  actor.generate  sample 0") and "model> " in out
    assert cli(["trajectories", str(run / "missing.jsonl")]) == 1
