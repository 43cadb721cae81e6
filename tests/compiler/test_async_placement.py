"""The rollout/training split per staleness k (hybridflow.compiler.async_placement), the plan's predicted step
with staleness (schedule pass), and `hybridflow simulate --staleness`."""
from __future__ import annotations

import math
import re
import warnings

import pytest

from hybridflow.algorithms import ALGORITHMS
from hybridflow.cli import main
from hybridflow.compiler.async_cost import predict_async
from hybridflow.compiler.async_placement import SplitCost, choose_split, rollout_carve_outs, split_costs
from hybridflow.compiler.cluster import ClusterSpec
from hybridflow.compiler.compile import compile, compile_report
from hybridflow.compiler.cost import CostOptions
from hybridflow.compiler.passes.schedule import async_parts
from hybridflow.compiler.workload import grpo_workload
from hybridflow.errors import ConfigError, PlacementError


def _hand_costs() -> list[SplitCost]:
    # 8 devices. Generation 2 s that no device count shortens (the longest response's decode) + 12 device-seconds;
    # training 8 device-seconds, scaling perfectly. Colocated: 2 + 12/8 + 8/8 = 4.5 s, one after the other.
    costs = [SplitCost(0, 8, 2 + 12 / 8, 8 / 8)]
    costs += [SplitCost(r, 8 - r, 2 + 12 / r, 8 / (8 - r)) for r in range(1, 8)]
    return costs


@pytest.mark.parametrize("k", [1, 2, 4])
def test_k_ge_1_picks_the_split_that_balances_generation_and_training(k):
    # split r: max(2 + 12/r, 8/(8-r)): r=4 max(5, 2) = 5; r=5 max(4.4, 2.67) = 4.4; r=6 max(4, 4) = 4; r=7 max(3.7, 8) = 8
    choice = choose_split(_hand_costs(), k)
    assert choice.best.rollout_devices == 6 and choice.step_s == pytest.approx(4.0)
    assert choice.best.gen_s == pytest.approx(choice.best.train_s)  # balanced
    # a 0.5 s sync is added to every split (collective): 4.5 vs colocated 4.5 -> the colocated one, given first
    synced = [c if not c.rollout_devices else SplitCost(c.rollout_devices, c.train_devices, c.gen_s, c.train_s, 0.5)
              for c in _hand_costs()]
    assert choose_split(synced, k).best.rollout_devices == 0


def test_k0_prefers_colocating():
    # k = 0: a split takes gen + train in turn on fewer devices each: r=6 4 + 4 = 8 > colocated 4.5
    choice = choose_split(_hand_costs(), 0)
    assert choice.best.rollout_devices == 0 and choice.step_s == pytest.approx(4.5)
    assert dict((c.rollout_devices, t) for c, t in choice.steps)[6] == pytest.approx(8.0)
    # without the colocated option, k = 0 minimises gen + train: r=3 (6 + 1.6 = 7.6) against r=4 (5 + 2 = 7)
    assert choose_split(_hand_costs()[1:], 0).best.rollout_devices == 4


def test_choice_equals_a_reference_minimum_over_splits():
    costs = _hand_costs()
    for k in (0, 1, 3):
        for cv, sync in ((0.0, "collective"), (0.8, "staged")):
            reference = min((c.gen_s + c.train_s if not c.rollout_devices else
                             predict_async(c.gen_s, c.train_s, k, gen_cv=cv, sync=sync), i) for i, c in enumerate(costs))
            choice = choose_split(costs, k, gen_cv=cv, sync=sync)
            assert (choice.step_s, costs.index(choice.best)) == reference


def test_no_split_is_a_named_error():
    with pytest.raises(ConfigError, match="at least one"):
        choose_split([], 1)
    with pytest.raises(PlacementError, match="no split"):
        choose_split([SplitCost(4, 4, math.inf, 1.0)], 1)


def test_split_costs_of_a_real_workload():
    workload = grpo_workload("llama2-7b", prompts=64, response_len=256)
    cluster = ClusterSpec.parse("a100-80g:1")
    costs = split_costs(workload, cluster)
    assert costs[0].rollout_devices == 0 and costs[0].train_devices == 8
    assert [r for r, _ in rollout_carve_outs(cluster)] == list(range(1, 8))
    # training a 7B actor (18 B/param of states, 126 GB) does not fit the one device rollout@7 leaves: left out
    assert [c.rollout_devices for c in costs[1:]] == list(range(1, 7))
    gens = [c.gen_s for c in costs[1:]]
    trains = [c.train_s for c in costs[1:]]
    assert gens == sorted(gens, reverse=True) and trains == sorted(trains)  # more devices, less time
    assert all(c.sync_s > 0 for c in costs[1:])


def _stale_plan(k: int, options: CostOptions | None = None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile(ALGORITHMS["grpo_is"].build(), "a100-80g:2", {"actor": "llama2-7b", "reward": "rule"},
                       staleness=k, options=options, placement="actor@8;actor.generate@8")


def test_plan_with_staleness_predicts_the_async_step():
    for k in (1, 2, 4):
        plan = _stale_plan(k)
        parts = async_parts(plan)
        makespan = max(op.predicted_end_s for op in plan.ops)
        # constant times, collective sync: S + max(G, T), the scheduled makespan itself, whatever k >= 1 is
        assert plan.predicted_iteration_s == pytest.approx(parts.sync_s + max(parts.gen_s, parts.train_s), rel=1e-12)
        assert plan.predicted_iteration_s == pytest.approx(makespan, rel=1e-12)
        assert parts.sync_s == pytest.approx(sum(op.predicted_end_s - op.predicted_start_s for op in plan.ops
                                                 if op.kind == "weight_sync" and op.iteration_offset == k))
    varying = CostOptions(generation_time_cv=0.8, async_weight_sync="staged")
    steps = {k: _stale_plan(k, varying).predicted_iteration_s for k in (1, 4)}
    assert steps[4] < steps[1]  # a deeper buffer absorbs the varying generation times


def test_compile_with_staleness_chooses_the_split_by_the_async_step():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = compile_report(ALGORITHMS["grpo_is"].build(), "a100-80g:1", {"actor": "llama2-7b", "reward": "rule"},
                                staleness=2)
    assert [label for label, _ in report.candidates] == [f"auto+rollout@{r}" for r in range(1, 7)]  # 7 leaves 1: OOM
    label, step = min(report.candidates, key=lambda lt: lt[1])
    assert report.plan.predicted_iteration_s == step
    rollout = report.plan.pool(report.plan.placement("actor").generation_pool)
    assert label == f"auto+rollout@{len(rollout.devices)}"
    # the chosen split is the one whose generation and training are closest: fewer rollout devices leave generation
    # the bottleneck, more leave training the bottleneck
    parts = async_parts(report.plan)
    assert report.plan.predicted_iteration_s == pytest.approx(parts.sync_s + max(parts.gen_s, parts.train_s))


def test_simulate_prints_throughput_against_k(capsys):
    assert main(["simulate", "grpo_is", "--models", "llama2-7b", "--gpus", "8", "--prompts", "64",
                 "--response-len", "256", "--staleness", "0,1,4", "--assume", "generation_time_cv=0.5",
                 "--assume", "async_weight_sync=staged"]) == 0
    printed = capsys.readouterr().out
    rows = [line.split() for line in printed.splitlines() if re.match(r"llama2-7b\s+8\s+\d", line)]
    assert [int(r[2]) for r in rows] == [0, 1, 4]
    assert "generation time CV 0.5, staged weight sync" in printed
    split_rates = [float(r[-6]) for r in rows]  # the split samples/s column, then "gen R | train T"
    assert split_rates[0] < split_rates[1] <= split_rates[2]
    assert main(["simulate", "grpo_is", "--gpus", "8", "--staleness", "1,x"]) == 1
    assert "--staleness" in capsys.readouterr().err


def test_compile_prints_the_async_step(tmp_path, capsys):
    argv = ["compile", "grpo_is", "--cluster", "a100-80g:2", "--model", "actor=llama2-7b", "reward=rule",
            "--placement", "actor@8;actor.generate@8", "-o", str(tmp_path / "plan.json")]
    assert main(argv + ["--staleness", "2"]) == 0
    printed = capsys.readouterr().out
    line = next(l for l in printed.splitlines() if "asynchronous step (staleness 2)" in l)
    assert re.search(r"generation [\d.]+ s, training [\d.]+ s, weight sync [\d.]+ s -> [\d.]+ s per step", line)
    assert main(argv) == 0
    assert "asynchronous step" not in capsys.readouterr().out  # on-policy: no such line
