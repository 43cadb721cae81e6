"""Staged weight sync (``async_weight_sync: staged``) on Ray: generation k steps ahead, loading each version it needs
from the staging buffer (the object store) instead of a collective of both pools.

GRPO with the truncated-IS policy loss, the rollout on a pool of its own, k = 2. Every rollout is sampled by exactly
the version the compiled plan's lag says (the buffer filling: the first weights), and its log-probs are that
version's (recomputed from the weights exported after each step). The sync is cut into a stage op on the train pool,
queued ahead of the update of the step it is sent beside, and a load op on the rollout pool: no op of the sync
spans both pools. (Where staged sync is refused: tests/runtime/test_staged_sync.py.)
"""
from __future__ import annotations

import pytest
import torch
from ray_testkit import compiled_plan, grpo_tis, log_probs_under, prompts, role_specs, run_ahead

from hybridflow.compiler.validation import validation_plan
from hybridflow.graph.staleness import edge_lags
from hybridflow.runtime.ray import RayExecutor



@pytest.mark.e2e
def test_staged_sync_samples_each_rollout_with_the_compiled_lags_version(ray_cluster):
    k, steps = 2, 5
    graph = grpo_tis.build(n=2, cap=2.0)
    plan = compiled_plan(graph, "split", 2, staleness=k)
    offsets = {op.node: op.iteration_offset for op in plan.ops if op.kind == "node"}
    lag = {e.consumer: n for e, n in edge_lags(plan.graph, offsets=offsets).items()
           if e.producer == "actor.generate"}["actor.update"]
    assert lag == k
    batches = [{"prompts": prompts(i)} for i in range(steps)]
    with RayExecutor(plan, role_specs(graph, lr=5e-2)) as executor:
        executor.set_weight_sync("staged")

        def validate_after_step_1(i):
            if i == 1:  # a validation between steps syncs the newest weights (version 2) to the rollout pool, after
                # the buffer's generations (step 3's: its load of version 1 is sent, its generate op may not be yet)
                validated = executor.run_plan(validation_plan(plan, samples=1), {"prompts": prompts(9)})
                assert validated.env["actor.generate"]["policy_version"].unique().tolist() == [i + 1]

        weights, results = run_ahead(executor, batches, k, after_step=validate_after_step_1)
        spans = list(executor.recorder.spans)  # the iterations' ops, one span per pool (the validation's are apart)
    assert all(any(not torch.equal(a[n], b[n]) for n in a) for a, b in zip(weights, weights[1:]))  # real updates
    for i, result in enumerate(results):
        rollout = result.env["actor.generate"]
        versions = rollout["policy_version"].unique().tolist()
        assert versions == [max(i - lag, 0)], (i, versions)  # step i < k: the first weights (the buffer filling)
        mask = rollout["response_mask"]
        assert ((log_probs_under(weights[versions[0]], rollout) - rollout["rollout_log_probs"]) * mask).abs().max() < 1e-5
        if i >= 1:  # not the weights of any other version
            other = weights[versions[0] + 1]
            assert ((log_probs_under(other, rollout) - rollout["rollout_log_probs"]) * mask).abs().max() > 1e-4
    # the sync's halves: the stage on the train pool (pool0) alone, queued ahead of the update of the step it is sent
    # beside (call i stages version i for step i+k), the load on the rollout pool (pool1) alone
    by_op = {}
    for s in spans:
        by_op.setdefault(s.op, set()).add(s.device)
    assert "actor.weight_sync" not in by_op
    assert by_op["actor.weight_sync.stage"] == {"pool0"} and by_op["actor.weight_sync.load"] == {"pool1"}
    for i in range(1, steps - k):
        (stage,) = [s for s in spans if s.op == "actor.weight_sync.stage" and s.iteration == i + k and s.device == "pool0"]
        (update,) = [s for s in spans if s.op == "actor.update" and s.iteration == i and s.device == "pool0"]
        (load,) = [s for s in spans if s.op == "actor.weight_sync.load" and s.iteration == i + k and s.device == "pool1"]
        (previous,) = [s for s in spans if s.op == "actor.generate" and s.iteration == i + k - 1 and s.device == "pool1"]
        assert stage.call == update.call == i and stage.sent < update.sent
        (generate,) = [s for s in spans if s.op == "actor.generate" and s.iteration == i + k and s.device == "pool1"]
        assert stage.done < load.sent  # the load's argument is the stage's staged weights
        assert previous.sent < load.sent < generate.sent  # the rollout pool's queue: in this order
