"""tools/bench_trl/parity.py: the summary math of ``bench_vs_trl.py learn --streams``, on hand-made numbers."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from tool_module import load_file

MODULE = Path(__file__).resolve().parents[2] / "tools" / "bench_trl" / "parity.py"


@pytest.fixture(scope="module")
def parity():
    return load_file(MODULE, "bench_trl_parity")


def _run(acc: dict[int, float], grad_gt1: int = 0, grad_max: float = 0.5, entropy: float = 1.0) -> dict:
    return {"acc": acc, "grad_gt1": grad_gt1, "grad_max": grad_max, "entropy_end": entropy}


def test_spread_by_hand(parity):
    # 0.2, 0.4, 0.9: mean 0.5, median 0.4; deviations -0.3, -0.1, 0.4 -> squares 0.09 + 0.01 + 0.16 = 0.26,
    # / (3 - 1) = 0.13, sd = sqrt(0.13) = 0.36056, se = 0.36056 / sqrt(3) = 0.20817.
    s = parity.spread([0.2, 0.4, 0.9])
    assert (s.n, s.mean, s.median) == (3, pytest.approx(0.5), 0.4)
    assert s.sd == pytest.approx(0.36056, abs=1e-5)
    assert s.se == pytest.approx(0.20817, abs=1e-5)
    one = parity.spread([0.7])
    assert one.mean == 0.7 and math.isnan(one.sd) and math.isnan(one.se)
    with pytest.raises(ValueError, match="at least one value"):
        parity.spread([])


def test_mann_whitney_by_hand(parity):
    # a = (3, 4), b = (1, 2, 3): 3 beats 1 and 2 and ties 3 (2.5), 4 beats all three (3): U = 5.5 of 6 pairs.
    # Pooled 1 2 3 3 4: one tie group of 2 -> sum(t^3 - t) = 6; n = 5.
    # var = 2 * 3 / 12 * (5 + 1 - 6 / (5 * 4)) = 0.5 * 5.7 = 2.85; z = (|5.5 - 3| - 0.5) / sqrt(2.85) = 1.18469;
    # two-sided p = erfc(z / sqrt 2) = erfc(0.83770) = 0.23614.
    greater, p = parity.mann_whitney([3, 4], [1, 2, 3])
    assert greater == pytest.approx(5.5 / 6)
    assert p == pytest.approx(0.23614, abs=1e-5)
    # swapping the sides swaps P(a > b) for P(b > a) and keeps p
    greater_b, p_b = parity.mann_whitney([1, 2, 3], [3, 4])
    assert greater_b == pytest.approx(0.5 / 6) and p_b == pytest.approx(p)
    # every value the same (all runs collapsed to one accuracy): no evidence either way
    assert parity.mann_whitney([0.1, 0.1], [0.1, 0.1, 0.1]) == (0.5, 1.0)


def test_bootstrap_interval(parity):
    # no spread on either side: every resample's difference is 0.5 - 0.2
    assert parity.bootstrap_diff_interval([0.5] * 3, [0.2] * 4) == (pytest.approx(0.3), pytest.approx(0.3))
    a, b = [0.1, 0.6, 0.8, 0.9], [0.3, 0.5, 0.55]
    lo, hi = parity.bootstrap_diff_interval(a, b)
    # a resample's mean lies between its side's min and max, so the difference lies in [0.1 - 0.55, 0.9 - 0.3]
    assert 0.1 - 0.55 <= lo < hi <= 0.9 - 0.3
    assert lo < 0.6 - 0.45 < hi  # the observed difference of the means is inside
    assert parity.bootstrap_diff_interval(a, b) == (lo, hi)  # fixed generator seed: the same figures every time


def test_compare_streams_level_curves_with_a_collapse(parity):
    # step 50: ours 0.6, 0.1 (collapsed), 0.8 -> mean 0.5, se 0.20817 (as in test_spread_by_hand's sd 0.36056);
    # theirs 0.5, 0.5 -> mean 0.5, se 0. Difference 0 with SE 0.20817: ours is at least theirs.
    runs = {"hybridflow": [_run({0: 0.1, 50: 0.6}, grad_gt1=2, grad_max=7.5, entropy=0.3),
                           _run({0: 0.1, 50: 0.1}, grad_gt1=0, entropy=0.1),
                           _run({0: 0.1, 50: 0.8}, grad_gt1=1, grad_max=1.5, entropy=0.2)],
            "trl": [_run({0: 0.1, 50: 0.5}, entropy=0.4), _run({0: 0.1, 50: 0.5}, grad_gt1=3, grad_max=2.0, entropy=0.6)]}
    result = parity.compare_streams(runs, [0, 50])
    step = result["steps"][50]
    assert step["diff"] == pytest.approx(0.0) and step["diff_se"] == pytest.approx(0.20817, abs=1e-5)
    assert step["p_greater"] == pytest.approx(4 / 6)  # 0.6 and 0.8 beat both 0.5s, 0.1 beats neither
    assert result["at_least"] and "at least trl's curve" in result["verdict"]
    # step 0: every run 0.1, so every resampled difference is 0 up to rounding (0.1 * 3 / 3 vs 0.1 * 2 / 2)
    assert "includes 0 at every checkpoint" in result["verdict"] and "lower" not in result["verdict"]
    ours, theirs = result["end"]["hybridflow"], result["end"]["trl"]
    assert (ours["collapsed"], theirs["collapsed"]) == (1, 0)
    assert (ours["grad_gt1"], ours["runs_with_spikes"], ours["grad_max"]) == (3, 2, 7.5)
    assert (theirs["grad_gt1"], theirs["runs_with_spikes"], theirs["grad_max"]) == (3, 1, 2.0)
    assert ours["entropy_end"]["spread"].mean == pytest.approx(0.2) and ours["entropy_end"]["absent"] == 0
    assert theirs["entropy_end"]["spread"].median == pytest.approx(0.5)


def test_compare_streams_names_steps_lower_within_one_se(parity):
    # step 50: ours 0.2, 0.6 (mean 0.4, se 0.2) vs theirs 0.4, 0.6 (mean 0.5, se 0.1): -0.1, SE sqrt(0.05) = 0.224
    runs = {"hybridflow": [_run({0: 0.1, 50: v}) for v in (0.2, 0.6)],
            "trl": [_run({0: 0.1, 50: v}) for v in (0.4, 0.6)]}
    result = parity.compare_streams(runs, [0, 50])
    assert result["steps"][50]["diff_se"] == pytest.approx(0.05 ** 0.5)
    assert result["at_least"]
    assert "at least trl's curve within 1 SE (its mean lower at steps [50])" in result["verdict"]


def test_entropy_of_a_run_that_trained_no_row_is_left_out(parity, capsys):
    # a run stuck at reward 0 skips every row, so its record has no entropy (nan in its summary)
    runs = {"hybridflow": [_run({0: 0.1, 50: 0.0}, entropy=float("nan")), _run({0: 0.1, 50: 0.5}, entropy=0.3),
                           _run({0: 0.1, 50: 0.6}, entropy=0.5)],
            "trl": [_run({0: 0.1, 50: v}, entropy=float("nan")) for v in (0.0, 0.0)]}
    result = parity.compare_streams(runs, [0, 50])
    ours, theirs = result["end"]["hybridflow"]["entropy_end"], result["end"]["trl"]["entropy_end"]
    assert (ours["spread"].n, ours["spread"].mean, ours["absent"]) == (2, pytest.approx(0.4), 1)
    assert theirs == {"spread": None, "absent": 2}
    parity.print_comparison(result, "title")
    out = capsys.readouterr().out
    assert "entropy over the last 10 steps mean 0.40, median 0.40 (1 runs trained no row there)" in out
    assert "entropy over the last 10 steps - (2 runs trained no row there)" in out


def test_compare_streams_names_the_steps_where_ours_is_behind(parity):
    # step 50: ours 0.10, 0.12, 0.11 (mean 0.11) vs theirs 0.5, 0.6 (mean 0.55): -0.44, far beyond one SE
    # (sqrt(0.01^2 / 3 + 0.0707^2 / 2) = 0.050); every resampled difference is below 0 (at most 0.12 - 0.5).
    runs = {"hybridflow": [_run({0: 0.1, 50: v}) for v in (0.10, 0.12, 0.11)],
            "trl": [_run({0: 0.1, 50: v}) for v in (0.5, 0.6)]}
    result = parity.compare_streams(runs, [0, 50])
    assert result["steps"][50]["diff"] == pytest.approx(-0.44)
    assert result["steps"][50]["diff_se"] == pytest.approx(0.0503, abs=1e-4)
    assert not result["at_least"]
    assert "below trl's curve" in result["verdict"] and "steps [50]" in result["verdict"]
    assert "below 0 at steps [50]" in result["verdict"]
    assert result["end"]["hybridflow"]["collapsed"] == 3 and result["end"]["trl"]["collapsed"] == 0


def test_compare_streams_refuses_steps_not_evaluated(parity):
    runs = {"hybridflow": [_run({0: 0.1, 50: 0.3})], "trl": [_run({0: 0.1, 25: 0.2, 50: 0.3})]}
    with pytest.raises(ValueError, match="step 25 was not evaluated in every run of \\['hybridflow'\\]"):
        parity.compare_streams(runs, [0, 25, 50])
    with pytest.raises(ValueError, match="compares two sides"):
        parity.compare_streams({"hybridflow": runs["hybridflow"]}, [0, 50])


def test_print_comparison_table(parity, capsys):
    runs = {"hybridflow": [_run({0: 0.1, 50: v}) for v in (0.4, 0.6)],
            "trl": [_run({0: 0.1, 50: v}) for v in (0.2, 0.4)]}
    parity.print_comparison(parity.compare_streams(runs, [0, 50]), "title")
    lines = capsys.readouterr().out.splitlines()
    row = next(l for l in lines if l.split()[:1] == ["50"]).split()
    # ours mean 0.5 median 0.5 sd 0.14; theirs 0.3 0.3 0.14; difference +0.2 +- sqrt(0.1^2 + 0.1^2) = 0.141;
    # P(ours > theirs) = 3.5 / 4 = 0.875 (ours' 0.4 beats 0.2 and ties 0.4, 0.6 beats both)
    assert row[:10] == ["50", "0.500", "0.50", "0.14", "0.300", "0.30", "0.14", "+0.200", "+-", "0.141"]
    assert row[-2] == "0.88"
    assert any(l.strip().startswith("verdict: hybridflow >= trl") for l in lines)
