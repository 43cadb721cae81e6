"""Streamed rollouts on Ray: the rollout pool's slot yields groups through a Ray streaming generator, the train
pool scores and infers them as they come, and the step's tensors are the unstreamed step's."""
from __future__ import annotations

import pytest
import torch
from ray_testkit import compiled_plan, prompts, role_specs

from hybridflow.algorithms import grpo
from hybridflow.runtime.ray import RayExecutor
from hybridflow.runtime.streaming import mark_streaming


@pytest.mark.e2e
def test_a_streamed_step_on_ray_equals_the_unstreamed_one_and_overlaps_scoring(ray_cluster):
    graph = grpo.build(n=4)
    plan = compiled_plan(graph, "actor+ref@1;actor.generate@1", 2)  # the rollout on a pool of its own
    generation = plan.placement("actor").generation_pool
    assert generation
    batch = {"prompts": prompts(0, count=6)}
    results, spans = {}, None
    for stream in (False, True):
        with RayExecutor(mark_streaming(plan) if stream else plan, role_specs(graph, max_new_tokens=16)) as executor:
            results[stream] = executor.run_iteration(batch)
            if stream:
                spans = executor.recorder.spans
    plain, streamed = results[False], results[True]
    mask = plain.env["actor.generate"]["response_mask"]
    assert mask.sum(-1).min() < mask.sum(-1).max()
    for name, out in plain.env.items():
        for field in out.tensors.keys():
            a, b = out[field], streamed.env[name][field]
            if field.endswith("log_probs") and name != "actor.generate":
                assert torch.allclose(a * mask, b * mask, atol=1e-6, rtol=0), (name, field)
            else:
                assert torch.equal(a, b), (name, field)
    generate = next(s for s in spans if s.op == "actor.generate" and s.device == generation)
    scores = [s for s in spans if s.op == "reward.score"]
    assert len(scores) > 1 and min(s.sent for s in scores) < generate.done
