"""The compiler prices a multi-turn rollout: a prefill of the growing context per turn, and a tool call between turns."""
from __future__ import annotations

import pytest

from hybridflow.algorithms import grpo
from hybridflow.algorithms.agent_grpo import agent_grpo
from hybridflow.compiler.compile import compile as compile_graph
from hybridflow.compiler.cost import CostOptions, Generate, estimate
from hybridflow.compiler.cluster import ClusterSpec
from hybridflow.compiler.layout import Layout
from hybridflow.compiler.models import ModelSpec
from hybridflow.compiler.passes.context import BatchShape

BATCH = BatchShape(prompts=64, prompt_len=128, response_len=512)


def _generate_s(graph, options=CostOptions()) -> float:
    plan = compile_graph(graph, "h100-80g", "qwen2.5-7b", batch=BATCH, options=options, placement="colocate")
    op = next(o for o in plan.ops if o.name == "actor.generate")
    return op.predicted_end_s - op.predicted_start_s


def test_turns_cost_prefills_and_tools_add_one_call_per_turn_after_the_first():
    one_turn = _generate_s(grpo.build(n=4))
    agent = agent_grpo.build(n=4, max_turns=4, max_tokens_per_turn=128, max_total_tokens=512)
    four_turns = _generate_s(agent)
    # 64 prompts x 4 = 256 samples; an environment pool of 8 workers steps 8 x 32 of them at once
    with_tools = _generate_s(agent, CostOptions(tool_call_s=2.0, env_workers=8))
    assert four_turns > one_turn  # same tokens, three more prefills of a longer context
    assert with_tools - four_turns == pytest.approx(3 * 2.0)


def test_tool_time_is_priced_on_the_environment_pool():
    agent = agent_grpo.build(n=4, max_turns=4, max_tokens_per_turn=128, max_total_tokens=512)
    no_tools = _generate_s(agent)
    # 256 samples on 2 workers x 32 calls at once: each turn after the first waits 4 rounds of steps
    assert _generate_s(agent, CostOptions(tool_call_s=2.0, env_workers=2)) - no_tools == pytest.approx(3 * 4 * 2.0)
    # 3 workers: 96 at once, 3 rounds
    assert _generate_s(agent, CostOptions(tool_call_s=2.0, env_workers=3)) - no_tools == pytest.approx(3 * 3 * 2.0)


def test_one_turn_is_priced_as_before():
    model, cluster = ModelSpec.preset("qwen2.5-7b"), ClusterSpec.preset("h100-80g")
    plain = estimate(Generate(model, Layout(dp=1, tp=1), 64, 128, 512), cluster, CostOptions())
    turns = estimate(Generate(model, Layout(dp=1, tp=1), 64, 128, 512, turns=4, tool_s=1.5), cluster, CostOptions())
    assert dict(turns.parts)["turns"] == 4.0 and dict(turns.parts)["tool"] == 1.5
    assert "turns" not in dict(plain.parts)
    assert turns.time_s > plain.time_s + 1.5
