"""Warm workers (hybridflow.runtime.ray.warm): an executor that ends healthy parks its slots, the next executor
takes those of its slots' shapes (on this one-node cluster slot by slot, whatever pool left them), and its steps
compute what fresh workers compute; a failed executor's slots are not reused.

The suite's shared instance keeps workers on (conftest.py).
"""
from __future__ import annotations

import pytest
import ray
import torch
from ray_testkit import compiled_plan, grpo_tis, prompts, role_specs

from hybridflow.errors import WorkerLostError
from hybridflow.runtime.ray import RayExecutor
from hybridflow.runtime.ray.warm import keep_workers, keeping_workers, parked_count, stop_parked


@pytest.fixture
def warm(ray_cluster):
    was = keeping_workers()
    keep_workers(True)  # (pools parked by an earlier module may be taken: they start over as new slots do)
    yield
    keep_workers(was)
    stop_parked()


def _step(plan, graph) -> tuple[dict[str, int], torch.Tensor, RayExecutor]:
    """(slot -> pid, the rollout's log-probs, the executor, shut down) of one step on engines built anew."""
    executor = RayExecutor(plan, role_specs(graph))
    try:
        result = executor.run_iteration({"prompts": prompts(0)})
    finally:
        executor.shutdown()
    pids = {name: info["pid"] for name, info in executor.slot_info.items()}
    return pids, result.env["actor.generate"]["rollout_log_probs"], executor


@pytest.mark.e2e
def test_a_parked_slot_starts_over_and_computes_what_a_fresh_one_computes(warm):
    graph = grpo_tis.build(n=2, cap=2.0)
    colocated = compiled_plan(graph, "colocate", 1)
    first_pids, first, _ = _step(colocated, graph)
    assert parked_count() == len(colocated.pools)  # the model pool's slot and the host pool's
    again_pids, again, _ = _step(colocated, graph)
    assert again_pids == first_pids  # the same processes ...
    assert torch.equal(again, first)  # ... with engines built anew from the seed: the same numbers
    # a plan of another shape: the pools that match are taken (pool0's shape, the host's), the rest start fresh
    split = compiled_plan(graph, "actor@1;actor.generate@1", 2)
    split_pids, _, _ = _step(split, graph)
    assert len(set(split_pids.values()) & set(first_pids.values())) == len(first_pids)
    assert len(set(split_pids.values())) == len(split.pools)
    assert parked_count() == len(split.pools)
    # on one node each slot is parked on its own: a pool of two takes the slots the two pools of one left
    wide = compiled_plan(graph, "colocate", 2)
    wide_pids, _, _ = _step(wide, graph)
    model_slots = {name: pid for name, pid in split_pids.items() if not name.startswith("host")}
    assert sorted(pid for name, pid in wide_pids.items() if name.startswith("pool0/")) == sorted(model_slots.values())
    assert parked_count() == 3
    keep_workers(False)  # stops what is parked, and keeps nothing from then on
    assert parked_count() == 0


@pytest.mark.e2e
def test_the_slots_of_an_executor_that_lost_a_worker_are_not_kept(warm):
    graph = grpo_tis.build(n=2, cap=2.0)
    plan = compiled_plan(graph, "colocate", 1)
    executor = RayExecutor(plan, role_specs(graph))
    try:
        (slot,) = executor.topology.pool_slots("pool0")
        ray.kill(executor.actor(slot), no_restart=True)
        with pytest.raises(WorkerLostError):
            executor.run_iteration({"prompts": prompts(0)})
    finally:
        executor.shutdown()
    assert parked_count() == 0  # not even the host pool's live slot: the executor met a failure
