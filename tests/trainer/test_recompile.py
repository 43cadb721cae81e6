"""What explain says the calibrated model would choose now: a plan's placement as a pool spec compiles back to
the same placement, and the gain is the run's placement priced now against the new choice."""
from __future__ import annotations

import pytest

from hybridflow.algorithms import ALGORITHMS
from hybridflow.commands.explain import recompiled_lines
from hybridflow.compiler.compile import compile
from hybridflow.compiler.passes import BatchShape
from hybridflow.trainer.recompile import Recompiled, pool_spec, same_placement

BATCH = BatchShape(prompts=64, prompt_len=256, response_len=256)


def _plan(placement: str):
    return compile(ALGORITHMS["ppo"].build(), "a100-80g:1", {"actor": "qwen2.5-0.5b", "reward": "rule"}, placement=placement,
                   batch=BATCH)


@pytest.mark.parametrize("placement", ["colocate", "split", "actor(dp2,tp1,pp1)+ref(dp2,tp1,pp1)@2;critic(dp4,tp1,pp1)@4"])
def test_a_plans_pool_spec_compiles_back_to_its_placement(placement):
    plan = _plan(placement)
    spec = pool_spec(plan)
    assert "reward" not in spec  # a rule reward's host pool is the compiler's to add
    again = _plan(spec)
    assert same_placement(plan, again)
    assert again.predicted_iteration_s == pytest.approx(plan.predicted_iteration_s)


def test_placements_that_differ_are_told_apart():
    assert not same_placement(_plan("colocate"), _plan("split"))
    by_dp = _plan("actor(dp2,tp1,pp1)+ref(dp2,tp1,pp1)@2;critic(dp4,tp1,pp1)@4")
    by_tp = _plan("actor(dp2,tp1,pp1)+ref(dp2,tp1,pp1)@2;critic(dp2,tp2,pp1)@4")
    assert not same_placement(by_dp, by_tp)  # the same pools, another layout


def test_the_gain_is_the_runs_placement_priced_now_against_the_new_choice():
    run, now = _plan("colocate"), _plan("split")
    lines = recompiled_lines(Recompiled(now, (), True, run_placement_now_s=2.0 * now.predicted_iteration_s), run, 9.0)
    assert lines[0].startswith("what the cost model would choose now (calibrated on this machine now")
    assert any(line.startswith("  placement split: predicted iteration") for line in lines)
    gain = lines[-1]
    assert "the run's placement (colocate) priced now" in gain and "a predicted gain of x2.00" in gain
    assert "measured 9.0000 s" in gain
    same = recompiled_lines(Recompiled(run, (), True, None), run, None)
    assert same[-1].startswith("  the same placement as the run's: no gain from compiling again")
    refused = recompiled_lines(Recompiled(now, (), False, None, "no such pool"), run, None)
    assert refused[0].endswith("datasheet figures (the models are not local folders); the run's config and batch):")
    assert "cannot be priced now (no such pool)" in refused[-1]
