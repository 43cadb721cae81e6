"""Overlap (staleness k): generation of step i+k runs while step i trains, with the weights after step i-1.

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
from ray_testkit import compiled_plan, grpo_tis, log_probs_under, prompts, role_specs, run_ahead, train_state

from hybridflow.runtime.ray import RayExecutor

CAP = 2.0



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
    # every token of step i's rollout was sampled by weights of version max(i-1, 0) (training steps taken)
    assert [r.env["actor.generate"]["policy_version"].unique().tolist() for r in results] == [[0], [0], [1]]
    for i, result in enumerate(results):
        rollout, mask = result.env["actor.generate"], result.env["actor.generate"]["response_mask"]
        old = result.env["actor.logprob"]["old_log_probs"]
        sampled_with = weights[max(i - 1, 0)]  # step 0: on-policy; step i: the weights step i-1 started from
        assert ((log_probs_under(sampled_with, rollout) - rollout["rollout_log_probs"]) * mask).abs().max() < 1e-5
        assert ((log_probs_under(weights[i], rollout) - old) * mask).abs().max() < 1e-5
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


@pytest.mark.e2e
def test_staleness_k_trains_on_rollouts_exactly_as_old_as_the_compiled_lags(ray_cluster):
    # k = 3: a buffer of up to 3 generations ahead. The versions each rollout records (training steps of the weights
    # that sampled it) against the step that trains on it give the lag, which is what the compiled plan's edges say:
    # step i < k trains on the first weights (lag i, the buffer filling), every later step on lag exactly k.
    from hybridflow.graph.staleness import edge_lags

    k, steps = 3, 6
    graph = grpo_tis.build(n=2, cap=CAP)
    plan = compiled_plan(graph, "split", 2, staleness=k)
    offsets = {op.node: op.iteration_offset for op in plan.ops if op.kind == "node"}
    lags = {e.consumer: lag for e, lag in edge_lags(plan.graph, offsets=offsets).items() if e.producer == "actor.generate"}
    assert lags["actor.update"] == k and offsets["actor.generate"] == k
    batches = [{"prompts": prompts(i)} for i in range(steps)]
    with RayExecutor(plan, role_specs(graph, lr=5e-2)) as executor:
        weights, results = run_ahead(executor, batches, k)  # weights[v]: version v (before step v's update)
        spans = executor.trace_spans()
    for i, result in enumerate(results):
        rollout = result.env["actor.generate"]
        versions = rollout["policy_version"].unique().tolist()
        assert len(versions) == 1
        assert i - versions[0] == (lags["actor.update"] if i >= k else i), (i, versions)
        # the version is the weights': the rollout's log-probs are those weights' log-probs
        mask = rollout["response_mask"]
        assert ((log_probs_under(weights[versions[0]], rollout) - rollout["rollout_log_probs"]) * mask).abs().max() < 1e-5
    # one weight sync per generation once the buffer is full (call i sends step i+k's), queued ahead of step i's update
    for i in range(1, steps - k):
        sync = [s for s in spans if s.op == "actor.weight_sync" and s.iteration == i + k and s.device == "pool0"]
        update = [s for s in spans if s.op == "actor.update" and s.iteration == i and s.device == "pool0"]
        assert len(sync) == len(update) == 1 and sync[0].call == update[0].call == i and sync[0].sent < update[0].sent
