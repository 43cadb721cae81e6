"""Lowering graphs to workloads: the standard algorithms agree with the hand-built workloads, user graphs work, errors are clear."""
from __future__ import annotations

import json

import pytest

import hybridflow as hf
from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler.models import ModelSpec
from hybridflow.compiler.passes import BatchShape, lower_workload, resolve_models
from hybridflow.compiler.workload import grpo_workload, ppo_workload
from hybridflow.errors import ConfigError


def _lower(name: str, models: dict, **attrs):
    graph = ALGORITHMS[name].build(**attrs)
    return lower_workload(graph, resolve_models(graph, models), BatchShape())


def test_ppo_lowers_to_the_hand_built_ppo_workload():
    # Four roles of the actor's model: actor (generate, old log-probs, update), critic (values, update), ref, reward.
    assert _lower("ppo", {"actor": "llama2-7b"}) == ppo_workload("llama2-7b")
    mixed = _lower("ppo", {"actor": "llama2-13b", "critic": "llama2-7b"})
    assert mixed == ppo_workload("llama2-13b", critic="llama2-7b")


def test_grpo_with_a_rule_reward_is_actor_and_ref_only():
    workload = _lower("grpo", {"actor": "qwen2.5-7b", "reward": "rule"}, n=5)
    assert workload == grpo_workload("qwen2.5-7b", samples=5)
    assert workload.generation.sequences == 1024 * 5


def test_remax_greedy_baseline_is_a_second_generation_and_a_second_score():
    workload = _lower("remax", {"actor": "llama2-7b"})
    assert workload.generation.generations == 2 and workload.generation.samples == 1
    assert workload.role("reward").score_passes == 2
    assert workload.role("actor").infer_passes == 1 and workload.role("actor").train_epochs == 1


def test_safe_rlhf_has_two_trained_critics_and_two_reward_models():
    workload = _lower("safe_rlhf", {"actor": "llama2-7b"})
    assert [r.name for r in workload.roles if r.trainable] == ["actor", "critic", "cost_critic"]
    assert [r.name for r in workload.roles if r.score_passes] == ["reward", "cost"]


@hf.algorithm
def two_critics(prompts, actor, critic, reward, *, n=3):
    rollout = actor.generate(prompts, n=n)
    old = actor.logprob(rollout)
    values = critic.values(rollout)
    adv = hf.compute("gae", rollout, hf.compute("score_to_token_rewards", rollout, reward.score(rollout)), values)
    actor.update(rollout, adv, old, loss="ppo_clip")
    critic.update(rollout, adv, values, loss="value_clip")


def test_a_user_graph_lowers_by_counting_its_nodes():
    graph = two_critics.build()
    workload = lower_workload(graph, resolve_models(graph, {"actor": "qwen2.5-1.5b", "reward": "rule"}),
                              BatchShape(prompts=64, epochs=2, mini_batches=2))
    assert workload.role_names == ("actor", "critic")
    critic = workload.role("critic")
    assert critic.trainable and critic.infer_passes == 1 and critic.train_epochs == 2 and critic.mini_batches == 2
    assert workload.generation.sequences == 64 * 3 and workload.controller_compute


def test_models_default_to_the_actor_and_read_config_files(tmp_path):
    graph = ALGORITHMS["ppo"].build()
    config = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100}
    path = tmp_path / "tiny" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    models = resolve_models(graph, {"actor": "llama2-7b", "reward": str(path), "ref": "RULE"})
    assert models["critic"] == ModelSpec.preset("llama2-7b") and models["ref"] is None
    assert models["reward"].hidden == 64 and models["reward"].name == "config"
    assert resolve_models(graph, {"actor": str(path.parent)})["critic"].layers == 2


def test_lowering_errors_name_the_role_and_the_fix():
    graph = ALGORITHMS["ppo"].build()
    with pytest.raises(ConfigError, match="not roles of graph 'ppo'.*actor, critic, ref, reward"):
        resolve_models(graph, {"actor": "llama2-7b", "policy_lora": "llama2-7b"})
    with pytest.raises(ConfigError, match="give the model of role 'actor'"):
        resolve_models(graph, {"critic": "llama2-7b"})
    with pytest.raises(ConfigError, match="unknown model preset"):
        resolve_models(graph, {"actor": "llama9-1t"})
    with pytest.raises(ConfigError, match="critic.values.*infer node"):
        lower_workload(graph, resolve_models(graph, {"actor": "llama2-7b", "critic": "rule"}))
