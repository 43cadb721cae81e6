"""Faults: a worker SIGKILLed mid-step is a named error, and a restarted group continues from a checkpoint.

PPO colocated on two ranks (FSDP2 everywhere): the reward function on rank 1 kills its own process
while scoring the marked sample. Rank 0 carries on into the next collective op of its queue
(ref.logprob gathers shards with the dead rank), where the collective timeout keeps it from waiting
forever; the executor does not wait for it: the dead rank's failure is reported at once, as a
WorkerLostError naming the pool, the rank and the roles (the dead rank's, not the model pool that a
collective timeout would have named: which one the message names is what shows it did not wait). ``restart()`` builds a fresh worker group;
loading the state checkpointed after step 1 into it (the checkpoint and restore plans) and replaying step 2 gives
step 2's metrics again (greedy sampling: the rollout draws no random numbers).
"""
from __future__ import annotations

import pytest
from ray_testkit import kill_on_marker, marked_prompts, placement_plan, prompts, role_specs

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler.control import control_plan
from hybridflow.errors import WorkerLostError
from hybridflow.runtime.engines import SamplingParams
from hybridflow.runtime.ray import RayExecutor
from hybridflow.trainer.run_state import role_sections, state_sections

TRAINED = ("actor", "critic")


def _learned(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith(("timing_s/", "perf/", "weight_sync/"))}


@pytest.mark.e2e
def test_killed_worker_is_named_and_a_restarted_group_continues_from_a_checkpoint(ray_cluster, tmp_path):
    graph = ALGORITHMS["ppo"].build()
    specs = role_specs(graph, reward=kill_on_marker)
    specs["actor"].sampling = SamplingParams(max_new_tokens=3, greedy=True)
    plan = placement_plan(graph, "colocate")
    save, load = control_plan(plan, "save_state", TRAINED), control_plan(plan, "load_state", TRAINED)
    ops = {op.name: op.role for op in save.ops if op.kind == "save_state"}
    with RayExecutor(plan, specs, collective_timeout_s=20) as executor:
        executor.run_iteration({"prompts": prompts(0)})
        results = executor.run_plan(save, args={name: str(tmp_path) for name in ops}).results
        checkpoint, _ = state_sections(ops, {name: results[name] for name in ops})
        step2 = _learned(executor.run_iteration({"prompts": prompts(1)}).metrics)

        with pytest.raises(WorkerLostError) as caught:  # Ray reports the dead process: no collective waits out its timeout
            executor.run_iteration({"prompts": marked_prompts()})
        message = str(caught.value)
        # the reward function runs on a host pool of its own: its process died, the model pool's did not
        assert message.startswith("op 'reward.score'") and "pool 'host' rank 0 (roles reward" in message
        assert "pool 'pool0'" not in message

        executor.restart()
        executor.run_plan(load, args={op.name: {"folder": str(tmp_path), **role_sections(checkpoint, op.role)}
                                      for op in load.ops if op.kind == "load_state"})
        replay = _learned(executor.run_iteration({"prompts": prompts(1)}).metrics)
    assert replay.keys() == step2.keys()
    for key in step2:
        assert replay[key] == pytest.approx(step2[key], rel=1e-5, abs=1e-7), key
