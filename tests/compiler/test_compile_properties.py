"""Properties of compiled plans over random clusters, models and algorithms.

- plans never exceed device memory (every op's predicted peak fits the cluster's usable memory);
- every op's dependencies end before it starts, and ops on one pool never overlap;
- the automatic plan is never slower than any fixed strategy's plan (at plan level: scheduled
  ``predicted_iteration_s``).
"""
from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler.cluster import ClusterSpec
from hybridflow.compiler.compile import compile
from hybridflow.compiler.passes import BatchShape
from hybridflow.compiler.placement import FIXED_STRATEGIES
from hybridflow.errors import PlacementError

MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "llama2-7b", "llama2-13b", "qwen2.5-14b")
GIB = 2**30


@st.composite
def cases(draw):
    cluster = ClusterSpec.preset(draw(st.sampled_from(["a100-80g", "h100-80g", "h200"])), nodes=draw(st.integers(1, 3)),
                                 device_memory_bytes=draw(st.sampled_from([24, 40, 80])) * GIB)
    if draw(st.booleans()):
        cluster = cluster.model_copy(update={"devices_per_node": draw(st.sampled_from([2, 4]))})
    algorithm = draw(st.sampled_from(["ppo", "grpo", "remax", "rloo", "reinforce_pp"]))
    models = {"actor": draw(st.sampled_from(MODELS))}
    for role in ("critic", "ref", "reward"):
        if draw(st.booleans()):
            models[role] = draw(st.sampled_from(MODELS))
    if algorithm != "ppo" and draw(st.booleans()):
        models["reward"] = "rule"
    roles = {r.name for r in ALGORITHMS[algorithm].build().roles}
    batch = BatchShape(prompts=draw(st.sampled_from([64, 256, 1024])), prompt_len=draw(st.sampled_from([256, 1024])),
                       response_len=draw(st.sampled_from([256, 1024])))
    return cluster, algorithm, {k: v for k, v in models.items() if k in roles}, batch


def _compile(case, placement):
    cluster, algorithm, models, batch = case
    try:
        return compile(ALGORITHMS[algorithm].build(), cluster, models, placement=placement, batch=batch, debug=True)
    except PlacementError:
        return None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_plans_fit_memory_respect_deps_and_auto_is_never_worse(case):
    cluster = case[0]
    auto = _compile(case, "auto")
    fixed = {s: _compile(case, s) for s in FIXED_STRATEGIES}
    if auto is None:  # nothing fits: then no fixed strategy fits either
        assert all(p is None for p in fixed.values())
        return
    for plan in [auto, *filter(None, fixed.values())]:
        ends = {op.name: op.predicted_end_s for op in plan.ops}
        for op in plan.ops:
            assert op.peak_memory_bytes is None or op.peak_memory_bytes <= math.ceil(cluster.usable_memory_bytes)
            assert all(ends[d] <= op.predicted_start_s + 1e-9 for d in op.deps)
        for pool in plan.pools:
            spans = sorted((op.predicted_start_s, op.predicted_end_s) for op in plan.ops if op.pool == pool.name)
            assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:]))
    for strategy, plan in fixed.items():
        if plan is not None:
            assert auto.predicted_iteration_s <= plan.predicted_iteration_s * (1 + 1e-12), strategy
