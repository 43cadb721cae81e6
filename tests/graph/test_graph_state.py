"""Run state: per-iteration compute-node parameters (Graph.with_params) and the rules that update them."""
from __future__ import annotations

import pytest
from tiny_ops import tiny

from hybridflow.errors import GraphError, TraceError
from hybridflow.graph import StateRule, algorithm, compute
from hybridflow.graph.state import advance, initial_state, node_params


def halve_toward(value: float, observed: float, *, n: int) -> float:
    """A toy controller: move halfway toward ``observed * n``."""
    return value + 0.5 * (observed * n - value)


SCALE = StateRule(name="scale", observes="obs/mean", update=halve_toward, hyper=("n",), feeds=(("t_adv", "scale"),),
                  metric="state/scale")


def test_with_params_changes_only_the_named_parameter():
    graph = tiny.build(scale=1.0)
    edited = graph.with_params({"t_adv": {"scale": 0.25}})
    assert edited.node("t_adv").attrs.params == (("scale", 0.25),)
    assert graph.node("t_adv").attrs.params == (("scale", 1.0),)  # the original is untouched (frozen IR)
    assert [n for n in edited.nodes if n.name != "t_adv"] == [n for n in graph.nodes if n.name != "t_adv"]
    assert edited.attrs == graph.attrs and graph.with_params({}) is graph


@pytest.mark.parametrize("params, message", [
    ({"nope": {"scale": 1.0}}, "has no node nope"),
    ({"actor.generate": {"n": 3}}, "'actor.generate' is a generate node; only compute nodes"),
    ({"t_adv": {"clip": 0.1}}, "'t_adv' has no parameter clip; it has scale"),
    ({"t_adv": {"scale": [1.0]}}, "not a JSON scalar"),
])
def test_with_params_rejects_what_it_cannot_set(params, message):
    with pytest.raises(GraphError, match=message):
        tiny.build().with_params(params)


def test_rule_starts_from_the_attribute_feeds_the_node_and_advances_from_the_metric():
    graph = tiny.build(n=4, scale=2.0)
    state = initial_state((SCALE,), graph)
    assert state == {"scale": 2.0}
    assert node_params((SCALE,), graph, state) == {"t_adv": {"scale": 2.0}}
    # 2 + 0.5 * (0.5 * 4 - 2) = 2.0; then 2 + 0.5 * (1.5 * 4 - 2) = 4.0
    assert advance((SCALE,), graph, state, {"obs/mean": 0.5}) == {"scale": 2.0}
    assert advance((SCALE,), graph, state, {"obs/mean": 1.5, "other": 9.0}) == {"scale": 4.0}
    assert state == {"scale": 2.0}  # advance returns a new state


def test_advance_names_a_metric_the_step_did_not_report():
    graph = tiny.build()
    with pytest.raises(GraphError, match="updated from metric 'obs/mean', which the step .* did not report"):
        advance((SCALE,), graph, {"scale": 1.0}, {"actor/pg_loss": 0.1})


def test_a_rule_that_feeds_no_node_is_an_error():
    rule = StateRule(name="scale", observes="obs/mean", update=halve_toward, feeds=(("t_baseline", "scale"),),
                     metric="state/scale")
    with pytest.raises(GraphError, match="no compute node with that op and parameter"):
        node_params((rule,), tiny.build(), {"scale": 1.0})


def test_algorithm_state_must_name_its_attributes():
    with pytest.raises(TraceError, match=r"state 'scale' reads attribute\(s\) \['scale', 'n'\]"):
        @algorithm(state=(SCALE,))
        def no_attrs(prompts, actor, reward):
            rollout = actor.generate(prompts)
            compute("t_adv", rollout, reward.score(rollout))

    @algorithm(state=(SCALE,))
    def with_attrs(prompts, actor, reward, *, n=1, scale=1.0):
        rollout = actor.generate(prompts, n=n)
        compute("t_adv", rollout, reward.score(rollout), scale=scale)

    assert with_attrs.state == (SCALE,) and tiny.state == ()
