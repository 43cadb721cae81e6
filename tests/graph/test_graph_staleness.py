"""Staleness as a type: the lag of each edge, worked out by hand on GRPO, and the StalenessError checks."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import hybridflow as hf
from hybridflow.algorithms import grpo, grpo_is, ppo
from hybridflow.errors import GraphValidationError, StalenessError
from hybridflow.graph import Edge, Input, Schema, check_staleness, edge_lags, lagged_edges, validate
from hybridflow_ops.registry import OpRegistryError, get_op, register_op, unregister_op


def _lag(lags: dict[Edge, int], producer: str, field: str, consumer: str) -> int:
    (lag,) = [n for e, n in lags.items() if (e.producer, e.field, e.consumer) == (producer, field, consumer)]
    return lag


def test_grpo_lags_by_hand():
    graph = grpo.build()
    # staleness 1: actor.generate runs one iteration ahead, so what it samples is 1 update old when read by
    # the training side; actor.logprob and ref.logprob recompute on this iteration's weights (lag 0); the
    # score and the advantages are computed from the old samples (lag 1); the prompts feed generation (0).
    lags = edge_lags(graph, 1)
    assert _lag(lags, "prompts", "prompt_ids", "actor.generate") == 0
    assert _lag(lags, "actor.generate", "response_ids", "actor.logprob") == 1
    assert _lag(lags, "reward.score", "scores", "grpo_advantage") == 1
    assert _lag(lags, "grpo_advantage", "advantages", "actor.update") == 1
    assert _lag(lags, "actor.generate", "response_mask", "actor.update") == 1
    assert _lag(lags, "actor.logprob", "old_log_probs", "actor.update") == 0
    assert _lag(lags, "ref.logprob", "ref_log_probs", "actor.update") == 0
    assert len(lags) == sum(len(n.inputs) for n in graph.nodes)
    assert not lagged_edges(graph, 0) and set(edge_lags(graph, 0).values()) == {0}
    assert _lag(edge_lags(graph, 3), "grpo_advantage", "advantages", "actor.update") == 3


def test_a_node_run_ahead_reads_the_rollout_without_lag():
    graph = grpo.build()
    # scoring and the advantages run with generation, 2 iterations ahead: their inputs are as fresh as they
    # are (lag 0), and the update, at offset 0, reads the advantages 2 updates late.
    offsets = {"actor.generate": 2, "reward.score": 2, "grpo_advantage": 2}
    lags = edge_lags(graph, offsets=offsets)
    assert _lag(lags, "actor.generate", "response_ids", "reward.score") == 0
    assert _lag(lags, "reward.score", "scores", "grpo_advantage") == 0
    assert _lag(lags, "grpo_advantage", "advantages", "actor.update") == 2
    assert _lag(lags, "actor.generate", "response_ids", "actor.logprob") == 2


def test_old_log_probs_from_the_rollout_are_lagged():
    lags = edge_lags(grpo.build(recompute_old_log_probs=False), 1)
    assert _lag(lags, "old_log_probs_from_rollout", "old_log_probs", "actor.update") == 1


def test_grpo_with_staleness_1_and_no_correction_is_refused():
    with pytest.raises(StalenessError) as info:
        check_staleness(grpo.build(), 1)
    err = info.value
    assert isinstance(err, GraphValidationError)
    assert (err.node, err.field, err.lag) == ("actor.update", "advantages", 1)
    text = str(err)
    assert "ppo_clip" in text and "grpo_advantage.advantages -> actor.update has lag 1" in text
    assert "actor.generate.response_mask -> actor.update (lag 1)" in text
    for correction in ("truncated_is_weight", "icepop_is_weight", "sequence_is_weight", "sequence_rejection_mask",
                       "ppo_clip_is"):
        assert correction in text
    assert "staleness 0" in err.hint and "allow_uncorrected_staleness" in err.hint
    check_staleness(grpo.build(), 0)  # on-policy: nothing is lagged


def test_the_lag_of_the_error_is_the_staleness():
    with pytest.raises(StalenessError) as info:
        check_staleness(grpo.build(), 2)
    assert info.value.lag == 2 and "has lag 2" in str(info.value)


def test_corrected_graphs_pass():
    lags = check_staleness(grpo_is.build(), 1)
    assert _lag(lags, "actor.generate", "rollout_log_probs", "truncated_is_weight") == 1
    assert _lag(lags, "truncated_is_weight", "is_weights", "actor.update") == 1


def test_a_rejection_mask_is_a_correction():
    @hf.algorithm
    def grpo_rejection(prompts, actor, reward, *, n=4):
        rollout = actor.generate(prompts, n=n)
        old_logp = actor.logprob(rollout)
        adv = hf.compute("grpo_advantage", rollout, reward.score(rollout))
        kept = hf.compute("sequence_rejection_mask", old_logp, rollout)
        actor.update(rollout.select("prompt_ids", "prompt_mask", "response_ids"), adv, old_logp, kept, loss="ppo_clip")

    check_staleness(grpo_rejection.build(), 1)


def test_ppo_refuses_the_actor_loss_not_the_critic_loss():
    # value_clip is no policy gradient: the critic's regression on old samples is not refused; ppo_clip is.
    with pytest.raises(StalenessError) as info:
        check_staleness(ppo.build(), 1)
    assert info.value.node == "actor.update"
    assert [n for n in ("ppo_clip", "reinforce", "gspo", "ppo_clip_is", "value_clip", "kl_loss", "entropy_bonus")
            if get_op(n).policy_gradient] == ["ppo_clip", "reinforce", "gspo", "ppo_clip_is"]


def test_a_correction_is_what_the_registry_declares():
    def my_weights(old_log_probs, rollout_log_probs, response_mask, *, cap=1.5):
        return (torch.clamp((old_log_probs - rollout_log_probs).exp(), max=cap) * response_mask,)

    def build():
        @hf.algorithm
        def custom(prompts, actor, reward, *, n=4):
            rollout = actor.generate(prompts, n=n)
            old_logp = actor.logprob(rollout)
            adv = hf.compute("grpo_advantage", rollout, reward.score(rollout))
            weights = hf.compute("my_is_weight_test", old_logp, rollout)
            actor.update(rollout, adv, old_logp, weights, loss="ppo_clip_is")
        return custom.build()

    fields = dict(inputs=get_op("truncated_is_weight").inputs, outputs=("is_weights: float32[B, R]",))
    register_op("my_is_weight_test", **fields)(my_weights)
    try:
        with pytest.raises(StalenessError):  # the same weights, not declared a correction
            check_staleness(build(), 1)
        register_op("my_is_weight_test", replace=True, correction="my weights", rollout_input="rollout_log_probs",
                    **fields)(my_weights)
        check_staleness(build(), 1)
    finally:
        unregister_op("my_is_weight_test")


def test_rollout_input_must_be_a_declared_input():
    with pytest.raises(OpRegistryError, match="rollout_input"):
        register_op("bad_correction_test", inputs=("old_log_probs: float32[B, R]",), outputs=("w: float32[B, R]",),
                    correction="x", rollout_input="rollout_log_probs")


def test_a_correction_reading_recomputed_log_probs_is_refused():
    graph = grpo_is.build()
    node = graph.node("truncated_is_weight")
    inputs = tuple(Input("rollout_log_probs", "actor.logprob", "old_log_probs") if i.name == "rollout_log_probs" else i
                   for i in node.inputs)
    bad = graph.with_nodes(tuple(dataclasses.replace(n, inputs=inputs) if n is node else n for n in graph.nodes))
    with pytest.raises(StalenessError) as info:
        validate(bad)
    assert (info.value.node, info.value.field) == ("truncated_is_weight", "rollout_log_probs")
    assert "infer node 'actor.logprob'" in str(info.value) and "not the rollout" in str(info.value)


def test_a_correction_needs_a_rollout_that_emits_log_probs():
    graph = grpo_is.build()
    gen = graph.node("actor.generate")
    outputs = Schema(tuple(f for f in gen.outputs.fields if f.name != "rollout_log_probs"))
    bad = graph.with_nodes(tuple(dataclasses.replace(n, outputs=outputs) if n is gen else n for n in graph.nodes))
    with pytest.raises(StalenessError) as info:
        validate(bad)
    err = info.value
    assert (err.node, err.field) == ("truncated_is_weight", "rollout_log_probs")
    assert "rollout node 'actor.generate', which does not emit 'rollout_log_probs'" in str(err)
