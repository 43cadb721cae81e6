"""Multi-turn rollouts on Ray: the agent loop runs inside each rollout worker, on two data-parallel slots whose
trajectories merge into one rollout (padded to max_total_tokens, so the slots' widths agree)."""
from __future__ import annotations

import json
from collections import Counter

from hybridflow import PPOConfig
from hybridflow.algorithms.agent_grpo import agent_grpo
from hybridflow.data import create_tiny_model_dir
from hybridflow.data.datasets import write_prompt_dataset
from hybridflow.data.tasks.agent_calc import make_sum3_rows
from hybridflow.trainer import Trainer


def test_agent_grpo_trains_on_two_ray_slots(ray_cluster, tmp_path):
    model = create_tiny_model_dir(tmp_path / "model", task="agent_calc", seed=0, hidden=32, layers=1)
    data = write_prompt_dataset(make_sum3_rows(16, seed=0), tmp_path / "train.jsonl")
    config = PPOConfig(actor_model_name=str(model), train_files=str(data), output_dir=str(tmp_path / "run"),
                       max_steps=2, rollout_batch_size=4, n_samples=2, max_response_length=24, val_samples=1,
                       trackers=("jsonl",), progress_bar=False, num_threads=1, calibrate=False, executor="ray",
                       cpu_slots=2, trajectory_log_samples=8,
                       algorithm_args={"max_turns": 2, "max_tokens_per_turn": 8, "max_total_tokens": 24})
    trainer = Trainer(config, algorithm=agent_grpo)
    try:
        history = trainer.train()
    finally:
        trainer.executor.shutdown()
    assert len(history) == 2 and all(m["agent/turn0/reached"] == 1.0 for m in history)
    records = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    # both slots' trajectories are in the merged rollout: 4 prompts x 2 samples per step
    first = [r for r in records if r["step"] == 1]
    assert [r["sample"] for r in first] == list(range(8))
    assert sorted(Counter(r["prompt"] for r in first).values()) == [2, 2, 2, 2]
    assert all(r["segments"] and r["segments"][0]["model"] for r in first)
