"""The plan records each generating role's rollout engine, and the cost model prices it."""
from __future__ import annotations

import pytest

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler.cluster import ClusterSpec
from hybridflow.compiler.compile import compile
from hybridflow.compiler.cost import CostOptions, Generate, estimate
from hybridflow.compiler.layout import Layout
from hybridflow.compiler.models import ModelSpec
from hybridflow.compiler.plan import ExecutionPlan
from hybridflow.compiler.rollout_engines import ROLLOUT_ENGINE_COSTS
from hybridflow.errors import ConfigError


def _plan(engine: str, algorithm: str = "grpo", **options) -> ExecutionPlan:
    graph = ALGORITHMS[algorithm].build()
    return compile(graph, "a100-80g:1", {"actor": "llama2-7b"}, placement="colocate",
                   options=CostOptions(rollout_engine=engine, **options))


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_the_generating_role_records_its_engine_and_the_json_round_trips(engine):
    plan = _plan(engine)
    assert plan.placement("actor").rollout_engine == engine
    assert all(p.rollout_engine is None for p in plan.placements if p.role != "actor")  # they do not generate
    assert ExecutionPlan.from_json(plan.to_json()) == plan
    assert ("rollout vllm" in plan.to_text()) == (engine == "vllm")


def test_generation_costs_the_engines_factor_times_hf():
    model = ModelSpec.preset("llama2-7b")
    cluster = ClusterSpec.parse("a100-80g:1")
    work = Generate(model, Layout(1), sequences=64, prompt_len=128, response_len=64)
    hf = estimate(work, cluster, CostOptions())
    vllm = estimate(work, cluster, CostOptions(rollout_engine="vllm"))
    assert vllm.time_s == pytest.approx(ROLLOUT_ENGINE_COSTS["vllm"].time_factor * hf.time_s)
    assert vllm.peak_memory_bytes == hf.peak_memory_bytes
    with pytest.raises(ConfigError, match="unknown rollout engine 'nope'"):
        estimate(work, cluster, CostOptions(rollout_engine="nope"))
