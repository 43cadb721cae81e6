"""The plan's environment pool on Ray: environment steps run in the pool's worker processes, not in the rollout
slot's, and the trajectories are the ones an in-process run samples with the same seed."""
from __future__ import annotations

import json
import os

import pytest
import ray

from hybridflow import PPOConfig
from hybridflow.algorithms.agent_grpo import agent_grpo
from hybridflow.data import create_tiny_model_dir
from hybridflow.data.datasets import write_prompt_dataset
from hybridflow.data.tasks.agent_calc import make_sum3_rows
from hybridflow.runtime.engines.agent_loop import InProcessEnvs, env_name
from hybridflow.runtime.ray.env_pool import EnvWorker, RemoteEnvs
from hybridflow.runtime.ray.warm import keeping_workers, parked_count
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
            pids["env"] = set(ray.get([h.ping.remote() for h in ex.env_workers["env"]]))
            pids["plan"] = ex.plan
    finally:
        if executor == "ray" and trainer.executor is not None:
            trainer.executor.shutdown()
    if executor == "ray" and keeping_workers():  # the slots' pools are parked (.warm); the env pool's workers stopped
        assert parked_count() == sum(len(p.devices) for p in pids["plan"].pools if not p.workers)
        for handle in trainer.executor.env_workers["env"]:
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(handle.ping.remote(), timeout=30)
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


def test_remote_environments_answer_and_fail_as_in_process_ones(ray_cluster):
    worker = ray.remote(EnvWorker).options(num_cpus=0.25, max_concurrency=4).remote()
    try:
        remote_host, local_host = RemoteEnvs([worker]), InProcessEnvs()
        row = {"prompt": "1+2+3=", "ground_truth": "6", "data_source": "agent_calc"}
        for spec in (ENV, "calc"):
            remote, local = remote_host.open(spec, 2), local_host.open(spec, 2)
            assert [env_name(e) for e in remote] == [env_name(e) for e in local]
            assert [e.stop_strings for e in remote] == [tuple(e.stop_strings) for e in local]
            for r, l in zip(remote, local):
                assert r.reset(row) == l.reset(row)
            # a malformed call is a tool error the environment turns into an observation, in either process
            for action in ("[1+]", "[1+2]", "6"):
                (r_obs, r_reward, r_done, r_info), (l_obs, l_reward, l_done, l_info) = remote[0].step(action), local[0].step(action)
                assert (r_obs, r_reward, r_done) == (l_obs, l_reward, l_done), action
                assert {k: v for k, v in r_info.items() if k != "pid"} == {k: v for k, v in l_info.items() if k != "pid"}
                assert l_info.get("tool_errors", 0) == (action == "[1+]")
            remote_host.close(remote)
        assert ray.get(worker.ping.remote()) != os.getpid()
        # an environment that raises: the same exception (type and message) as an in-process one
        broken = "tests.runtime.ray.pid_env:BrokenCalcEnv"
        (remote,), (local,) = remote_host.open(broken, 1), local_host.open(broken, 1)
        remote.reset(row), local.reset(row)
        with pytest.raises(ValueError) as from_remote:
            remote.step("[1+2]")
        with pytest.raises(ValueError) as from_local:
            local.step("[1+2]")
        assert str(from_remote.value) == str(from_local.value) == "broken tool on '[1+2]'"
        remote_host.close([remote])
        assert ray.get(worker.ping.remote()) and not ray.get(worker.__ray_call__.remote(lambda w: w.envs))
    finally:
        ray.kill(worker)


def test_an_environment_worker_imports_no_torch():
    """An environment worker's process imports the module of :class:`EnvWorker` (Ray pickles the class by
    reference) and the environment's own: nothing of the model side, so it starts in ~0.3 s of CPU instead of ~2 s
    and without torch's ~200 MB."""
    import subprocess
    import sys

    code = "import sys, hybridflow.runtime.ray.env_pool; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[]"], done.stdout
