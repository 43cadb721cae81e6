"""A generate node with an environment: its attributes, declared outputs and JSON/text forms."""
from __future__ import annotations

import pytest

import hybridflow as hf
from hybridflow.errors import GraphError
from hybridflow.graph.attrs import GenerateAttrs, attrs_from_dict, attrs_to_dict
from hybridflow.graph.serialize import graph_from_json, graph_to_json
from hybridflow.graph.text import graph_from_text, graph_to_text


@hf.algorithm
def agentic(prompts, actor, reward, *, n=4):
    rollout = actor.generate(prompts, n=n, env="calc", max_turns=3, max_tokens_per_turn=12, max_total_tokens=40)
    adv = hf.compute("grpo_advantage", rollout, hf.compute("env_scores", rollout))
    actor.update(rollout, adv, hf.compute("old_log_probs_from_rollout", rollout), loss=hf.loss("ppo_clip"))


def test_the_rollout_declares_the_agent_fields():
    node = agentic.build().node("actor.generate")
    fields = {f.name: str(f) for f in node.outputs.fields}
    assert fields["turn_index"] == "turn_index: int64[B*4, R]"
    assert fields["env_reward"] == "env_reward: float32[B*4]"
    assert {"num_turns", "tool_calls", "tool_errors", "response_mask", "rollout_log_probs"} <= set(fields)
    assert node.attrs.agent == {"env": "calc", "max_turns": 3, "max_tokens_per_turn": 12, "max_total_tokens": 40}


def test_json_and_text_forms_round_trip():
    graph = agentic.build()
    assert graph_from_json(graph_to_json(graph)) == graph
    assert graph_from_text(graph_to_text(graph)) == graph


def test_a_one_turn_node_keeps_its_json_form():
    assert set(attrs_to_dict(GenerateAttrs(n=2))) == {"n", "greedy", "max_new_tokens", "temperature", "top_p", "seed"}
    assert attrs_from_dict("generate", {"n": 2}, "here") == GenerateAttrs(n=2)
    assert GenerateAttrs(n=2).agent is None


def test_budgets_without_an_environment_are_refused():
    with pytest.raises(GraphError, match="give env"):
        GenerateAttrs(max_turns=3)
    with pytest.raises(GraphError, match="max_total_tokens"):
        GenerateAttrs(env="calc", max_total_tokens=0)
    with pytest.raises(GraphError, match="env must be"):
        GenerateAttrs(env="")
    with pytest.raises(GraphError, match="give env"):
        GenerateAttrs(observation_role="user")


def test_the_observation_role_reaches_the_worker_settings():
    attrs = GenerateAttrs(env="calc", observation_role="tool")
    assert attrs.agent == {"env": "calc", "observation_role": "tool"}
    assert attrs_from_dict("generate", attrs_to_dict(attrs), "here") == attrs
