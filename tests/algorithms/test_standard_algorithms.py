"""The standard algorithms: each traces, validates without warnings, round-trips, draws, and stays short;
their variants are different graphs chosen by attributes."""
from __future__ import annotations

import ast
import inspect
import textwrap
import warnings

import pytest
import torch

from hybridflow.algorithms import ALGORITHMS, get_algorithm
from hybridflow.algorithms.safe_rlhf import lagrange_update, safe_rlhf_advantage
from hybridflow.errors import GraphError
from hybridflow.graph import Graph, validate
from hybridflow.viz.graph import graph_to_dot

MAX_BODY_LINES = 15


def graph_body_lines(algorithm) -> int:
    """Lines of the function body after its signature, docstring excluded (what `wc -l` of the body counts)."""
    fn = ast.parse(textwrap.dedent(inspect.getsource(algorithm.fn))).body[0]
    body = fn.body[1:] if ast.get_docstring(fn) else fn.body
    return body[-1].end_lineno - body[0].lineno + 1


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_traces_validates_round_trips_and_draws(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no unused values either
        graph = ALGORITHMS[name].build()
        assert validate(graph) == []
    assert graph.name == name
    assert Graph.from_json(graph.to_json()) == graph
    assert Graph.from_text(graph.to_text()) == graph
    source = graph_to_dot(graph).source
    for node in graph.nodes:
        assert f'"{node.name}"' in source or f"\t{node.name} " in source
    for role in graph.roles:
        assert f"legend.role.{role.name}" in source


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_graph_body_is_at_most_15_lines(name):
    assert graph_body_lines(ALGORITHMS[name]) <= MAX_BODY_LINES


def test_body_line_counter_counts_what_wc_would():
    def f(x):
        """doc"""
        a = 1

        return a + x
    assert graph_body_lines(type("A", (), {"fn": f})) == 3


def _ops(graph: Graph) -> list[str]:
    return [n.op for n in graph.nodes]


def _terms(graph: Graph, node: str) -> list[tuple[str, float]]:
    return [(t.op, t.weight) for t in graph.node(node).attrs.terms]


def test_ppo_kl_in_reward_by_default_and_as_loss_by_attribute():
    default = ALGORITHMS["ppo"].build(kl_coef=0.01)
    assert "kl_in_reward" in _ops(default) and dict(default.node("kl_in_reward").attrs.params)["kl_coef"] == 0.01
    assert _terms(default, "actor.update") == [("ppo_clip", 1.0)]
    assert [r.name for r in default.roles] == ["actor", "critic", "ref", "reward"]
    as_loss = ALGORITHMS["ppo"].build(kl_as_loss=True, kl_coef=0.01, entropy_coef=0.001)
    assert "kl_in_reward" not in _ops(as_loss) and "score_to_token_rewards" in _ops(as_loss)
    assert _terms(as_loss, "actor.update") == [("ppo_clip", 1.0), ("kl_loss", 0.01), ("entropy_bonus", 0.001)]
    assert {i.name for i in as_loss.node("actor.update").inputs} >= {"ref_log_probs", "advantages", "old_log_probs"}


def test_grpo_group_dims_kl_loss_and_dr_grpo():
    graph = ALGORITHMS["grpo"].build(n=4)
    assert graph.node("actor.generate").outputs.get("group_index").dims == ("B*4",)
    assert graph.node("grpo_advantage").outputs.get("advantages").dims == ("B*4", "R")
    assert "critic" not in {r.name for r in graph.roles}
    assert _terms(graph, "actor.update") == [("ppo_clip", 1.0), ("kl_loss", 0.001)]
    with_entropy = ALGORITHMS["grpo"].build(kl_coef=0.1, entropy_coef=0.01)
    assert _terms(with_entropy, "actor.update") == [("ppo_clip", 1.0), ("kl_loss", 0.1), ("entropy_bonus", 0.01)]
    dr = ALGORITHMS["grpo"].build(norm_by_std=False, loss_agg_mode="seq-mean-token-sum-norm", kl_loss=False)
    assert dict(dr.node("grpo_advantage").attrs.params) == {"norm_by_std": False}
    assert dict(dr.node("actor.update").attrs.terms[0].params)["loss_agg_mode"] == "seq-mean-token-sum-norm"
    assert "ref" not in {r.name for r in dr.roles} and "logprob" in _ops(dr)


def test_rloo_and_reinforce_pp():
    rloo = ALGORITHMS["rloo"].build()
    assert "rloo_advantage" in _ops(rloo) and {r.name for r in rloo.roles} == {"actor", "reward"}
    assert "ref" in {r.name for r in ALGORITHMS["rloo"].build(kl_coef=0.01).roles}
    rpp = ALGORITHMS["reinforce_pp"].build()
    assert rpp.node("reinforce_pp_advantage").inputs[0].source == "kl_in_reward"


def test_remax_scores_a_greedy_rollout_of_the_same_batch():
    graph = ALGORITHMS["remax"].build()
    greedy = graph.node("actor.generate_greedy")
    assert greedy.attrs.greedy and not graph.node("actor.generate").attrs.greedy
    baseline = graph.node("remax_advantage").inputs[1]
    assert (baseline.name, baseline.source) == ("baseline_scores", "reward.baseline_scores")
    assert graph.node("reward.baseline_scores").inputs[0].source == "actor.generate_greedy"


def test_safe_rlhf_has_cost_model_and_two_critics():
    graph = ALGORITHMS["safe_rlhf"].build(lagrange_lambda=0.5)
    assert {(r.name, r.kind, r.trainable) for r in graph.roles} >= {("cost", "cost", False), ("cost_critic", "critic", True)}
    assert [n.name for n in graph.nodes if n.kind == "update"] == ["actor.update", "critic.update", "cost_critic.update"]
    combine = graph.node("safe_rlhf_advantage")
    assert {i.name: i.source for i in combine.inputs} == {"advantages": "gae", "cost_advantages": "gae_2", "response_mask": "actor.generate"}
    assert graph.node("gae_2").inputs[1].source == "cost_critic.values"
    assert dict(combine.attrs.params) == {"lagrange_lambda": 0.5} and graph.attr("cost_limit") == 0.0


def test_safe_rlhf_advantage_by_hand():
    # lambda = 1: A = (A_r - A_c) / 2.  Row 0: (1 - 3)/2 = -1, (2 - 0)/2 = 1; row 1: (4 - 2)/2 = 1, padding -> 0.
    reward_adv = torch.tensor([[1.0, 2.0], [4.0, 7.0]])
    cost_adv = torch.tensor([[3.0, 0.0], [2.0, float("nan")]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    out = safe_rlhf_advantage(reward_adv, cost_adv, mask, lagrange_lambda=1.0).advantages
    assert torch.equal(out, torch.tensor([[-1.0, 1.0], [1.0, 0.0]]))
    # lambda = 0 is plain PPO on the reward side.
    assert torch.equal(safe_rlhf_advantage(reward_adv, cost_adv, mask, lagrange_lambda=0.0).advantages, reward_adv * mask)
    with pytest.raises(ValueError):
        safe_rlhf_advantage(reward_adv, cost_adv, mask, lagrange_lambda=-1.0)


def test_lagrange_update_by_hand():
    # lambda <- max(0, lambda + lr * (mean cost - limit)).
    # Violated: 0.5 + 0.1 * (0.8 - 0.3) = 0.55.  Satisfied: 0.5 + 0.1 * (0.1 - 0.3) = 0.48.
    assert lagrange_update(0.5, 0.8, cost_limit=0.3, lambda_lr=0.1) == pytest.approx(0.55)
    assert lagrange_update(0.5, 0.1, cost_limit=0.3, lambda_lr=0.1) == pytest.approx(0.48)
    # Projected onto lambda >= 0: 0.01 + 0.1 * (0.0 - 0.3) = -0.02 -> 0.  At the limit it stays put.
    assert lagrange_update(0.01, 0.0, cost_limit=0.3, lambda_lr=0.1) == 0.0
    assert lagrange_update(0.7, 0.3, cost_limit=0.3, lambda_lr=0.1) == 0.7
    assert lagrange_update(0.0, 5.0, cost_limit=0.3, lambda_lr=0.0) == 0.0  # lr 0: a fixed lambda
    with pytest.raises(ValueError, match=">= 0"):
        lagrange_update(-0.1, 0.5, cost_limit=0.3, lambda_lr=0.1)


def test_safe_rlhf_declares_its_multiplier_as_run_state():
    from hybridflow.graph.state import advance, initial_state, node_params

    algorithm = ALGORITHMS["safe_rlhf"]
    graph = algorithm.build(lagrange_lambda=0.5, cost_limit=0.3, lambda_lr=0.1)
    assert [rule.name for rule in algorithm.state] == ["lagrange_lambda"]
    state = initial_state(algorithm.state, graph)
    assert node_params(algorithm.state, graph, state) == {"safe_rlhf_advantage": {"lagrange_lambda": 0.5}}
    # the step's mean episode cost is the cost score node's metric
    assert advance(algorithm.state, graph, state, {"critic/costs/mean": 0.8}) == {"lagrange_lambda": pytest.approx(0.55)}
    assert all(not rules.state for name, rules in ALGORITHMS.items() if name != "safe_rlhf")


def test_unknown_algorithm_lists_the_known_ones():
    with pytest.raises(GraphError, match="ppo, grpo"):
        get_algorithm("dpo")
