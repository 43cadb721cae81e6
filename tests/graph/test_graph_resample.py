"""Dynamic sampling in the IR and DSL: the Resample record, its forms, its validation, its expected rounds."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hybridflow as hf
from hybridflow.algorithms import ALGORITHMS
from hybridflow.errors import GraphError, TraceError
from hybridflow.graph import Graph, Resample, ResampleError, validate
from hybridflow.graph.resampling import expected_rounds


def test_dapo_records_its_region_and_both_forms_round_trip():
    graph = ALGORITHMS["dapo"].build(n=4, max_rounds=5, expected_keep=0.25)
    (region,) = graph.resample
    assert region.nodes == ("actor.generate", "reward.score", "uniform_group_filter")
    assert (region.filter, region.max_rounds, region.expected_keep) == ("uniform_group_filter", 5, 0.25)
    assert Graph.from_json(graph.to_json()) == graph and Graph.from_text(graph.to_text()) == graph
    assert 'resample {"nodes": ["actor.generate", "reward.score", "uniform_group_filter"]' in graph.to_text()
    assert "resample" not in ALGORITHMS["grpo"].build().to_json()  # graphs without a region keep their old form
    assert graph.resample_of("reward.score") is region and graph.resample_of("actor.update") is None


def _region_graph(body_extra=None, outside_reads_prompts=False, keep=True):
    @hf.algorithm
    def algo(prompts, actor, reward, *, n=4):
        with hf.resample(max_rounds=2) as rounds:
            rollout = actor.generate(prompts, n=n)
            scores = reward.score(rollout)
            if keep:
                rounds.keep(hf.compute("uniform_group_filter", rollout, scores))
        if outside_reads_prompts:
            actor.generate(prompts, n=1, greedy=True)
        adv = hf.compute("grpo_advantage", rollout, scores)
        actor.update(rollout, adv, actor.logprob(rollout), loss="ppo_clip")

    return algo


def test_dsl_errors():
    with pytest.raises(TraceError, match="rounds.keep"):
        _region_graph(keep=False).build()
    with pytest.raises(ResampleError, match="draws anew every round"):
        _region_graph(outside_reads_prompts=True).build()

    @hf.algorithm
    def nested(prompts, actor, reward):
        with hf.resample():
            with hf.resample():
                pass

    with pytest.raises(TraceError, match="nested"):
        nested.build()


@pytest.mark.parametrize("edit, message", [
    (lambda g, r: replace(r, filter="reward.score"), "compute node with an output 'keep: bool"),
    (lambda g, r: replace(r, filter="grpo_advantage"), "not in the resampled nodes"),
    (lambda g, r: replace(r, nodes=("actor.generate", "uniform_group_filter")), "reads 'reward.score', which is outside"),
    (lambda g, r: replace(r, nodes=("reward.score", "uniform_group_filter")), "no generate node"),
    (lambda g, r: replace(r, nodes=r.nodes + ("actor.update",)), "update cannot be resampled"),
    (lambda g, r: replace(r, nodes=("uniform_group_filter", "actor.generate", "reward.score")), "not in graph order"),
    (lambda g, r: replace(r, filter="nope"), "not a node of the graph"),
])
def test_validation_names_what_is_wrong(edit, message):
    graph = ALGORITHMS["dapo"].build(n=4)
    bad = replace(graph, resample=(edit(graph, graph.resample[0]),))
    with pytest.raises(ResampleError, match=message):
        validate(bad)
    with pytest.raises(ResampleError, match="at most one"):
        validate(replace(graph, resample=graph.resample * 2))


@pytest.mark.parametrize("field, value", [("max_rounds", 0), ("max_rounds", True), ("expected_keep", 0.0),
                                          ("expected_keep", 1.5), ("nodes", ()), ("filter", "")])
def test_record_checks_its_own_fields(field, value):
    region = ALGORITHMS["dapo"].build().resample[0]
    with pytest.raises(ResampleError):
        replace(region, **{field: value})
    with pytest.raises(GraphError):
        Graph.from_json(ALGORITHMS["dapo"].build().to_json().replace('"max_rounds": 3', '"max_rounds": "3"'))


def test_expected_rounds_hand_worked():
    # one group kept with probability 1/2, at most 3 rounds: 1 + P(first fails) + P(first two fail) = 1 + 1/2 + 1/4
    assert expected_rounds(1, 0.5, 3) == pytest.approx(1.75)
    # two groups, keep 1/2, 2 rounds: 1 + P(Bin(2, 1/2) < 2) = 1 + 3/4
    assert expected_rounds(2, 0.5, 2) == pytest.approx(1.75)
    assert expected_rounds(8, 1.0, 4) == 1.0 and expected_rounds(8, 0.3, 1) == 1.0
    assert expected_rounds(1_000_000, 0.6, 3) == pytest.approx(2.0, abs=1e-6)  # large batches stay finite: ceil(1 / 0.6)
    with pytest.raises(ValueError):
        expected_rounds(0, 0.5, 3)


@settings(max_examples=15, deadline=None)
@given(groups=st.integers(1, 6), keep=st.floats(0.1, 1.0), max_rounds=st.integers(1, 4), seed=st.integers(0, 1000))
def test_expected_rounds_matches_a_simulation_of_the_loop(groups, keep, max_rounds, seed):
    rng, trials, total = random.Random(seed), 4000, 0
    for _ in range(trials):
        kept, rounds = 0, 0
        while rounds < max_rounds and (rounds == 0 or kept < groups):
            kept += sum(rng.random() < keep for _ in range(groups))
            rounds += 1
        total += rounds
    assert total / trials == pytest.approx(expected_rounds(groups, keep, max_rounds), abs=0.08)
