"""DAPO's dynamic sampling on the RayExecutor: the same plan interpreter repeats the region on Ray workers.

The rounds draw fresh prompts from a ``refill``; with one device per pool the Ray run must give
the local run's rollouts and metrics (dynamic-sampling ones included), step for step.
"""
from __future__ import annotations

import sys

import pytest
import ray
import torch
from ray_testkit import BATCH, TINY, placement_plan, prompts, role_specs

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler import compile_for, local_machine
from hybridflow.runtime.local import LocalExecutor
from hybridflow.runtime.ray import RayExecutor


def _parity(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str) % 2)


def _refill(step):
    return lambda round_: {"prompts": prompts(10 * step + round_)}


@pytest.mark.e2e
def test_dapo_dynamic_sampling_on_ray_matches_local(ray_cluster):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers run _parity
    graph = ALGORITHMS["dapo"].build(n=2, max_rounds=3)
    plan = placement_plan(graph, "device_map")
    local = LocalExecutor(compile_for(graph, TINY, machine=local_machine(), placement={r.name: "cpu" for r in graph.roles},
                                      batch=BATCH), role_specs(graph, reward=_parity))
    with RayExecutor(plan, role_specs(graph, reward=_parity)) as executor:
        extra = []
        for step in range(2):
            result = executor.run_iteration({"prompts": prompts(step)}, refill=_refill(step))
            expected = local.run_iteration({"prompts": prompts(step)}, refill=_refill(step))
            rollout = result.env["actor.generate"]
            assert len(rollout) == 6 and rollout["group_index"].tolist() == [0, 0, 1, 1, 2, 2]
            assert torch.equal(rollout["response_ids"], expected.env["actor.generate"]["response_ids"])
            assert 1.0 <= result.metrics["dynamic_sampling/rounds"] <= 3.0
            extra.append(result.metrics["dynamic_sampling/extra_rounds"])
            for key, value in expected.metrics.items():
                if not key.startswith(("timing_s/", "weight_sync/")):
                    assert result.metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
        assert sum(extra) > 0  # the region did repeat on the Ray workers (3 rounds each step with seed 0)
