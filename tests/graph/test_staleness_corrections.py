"""Which graphs the staleness check accepts as corrected: a correction in front of any loss, PPO's ratio taken
against the rollout's own log-probs (GRPO with ``recompute_old_log_probs=false``), chained rejections, AReaL."""
from __future__ import annotations

from pathlib import Path

import pytest

import hybridflow as hf
from hybridflow.algorithms import get_algorithm, grpo, grpo_decoupled
from hybridflow.errors import StalenessError
from hybridflow.graph import check_staleness
from hybridflow.trainer.config import algorithm_attrs
from hybridflow.trainer.config_files import load_run_config
from hybridflow_ops import IS_WEIGHTED_LOSSES, get_op

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("staleness", [1, 2, 4])
def test_grpo_with_old_log_probs_from_the_rollout_is_corrected_by_its_ratio(staleness):
    # ppo_clip's ratio pi_theta / pi_old with pi_old = mu (the rollout's log-probs) is the clipped IS ratio.
    lags = check_staleness(grpo.build(recompute_old_log_probs=False), staleness)
    assert max(lags.values()) == staleness
    with pytest.raises(StalenessError):  # recomputed old log-probs: the ratio is to pi_old, not to mu
        check_staleness(grpo.build(recompute_old_log_probs=True), staleness)


def test_the_grpo_arith_example_config_compiles_at_staleness_one():
    algorithm, config = load_run_config(ROOT / "examples/configs/grpo_arith.yaml")
    definition = get_algorithm(algorithm)
    graph = definition.build(**algorithm_attrs(config, definition.defaults))
    assert graph.node("old_log_probs_from_rollout").kind == "compute"
    check_staleness(graph, 1)


def _graph(loss, *, old_from_rollout, kl_in_reward=False):
    @hf.algorithm
    def custom(prompts, actor, ref, reward, *, n=4):
        rollout = actor.generate(prompts, n=n)
        behaviour = hf.compute("old_log_probs_from_rollout", rollout) if old_from_rollout or kl_in_reward else None
        old_logp = behaviour if old_from_rollout else actor.logprob(rollout)
        scores = reward.score(rollout)
        if kl_in_reward:  # the behaviour log-probs reach the loss only through the advantages
            ref_logp = ref.logprob(rollout)
            rewards = hf.compute("kl_in_reward", rollout.select("response_mask"), scores, behaviour, ref_logp)
            adv = hf.compute("reinforce_pp_advantage", rewards, rollout.select("response_mask"))
        else:
            adv = hf.compute("grpo_advantage", rollout, scores)
        actor.update(rollout, adv, old_logp, loss=loss)  # given to every loss, read by those that take it
    return custom.build()


@pytest.mark.parametrize("loss", [n for n in IS_WEIGHTED_LOSSES if get_op(n).ratio_input])
def test_every_loss_with_a_ratio_is_corrected_by_behaviour_old_log_probs(loss):
    check_staleness(_graph(loss, old_from_rollout=True), 2)
    with pytest.raises(StalenessError):
        check_staleness(_graph(loss, old_from_rollout=False), 2)


@pytest.mark.filterwarnings("ignore:node 'old_log_probs_from_rollout'")  # reinforce and gpg do not read them at all
@pytest.mark.parametrize("loss", ["reinforce", "gpg", "dro"])
def test_a_loss_without_a_ratio_is_not_corrected_by_behaviour_log_probs(loss):
    # reinforce and gpg read no old log-probs; dro reads them for its penalty only: none weights by pi / mu.
    assert get_op(loss).ratio_input is None
    with pytest.raises(StalenessError):
        check_staleness(_graph(loss, old_from_rollout=True), 1)


def test_behaviour_log_probs_reaching_the_loss_through_the_advantages_count_for_nothing():
    with pytest.raises(StalenessError):
        check_staleness(_graph("ppo_clip", old_from_rollout=False, kl_in_reward=True), 1)


@pytest.mark.parametrize("loss", IS_WEIGHTED_LOSSES)
@pytest.mark.parametrize("correction", ["truncated_is_weight", "icepop_is_weight", "decoupled_is_weight"])
def test_a_weight_correction_in_front_of_any_loss_is_accepted(loss, correction):
    @hf.algorithm
    def weighted(prompts, actor, reward, *, n=4):
        rollout = actor.generate(prompts, n=n)
        old_logp = actor.logprob(rollout)
        adv = hf.compute("grpo_advantage", rollout, reward.score(rollout))
        weights = hf.compute(correction, old_logp, rollout)
        if "old_log_probs" in get_op(loss).input_names:
            actor.update(rollout, adv, old_logp, weights, loss=f"{loss}_is")
        else:
            actor.update(rollout, adv, weights, loss=f"{loss}_is")

    check_staleness(weighted.build(), 3)


def test_chained_rejections_are_a_correction():
    @hf.algorithm
    def grpo_rejections(prompts, actor, reward, *, n=4):
        rollout = actor.generate(prompts, n=n)
        old_logp = actor.logprob(rollout)
        adv = hf.compute("grpo_advantage", rollout, reward.score(rollout))
        kept = hf.compute("kl_rejection_mask", old_logp, rollout, level="token", estimator="k1", high=2.0)
        kept = hf.compute("chained_rejection_mask", old_logp, rollout.select("rollout_log_probs"), kept,
                          criteria="seq_mean_k3=0.05,seq_max_k2=0.5")
        actor.update(rollout.select("prompt_ids", "prompt_mask", "response_ids"), adv, old_logp, kept, loss="gspo")

    graph = grpo_rejections.build()
    assert graph.node("chained_rejection_mask").inputs
    check_staleness(graph, 2)


def test_grpo_decoupled_is_corrected_and_clips_around_the_proximal_policy():
    graph = grpo_decoupled.build(behav_cap=5.0)
    check_staleness(graph, 4)
    update = graph.node("actor.update")
    sources = {i.name: (i.source, i.field) for i in update.inputs}
    assert sources["old_log_probs"] == ("actor.logprob", "old_log_probs")  # the proximal policy, recomputed
    assert sources["is_weights"] == ("decoupled_is_weight", "is_weights")
    assert [t.op for t in update.attrs.terms] == ["ppo_clip_is"]
