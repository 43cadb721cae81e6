"""A rule reward is part of the graph (costed ~0 by the compiler with no --model for it); a loss
term is weighted one way only (``weight=``); an op with one output may return a bare tensor."""
from __future__ import annotations

import pytest
import torch

import hybridflow as hf
from hybridflow.errors import GraphError
from hybridflow.graph import Role
from hybridflow.graph.serialize import graph_from_json
from hybridflow.graph.text import graph_from_text
from hybridflow_ops.registry import OpRegistryError, register_op


@hf.algorithm(roles={"reward": "rule"})
def rule_rloo(prompts, actor, reward, *, n=2):
    rollout = actor.generate(prompts, n=n)
    adv = hf.compute("rloo_advantage", rollout, reward.score(rollout))
    actor.update(rollout, adv, actor.logprob(rollout), loss="ppo_clip")


@hf.algorithm
def model_rloo(prompts, actor, reward, *, n=2):
    rollout = actor.generate(prompts, n=n)
    adv = hf.compute("rloo_advantage", rollout, reward.score(rollout))
    actor.update(rollout, adv, actor.logprob(rollout), loss="ppo_clip")


def test_a_rule_role_round_trips_through_json_and_text():
    graph = rule_rloo.build()
    assert graph.role("reward") == Role("reward", "reward", False, rule=True)
    assert graph_from_json(graph.to_json()) == graph and graph_from_text(graph.to_text()) == graph
    assert "role reward: reward, frozen, rule" in graph.to_text()
    assert '"rule"' not in model_rloo.build().to_json()  # graphs without rule roles read as before


def test_only_scoring_roles_can_be_rules():
    with pytest.raises(GraphError, match="only frozen reward and cost roles can be rule functions"):
        Role("critic", "critic", True, rule=True)


def test_compile_costs_a_rule_reward_as_nothing_without_a_model_flag():
    rule = hf.compile(rule_rloo.build(), "a100-80g:1", {"actor": "llama2-7b"}, placement="colocate")
    model = hf.compile(model_rloo.build(), "a100-80g:1", {"actor": "llama2-7b"}, placement="colocate")

    def reward_s(plan):
        return sum(o.predicted_end_s - o.predicted_start_s for o in plan.ops if o.role == "reward")

    # the rule: moving 2048 responses to the controller (~8 ms); the model: a 7B forward over them (seconds)
    assert reward_s(rule) < 0.05 and reward_s(model) > 1.0, (reward_s(rule), reward_s(model))
    # the rule is placed on no device pool of the cluster: its memory is the actor's alone
    assert rule.placement("reward").pool != rule.placement("actor").pool
    assert rule.predicted_iteration_s < model.predicted_iteration_s


def test_a_loss_term_is_weighted_by_weight_only():
    with pytest.raises(GraphError, match=r"scaled by its weight, not by a coef parameter; write hf.loss\('kl_loss', weight=0.5"):
        hf.loss("kl_loss", coef=0.5)
    with pytest.raises(OpRegistryError, match="loss op 't_scaled_loss' takes a 'coef' attribute"):
        @register_op("t_scaled_loss", model_inputs=("log_probs: float32[B, R]",), inputs=("response_mask: float32[B, R]",),
                     outputs=("loss: float32",), kind="loss")
        def t_scaled_loss(log_probs, response_mask, *, coef=1.0, global_tokens=None, global_seqs=None):
            return coef * log_probs.sum()


def test_one_output_ops_may_return_a_bare_tensor():
    from hybridflow.batch import Batch
    from hybridflow.runtime.node_calls import run_compute

    @register_op("t_bare_double", inputs=("scores: float32[B]",), outputs=("scores: float32[B]",), replace=True)
    def t_bare_double(scores):
        return 2 * scores

    @hf.algorithm
    def doubled(prompts, actor, reward):
        rollout = actor.generate(prompts)
        scores = hf.compute("t_bare_double", reward.score(rollout))
        actor.update(rollout, hf.compute("rloo_advantage", rollout, scores), actor.logprob(rollout), loss="ppo_clip")

    node = doubled.build().node("t_bare_double")
    out = run_compute(node, {"reward.score": Batch({"scores": torch.tensor([1.0, -0.5])})})
    torch.testing.assert_close(out["scores"], torch.tensor([2.0, -1.0]))
