"""Weight sync on Ray: after every update the rollout engine samples with the train engine's weights.

Split placement with a generation pool: the actor trains on two ranks (FSDP2) and generates on a
pool of two other workers. Its weight sync is a bucketed broadcast from the train pool's rank 0
over a process group spanning it and the rollout workers; small buckets make it many.
"""
from __future__ import annotations

import pytest
from ray_testkit import compiled_plan, on_pool, prompts, role_specs, train_state

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler.control import control_plan
from hybridflow.runtime.ray import RayExecutor
from hybridflow.runtime.spans import chrome_trace

BUCKET = 16 * 2**10


@pytest.mark.e2e
def test_cross_pool_broadcast_keeps_rollout_in_step_with_training(ray_cluster):
    graph = ALGORITHMS["rloo"].build(n=2)
    plan = compiled_plan(graph, "actor@2;actor.generate@2", 4)
    sync = next(op for op in plan.ops if op.kind == "weight_sync")
    assert (sync.pool, sync.target_pool) == ("pool0", "pool1")
    with RayExecutor(plan, role_specs(graph, lr=5e-2), bucket_bytes=BUCKET) as executor:
        reports = executor.run_plan(control_plan(plan, "describe", ["actor"])).results
        train, rollout = reports["actor.describe"][0]["engines"], reports["actor.describe@pool1"][0]["engines"]
        assert set(train) == {"train"} and set(rollout) == {"rollout"}  # each pool holds its half of the policy
        model_bytes = sum(t.numel() * t.element_size() for t in train_state(executor, "actor")["model"].values())
        for step in range(2):
            result = executor.run_iteration({"prompts": prompts(step)})
            batch = result.env["actor.generate"]
            mask = batch["response_mask"]
            # Sampled on the generation pool, scored by the FSDP train engine: the same weights.
            gap = ((batch["rollout_log_probs"] - result.env["actor.logprob"]["old_log_probs"]) * mask).abs().max()
            assert gap < 1e-5
            assert result.metrics["weight_sync/actor/buckets"] >= 4
            assert result.metrics["weight_sync/actor/mb"] == pytest.approx(model_bytes / 2**20)
            assert 0 < result.metrics["weight_sync/actor/peak_mb"] <= 2 * BUCKET / 2**20
            # The update came after this step's sync: training moved on, the rollout copy did not (yet): what it
            # samples now has other log-probs under the trained weights.
            probe = on_pool(executor, "pool1", "generate", "actor", prompts(step + 5), {"seed": 3})
            trained = on_pool(executor, "pool0", "logprob", "actor", probe)
            assert ((probe["rollout_log_probs"] - trained) * probe["response_mask"]).abs().max() > 1e-4
        spans = [s for s in executor.trace_spans() if s.kind == "weight_sync"]
        assert {s.device for s in spans} >= {"pool0/rank0", "pool0/rank1", "pool1/rank0", "pool1/rank1"}
        assert chrome_trace(spans)["traceEvents"]
