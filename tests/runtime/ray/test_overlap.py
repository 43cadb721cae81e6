"""Overlap (staleness 1): generation of step i+1 runs while step i trains, with the weights after step i-1.

GRPO with the truncated-IS policy loss; the rollout has a pool of its own. Each call gets the next
step's prompts, starts their generation right after the weight sync (queued ahead of this step's
update on the train pool) and returns when this step is trained. The rollout a step trains on was
sampled by the weights its previous step started from: its rollout log-probs equal those weights'
log-probs, not the current ones, and the IS weights are min(exp(old - rollout), cap).
"""
from __future__ import annotations

import os

import pytest
import torch
from ray_testkit import compiled_plan, grpo_tis, prompts, role_specs, tiny_model, train_state

from hybridflow.runtime.engines import TrainEngine, TrainEngineConfig
from hybridflow.runtime.ray import RayExecutor

CAP = 2.0


def _log_probs_under(state: dict, batch) -> torch.Tensor:
    engine = TrainEngine(tiny_model(), TrainEngineConfig(precision="fp32"))
    engine.module.load_state_dict(state)
    return engine.compute_log_probs(batch)


@pytest.mark.e2e
def test_next_generation_overlaps_this_step_with_the_previous_weights(ray_cluster):
    graph = grpo_tis.build(n=2, cap=CAP)
    plan = compiled_plan(graph, "split", 2, staleness=1)  # actor on pool0, its generation on pool1
    assert plan.placement("actor").generation_pool == "pool1" and plan.staleness == 1
    batches = [{"prompts": prompts(i)} for i in range(4)]
    last = (os.cpu_count() or 1) - 1
    with RayExecutor(plan, role_specs(graph, lr=5e-2), pin_cpus={"pool1": (0,), "pool0": (last,)}) as executor:
        # each pool's worker runs on the core it was pinned to
        assert executor.slot_info["pool1/rank0"]["cpus"] == [0] and executor.slot_info["pool0/rank0"]["cpus"] == [last]
        weights = [train_state(executor, "actor")["model"]]  # weights[i]: before step i's update (an export plan)
        results = []
        for i in range(3):
            results.append(executor.run_iteration(batches[i], next_inputs=batches[i + 1]))
            weights.append(train_state(executor, "actor")["model"])
        spans = executor.trace_spans()
    assert [r.metrics["rollout/staleness"] for r in results] == [0.0, 1.0, 1.0]
    for i, result in enumerate(results):
        rollout, mask = result.env["actor.generate"], result.env["actor.generate"]["response_mask"]
        old = result.env["actor.logprob"]["old_log_probs"]
        sampled_with = weights[max(i - 1, 0)]  # step 0: on-policy; step i: the weights step i-1 started from
        assert ((_log_probs_under(sampled_with, rollout) - rollout["rollout_log_probs"]) * mask).abs().max() < 1e-5
        assert ((_log_probs_under(weights[i], rollout) - old) * mask).abs().max() < 1e-5
        gap = ((old - rollout["rollout_log_probs"]) * mask).abs().max()
        assert (gap < 1e-5) if i == 0 else (gap > 1e-4)
        expected_weights = torch.clamp(torch.exp(old - rollout["rollout_log_probs"]), max=CAP) * mask
        assert torch.allclose(result.env["truncated_is_weight"]["is_weights"] * mask, expected_weights, atol=1e-6)
    # The order the interpreter issued its ops in (event numbers, not times): during the call that trains
    # step i, step i+1's weight sync is queued on the train pool ahead of step i's update, and step i+1's
    # generation is sent once the sync is in, before the call returns.
    def record(op: str, iteration: int, pool: str):
        (span,) = [s for s in spans if s.op == op and s.iteration == iteration and s.device == pool]
        return span

    for i in range(2):
        update, sync = record("actor.update", i, "pool0"), record("actor.weight_sync", i + 1, "pool0")
        generate = record("actor.generate", i + 1, "pool1")
        assert sync.call == generate.call == update.call == i
        assert sync.sent < update.sent and sync.done < generate.sent
    assert "actor.update" not in plan.upstream("actor.generate")  # the compiler's decision: no wait on the update
