"""The tracing DSL: field resolution by name, attributes, symbolic batch dims, role handling, misuse."""
from __future__ import annotations

import pytest
from tiny_ops import tiny

from hybridflow.errors import OpError, TraceError
from hybridflow.graph import (
    AmbiguousFieldError, MissingFieldError, Role, UnknownAttrError, UnknownOpError, algorithm, compute, loss,
)
from hybridflow_ops.registry import register_op, unregister_op


def test_build_records_attributes_and_overrides():
    graph = tiny.build()
    assert dict(graph.attrs) == {"n": 2, "scale": 1.0, "kl_weight": 0.1}
    assert tiny.defaults == {"n": 2, "scale": 1.0, "kl_weight": 0.1}
    other = tiny.build(n=4, scale=0.5)
    assert other.attr("n") == 4 and other.node("t_adv").attrs.params == (("scale", 0.5),)
    assert other.node("actor.generate").outputs.get("response_ids").dims == ("B*4", "R")
    assert graph != other and tiny.build() == graph  # tracing is deterministic


def test_unknown_override_names_the_attributes():
    with pytest.raises(TraceError, match="kl_weight, n, scale|n, scale, kl_weight"):
        tiny.build(clip=0.1)


def test_inputs_are_resolved_by_field_name_from_the_union_of_values():
    node = tiny.build().node("t_adv")
    assert [(i.name, i.source, i.field) for i in node.inputs] == [
        ("scores", "reward.score", "scores"), ("response_mask", "actor.generate", "response_mask")]
    update = tiny.build().node("actor.update")
    # the sequences the actor is run over during the update, then the loss terms' inputs in term order
    assert [(i.name, i.source) for i in update.inputs] == [
        ("prompt_ids", "actor.generate"), ("prompt_mask", "actor.generate"), ("response_ids", "actor.generate"),
        ("response_mask", "actor.generate"), ("old_log_probs", "actor.logprob"), ("advantages", "t_adv"),
        ("ref_log_probs", "ref.logprob")]
    assert [(t.op, t.weight, t.params) for t in update.attrs.terms] == [("t_pg", 1.0, (("clip", 0.3),)), ("t_kl", 0.1, ())]


def test_missing_field_names_op_field_and_given_values():
    @algorithm
    def no_scores(prompts, actor):
        rollout = actor.generate(prompts)
        compute("t_adv", rollout)

    with pytest.raises(MissingFieldError) as info:
        no_scores.build()
    text = str(info.value)
    assert "'t_adv'" in text and "'scores'" in text and "actor.generate(prompt_ids" in text
    assert info.value.field == "scores"


def test_ambiguous_field():
    @algorithm
    def two_scores(prompts, actor, reward):
        rollout = actor.generate(prompts)
        compute("t_adv", rollout, reward.score(rollout), reward.score(rollout))

    with pytest.raises(AmbiguousFieldError, match="reward.score.scores, reward.score_2.scores"):
        two_scores.build()


def test_same_field_through_two_views_of_one_producer_is_not_ambiguous():
    @algorithm
    def views(prompts, actor, reward):
        rollout = actor.generate(prompts)
        scores = reward.score(rollout)
        adv = compute("t_adv", rollout, scores, scores.select("scores"), rollout.select("response_mask"))
        actor.update(rollout, adv, actor.logprob(rollout), loss="t_pg")

    assert views.build().node("t_adv").inputs[0].source == "reward.score"


def test_unknown_attribute_is_an_op_error_naming_valid_ones():
    @algorithm
    def bogus(prompts, actor, reward):
        rollout = actor.generate(prompts)
        compute("t_adv", rollout, reward.score(rollout), bogus=1)

    with pytest.raises(UnknownAttrError) as info:
        bogus.build()
    assert isinstance(info.value, OpError) and "scale" in str(info.value)


def test_unknown_op_at_trace_time():
    @algorithm
    def unknown(prompts, actor):
        compute("not_registered", actor.generate(prompts))

    with pytest.raises(UnknownOpError):
        unknown.build()


def test_attribute_values_must_be_json_scalars():
    @algorithm
    def list_attr(prompts, actor, reward):
        rollout = actor.generate(prompts)
        compute("t_adv", rollout, reward.score(rollout), scale=[1, 2])

    with pytest.raises(UnknownAttrError, match="JSON scalar"):
        list_attr.build()


def test_generate_scales_the_batch_dim_and_gives_each_rollout_its_own_length():
    @algorithm
    def two_rollouts(prompts, actor, reward):
        rollout = actor.generate(prompts, n=3)
        greedy = actor.generate(prompts, greedy=True)
        adv = compute("t_adv", rollout, reward.score(rollout))
        compute("t_adv", greedy, reward.score(greedy))
        actor.update(rollout, adv, actor.logprob(rollout), loss="t_pg")

    graph = two_rollouts.trace()
    assert graph.node("actor.generate").outputs.get("response_mask").dims == ("B*3", "R")
    assert graph.node("actor.generate_greedy").outputs.get("response_mask").dims == ("B", "R2")
    assert graph.node("t_adv_2").outputs.get("advantages").dims == ("B", "R2")


def test_score_as_renames_the_field_and_the_node():
    @algorithm
    def remax_like(prompts, actor, reward):
        rollout = actor.generate(prompts)
        greedy = actor.generate(prompts, greedy=True)
        adv = compute("t_baseline", rollout, reward.score(rollout), reward.score(greedy, as_="baseline_scores"))
        actor.update(rollout, adv, actor.logprob(rollout), loss="t_pg")

    graph = remax_like.build()
    assert graph.node("reward.baseline_scores").outputs.names == ("baseline_scores",)
    assert graph.node("t_baseline").outputs.get("advantages").dims == ("B", "R")


def test_user_registered_op_works_like_a_builtin():
    @register_op("t_user_double", inputs=("advantages: float32[B, R]",), outputs=("advantages: float32[B, R]",), replace=True)
    def double(advantages, *, factor=2.0):
        return (advantages * factor,)

    @algorithm
    def user(prompts, actor, reward, *, factor=3.0):
        rollout = actor.generate(prompts)
        adv = compute("t_user_double", compute("t_adv", rollout, reward.score(rollout)), factor=factor)
        actor.update(rollout, adv, actor.logprob(rollout), loss="t_pg")

    try:
        node = user.build().node("t_user_double")
        assert node.attrs.params == (("factor", 3.0),) and node.inputs[0].source == "t_adv"
    finally:
        unregister_op("t_user_double")


def test_custom_roles_and_unused_roles():
    @algorithm(name="judged", roles={"judge": "reward", "teacher": Role("teacher", "reference", False)})
    def judged(prompts, actor, judge, teacher, ref):
        rollout = actor.generate(prompts)
        adv = compute("t_adv", rollout, judge.score(rollout))
        actor.update(rollout, adv, actor.logprob(rollout), loss="t_pg")

    graph = judged.build()
    assert graph.name == "judged"
    assert [(r.name, r.kind, r.trainable) for r in graph.roles] == [("actor", "policy", True), ("judge", "reward", False)]


def test_unknown_role_parameter_is_rejected_at_decoration():
    with pytest.raises(TraceError, match="roles="):
        @algorithm
        def odd(prompts, helper):
            pass


def test_attribute_defaults_must_be_scalars():
    with pytest.raises(TraceError, match="JSON scalar"):
        @algorithm
        def odd(prompts, actor, *, sizes=(1, 2)):
            pass


def test_misuse_is_a_trace_error():
    @algorithm
    def branches(prompts, actor, reward):
        rollout = actor.generate(prompts)
        if reward.score(rollout):
            pass

    with pytest.raises(TraceError, match="if/while"):
        branches.build()

    @algorithm
    def returns(prompts, actor):
        return actor.generate(prompts)

    with pytest.raises(TraceError, match="returns nothing"):
        returns.build()

    with pytest.raises(TraceError, match="only be called inside"):
        compute("t_adv")
    with pytest.raises(TraceError, match="build"):
        tiny(None, None, None, None, None)


def test_values_cannot_cross_builds():
    leaked = []

    @algorithm
    def leak(prompts, actor, reward):
        rollout = actor.generate(prompts)
        if leaked:
            compute("t_adv", leaked[0], reward.score(rollout))
        leaked.append(rollout)

    leak.trace()  # keeps its rollout in `leaked`
    with pytest.raises(TraceError, match="another build"):
        leak.trace()


def test_update_loss_forms():
    @algorithm
    def mixed_forms(prompts, actor, ref):
        rollout = actor.generate(prompts)
        actor.update(rollout, ref.logprob(rollout), loss=loss("t_kl"), clip=0.1)

    with pytest.raises(TraceError, match="inside the terms"):
        mixed_forms.build()


def test_value_rename_and_select():
    @algorithm
    def views(prompts, actor, reward):
        rollout = actor.generate(prompts)
        scores = reward.score(rollout)
        assert scores.rename(scores="baseline_scores").fields.names == ("baseline_scores",)
        assert rollout.select("response_mask", "group_index").fields.names == ("response_mask", "group_index")
        assert scores.producers == ("reward.score",)
        with pytest.raises(TraceError):
            scores.rename(missing="x")
        with pytest.raises(TraceError):
            rollout.rename(prompt_ids="prompt_mask")
        with pytest.raises(TraceError):
            rollout.select("nope")
        actor.update(rollout, compute("t_adv", rollout, scores), actor.logprob(rollout), loss="t_pg")

    views.build()
