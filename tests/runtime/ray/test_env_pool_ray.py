"""The plan's environment pool on Ray: environment steps run in the pool's worker processes, not in the rollout
slot's, and the trajectories are the ones an in-process run samples with the same seed."""
from __future__ import annotations

import json
import os

import ray

from hybridflow import PPOConfig
from hybridflow.algorithms.agent_grpo import agent_grpo
from hybridflow.data import create_tiny_model_dir
from hybridflow.data.datasets import write_prompt_dataset
from hybridflow.data.tasks.agent_calc import make_sum3_rows
from hybridflow.trainer import Trainer

ENV = "tests.runtime.ray.pid_env:PidCalcEnv"


def _run(tmp_path, model, data, executor: str):
    config = PPOConfig(actor_model_name=str(model), train_files=str(data), output_dir=str(tmp_path / executor),
                       max_steps=1, rollout_batch_size=2, n_samples=2, max_response_length=24, val_samples=1,
                       trackers=("jsonl",), progress_bar=False, num_threads=1, calibrate=False, executor=executor,
                       cpu_slots=1, trajectory_log_samples=4, seed=0,
                       algorithm_args={"env": ENV, "max_turns": 2, "max_tokens_per_turn": 8, "max_total_tokens": 24})
    trainer = Trainer(config, algorithm=agent_grpo)
    try:
        trainer.train()
        pids = {}
        if executor == "ray":
            ex = trainer.executor
            pids["slots"] = {info["pid"] for info in ex.slot_info.values()}
            pids["env"] = set(ray.get([h.ping.remote() for name, h in ex._actors.items() if "/env" in name]))
            pids["plan"] = ex.plan
    finally:
        if executor == "ray":
            trainer.executor.shutdown()
    records = [json.loads(line) for line in (tmp_path / executor / "trajectories.jsonl").read_text().splitlines()]
    return records, pids


def test_env_steps_run_in_the_env_pool_and_match_a_local_run(ray_cluster, tmp_path):
    model = create_tiny_model_dir(tmp_path / "model", task="agent_calc", seed=0, hidden=32, layers=1)
    data = write_prompt_dataset(make_sum3_rows(8, seed=0), tmp_path / "train.jsonl")
    local, _ = _run(tmp_path, model, data, "local")
    remote, pids = _run(tmp_path, model, data, "ray")

    plan = pids["plan"]
    assert plan.pool("env").workers == 2 and plan.placement("actor").env_pool == "env"
    # every step ran in one of the env pool's two worker processes: not the rollout slot's, not this one
    step_pids = {s["pid"] for r in remote for s in r["steps"]}
    assert step_pids and step_pids <= pids["env"], (step_pids, pids)
    assert not step_pids & pids["slots"] and os.getpid() not in step_pids
    assert len(pids["env"]) == 2
    # locally the steps ran in this process (the rollout's thread pool)
    assert {s["pid"] for r in local for s in r["steps"]} == {os.getpid()}
    # the same trajectories: token ids, which tokens the model sampled (the mask), and the environment's answers
    assert len(remote) == len(local) == 4
    for a, b in zip(local, remote):
        assert [(s["model"], s["ids"]) for s in a["segments"]] == [(s["model"], s["ids"]) for s in b["segments"]]
        assert [{k: v for k, v in s.items() if k != "pid"} for s in a["steps"]] == \
               [{k: v for k, v in s.items() if k != "pid"} for s in b["steps"]]
