"""One test per validation error: each corrupts the tiny graph (or traces a wrong algorithm) and checks
the specific exception, that it names the node (and field), and that it carries a hint."""
from __future__ import annotations

import dataclasses
import warnings

import pytest
from tiny_ops import tiny

from hybridflow.errors import GraphError, GraphValidationError, HybridflowError, OpError
from hybridflow.graph import (
    ComputeAttrs, CycleError, DoubleUpdateError, DuplicateNodeError, FrozenRoleUpdateError, Graph, Input,
    LossTerm, MissingFieldError, NodeOrderError, OpKindError, RoleKindError, Schema, TypeMismatchError,
    UndeclaredRoleError, UnknownAttrError, UnknownOpError, UnusedValueWarning, UpdateAttrs, UpdateOrderError,
    algorithm, compute, validate,
)
from hybridflow.graph.schema import parse_field


@pytest.fixture(scope="module")
def graph() -> Graph:
    return tiny.build()


def _replace_node(graph: Graph, target: str, **changes) -> Graph:
    return graph.with_nodes(tuple(dataclasses.replace(n, **changes) if n.name == target else n for n in graph.nodes))


def _raises(graph: Graph, error: type, node: str | None, field: str | None = None) -> GraphValidationError:
    with pytest.raises(error) as info:
        validate(graph)
    err = info.value
    assert isinstance(err, GraphValidationError) and isinstance(err, HybridflowError)
    assert err.node == node and (field is None or err.field == field)
    assert err.hint and "hint:" in str(err)
    return err


def test_the_tiny_graph_is_valid_and_warns_of_nothing(graph):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert validate(graph) == []


def test_cycle(graph):
    # actor.generate now reads its prompts from actor.logprob, which reads actor.generate: a loop.
    looped = _replace_node(graph, "actor.generate", inputs=(Input("prompt_ids", "actor.logprob", "old_log_probs"),
                                                             Input("prompt_mask", "prompts", "prompt_mask")))
    err = _raises(looped, CycleError, "actor.generate")
    assert "actor.generate -> actor.logprob -> actor.generate" in str(err)


def test_self_loop_is_a_cycle(graph):
    node = graph.node("t_adv")
    looped = _replace_node(graph, "t_adv", inputs=(Input("scores", "t_adv", "advantages"),) + node.inputs[1:])
    _raises(looped, CycleError, "t_adv")


def test_nodes_out_of_topological_order(graph):
    swapped = graph.with_nodes((graph.nodes[1], graph.nodes[0]) + graph.nodes[2:])
    _raises(swapped, NodeOrderError, "actor.logprob")


def test_duplicate_node_name(graph):
    _raises(_replace_node(graph, "ref.logprob", name="actor.logprob"), DuplicateNodeError, "actor.logprob")


def test_missing_producer(graph):
    dropped = graph.with_nodes(tuple(n for n in graph.nodes if n.name != "reward.score"))
    err = _raises(dropped, MissingFieldError, "t_adv", "scores")
    assert "'reward.score'" in str(err)


def test_missing_field_of_an_existing_producer(graph):
    node = graph.node("t_adv")
    wrong = _replace_node(graph, "t_adv", inputs=(Input("scores", "reward.score", "costs"),) + node.inputs[1:])
    err = _raises(wrong, MissingFieldError, "t_adv", "scores")
    assert "produces only scores" in str(err)


def test_input_the_op_does_not_take_is_missing(graph):
    node = graph.node("t_adv")
    _raises(_replace_node(graph, "t_adv", inputs=node.inputs[1:]), MissingFieldError, "t_adv", "scores")


def test_dtype_mismatch_between_declared_outputs_and_op(graph):
    wrong = _replace_node(graph, "reward.score", outputs=Schema.of("scores: int64[B*2]"))
    err = _raises(wrong, TypeMismatchError, "reward.score", "scores")
    assert "float32" in str(err)


def test_dtype_mismatch_of_a_graph_input(graph):
    wrong = dataclasses.replace(graph, inputs=(dataclasses.replace(graph.inputs[0], schema=Schema.of("prompt_ids: float32[B, P]", "prompt_mask: int64[B, P]")),))
    _raises(wrong, TypeMismatchError, "actor.generate", "prompt_ids")


def test_dim_mismatch_in_declared_outputs(graph):
    wrong = _replace_node(graph, "reward.score", outputs=Schema.of("scores: float32[B]"))  # generate made B*2 responses
    err = _raises(wrong, TypeMismatchError, "reward.score", "scores")
    assert "B*2" in str(err)


def test_dims_that_must_agree_across_inputs():
    # scores of the n=2 rollout, baseline of the n=1 greedy rollout: B*2 vs B cannot be mixed.
    @algorithm
    def mixed(prompts, actor, reward):
        rollout = actor.generate(prompts, n=2)
        greedy = actor.generate(prompts, greedy=True)
        adv = compute("t_baseline", rollout, reward.score(rollout), reward.score(greedy, as_="baseline_scores"))
        actor.update(rollout, adv, actor.logprob(rollout), loss="t_pg")

    with pytest.raises(TypeMismatchError) as info:
        mixed.build()
    assert info.value.node == "t_baseline" and info.value.field == "baseline_scores"
    assert "'B*2'" in str(info.value) and "'B'" in str(info.value)


def test_unknown_compute_op(graph):
    err = _raises(_replace_node(graph, "t_adv", op="no_such_op"), UnknownOpError, "t_adv")
    assert isinstance(err, OpError) and "@hybridflow.register_op" in str(err)


def test_unknown_model_op(graph):
    _raises(_replace_node(graph, "actor.logprob", op="generate"), UnknownOpError, "actor.logprob")


def test_unknown_loss_op(graph):
    _raises(_replace_node(graph, "critic.update", attrs=UpdateAttrs((LossTerm("no_such_loss"),))), UnknownOpError, "critic.update")


def test_loss_op_in_a_compute_node(graph):
    _raises(_replace_node(graph, "t_adv", op="t_pg", attrs=ComputeAttrs()), OpKindError, "t_adv")


def test_unknown_attribute_names_the_valid_ones(graph):
    err = _raises(_replace_node(graph, "t_adv", attrs=ComputeAttrs((("bogus", 1),))), UnknownAttrError, "t_adv")
    assert "scale" in str(err) and isinstance(err, OpError)


def test_update_of_a_frozen_role_by_declaration(graph):
    frozen = dataclasses.replace(graph, roles=tuple(dataclasses.replace(r, trainable=False) if r.name == "critic" else r for r in graph.roles))
    _raises(frozen, FrozenRoleUpdateError, "critic.update")


def test_update_of_a_frozen_role_in_the_dsl():
    @algorithm
    def bad(prompts, actor, ref):
        rollout = actor.generate(prompts)
        ref.update(rollout, ref.logprob(rollout), loss="t_kl")

    with pytest.raises(FrozenRoleUpdateError) as info:
        bad.build()
    assert info.value.node == "ref.update" and "frozen" in str(info.value)


def test_trainable_role_updated_twice():
    @algorithm
    def twice(prompts, actor, ref):
        rollout = actor.generate(prompts)
        actor.update(rollout, ref.logprob(rollout), loss="t_kl")
        actor.update(rollout, ref.logprob(rollout), loss="t_kl")

    with pytest.raises(DoubleUpdateError) as info:
        twice.build()
    assert info.value.node == "actor.update_2" and "'actor.update'" in str(info.value)


def test_undeclared_role(graph):
    missing = dataclasses.replace(graph, roles=tuple(r for r in graph.roles if r.name != "critic"))
    _raises(missing, UndeclaredRoleError, "critic.values")


def test_role_kind_that_cannot_run_the_op():
    @algorithm
    def judge_generates(prompts, actor, reward):
        reward.generate(prompts)

    with pytest.raises(RoleKindError, match="reward model"):
        judge_generates.build()


def test_loss_whose_model_inputs_the_role_cannot_compute():
    @algorithm
    def value_loss_on_actor(prompts, actor, critic):
        rollout = actor.generate(prompts)
        values = critic.values(rollout)
        actor.update(rollout, values, values.rename(values="advantages"), loss="t_vloss")

    with pytest.raises(RoleKindError) as info:
        value_loss_on_actor.build()
    assert info.value.field == "value_preds"


def test_compute_node_on_a_model_role(graph):
    _raises(_replace_node(graph, "t_adv", role="actor"), RoleKindError, "t_adv")


def test_update_before_a_read_of_the_same_weights():
    @algorithm
    def late_read(prompts, actor, ref):
        rollout = actor.generate(prompts)
        actor.update(rollout, ref.logprob(rollout), loss="t_kl")
        actor.generate(prompts, greedy=True)  # generates with weights the update may already have changed

    with pytest.raises(UpdateOrderError) as info:
        late_read.build()
    assert info.value.node == "actor.update" and "actor.generate_greedy" in str(info.value)


def test_unused_value_is_a_warning_not_an_error():
    @algorithm
    def wasteful(prompts, actor, ref, critic):
        rollout = actor.generate(prompts)
        critic.values(rollout)
        actor.update(rollout, ref.logprob(rollout), loss="t_kl")

    with pytest.warns(UnusedValueWarning, match="critic.values"):
        graph = wasteful.build()
    with pytest.warns(UnusedValueWarning):
        found = validate(graph)
    assert len(found) == 1 and "values" in str(found[0])


def test_validate_rejects_what_is_not_a_graph():
    with pytest.raises(GraphError):
        validate({"nodes": []})


def test_records_reject_malformed_values():
    with pytest.raises(GraphError):
        Input("1bad", "x", "y")
    with pytest.raises(GraphError):
        parse_field("scores float32[B]")
    with pytest.raises(GraphError, match="twice"):
        Schema.of("a: float32", "a: int64")
    with pytest.raises(GraphError):
        UpdateAttrs(())
    with pytest.raises(GraphError):
        ComputeAttrs((("x", float("nan")),))
