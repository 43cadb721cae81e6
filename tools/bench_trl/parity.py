"""Learning parity over sampling streams: the summary math of ``tools/bench_vs_trl.py learn --streams``.

A run's greedy accuracy at a given step depends as much on its sampling stream as on the
framework (on this task the stream alone spreads step-200 accuracy by sd 0.2-0.35 on either
side, and about one stream in seven collapses to a constant answer), so one run per side and
seed says little. ``--streams N`` runs N streams per side on each model folder; this module
turns those runs into distributions per checkpoint step and compares them:

- per side: n, mean, median, sd (n - 1), standard error of the mean,
- ours - theirs: difference of the means, its standard error ``sqrt(se_a^2 + se_b^2)`` (the streams
  of the two sides are independent draws), a percentile bootstrap 95% interval of that
  difference (resampling each side's runs, fixed generator seed), and Mann-Whitney's
  ``P(a > b) + P(a = b) / 2`` with a two-sided p-value (normal approximation, tie and continuity
  corrected),
- per side at the end: runs "collapsed" (final accuracy below ``COLLAPSE_BELOW``), gradient norms
  above 1 (steps, runs with any, largest), entropy over the last 10 steps (over the runs that measured
  it: a run whose rewards were all equal in those steps trained no row and has none).

The verdict: the first side's curve is "at least" the second's when at every checkpoint its mean
is at least the other's minus one standard error of the difference (the checkpoints where its
mean is lower, by less than that, are named); a checkpoint where the bootstrap interval lies
wholly above or below 0 is named as a clear difference.

Pure Python (statistics, random, math): it runs in either environment and is tested on
hand-made numbers (tests/tools/test_bench_vs_trl_streams.py).
"""
from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Sequence

__all__ = ["COLLAPSE_BELOW", "Spread", "bootstrap_diff_interval", "compare_streams", "mann_whitney", "print_comparison",
           "spread"]

COLLAPSE_BELOW = 0.2
"""A run whose final greedy accuracy is below this has collapsed (chance on this task is about 0.1)."""

_ROUNDING = 1e-9
"""A bootstrap bound this close to 0 is 0 (equal runs on both sides give means a rounding apart)."""


@dataclass(frozen=True)
class Spread:
    """How one side's runs are spread at one step."""

    n: int
    mean: float
    median: float
    sd: float
    """Sample standard deviation (n - 1); nan for one run."""
    se: float
    """Standard error of the mean, sd / sqrt(n); nan for one run."""


def spread(values: Sequence[float]) -> Spread:
    """n, mean, median, sd and standard error of ``values`` (at least one)."""
    if not values:
        raise ValueError("spread() needs at least one value: no run recorded this step")
    n = len(values)
    sd = statistics.stdev(values) if n > 1 else float("nan")
    return Spread(n, statistics.fmean(values), statistics.median(values), sd, sd / math.sqrt(n))


def mann_whitney(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """``(P(a > b) + P(a = b) / 2, two-sided p)`` of Mann-Whitney's U test of ``a`` against ``b``.

    U counts the pairs (x in a, y in b) with x > y, ties a half. The p-value uses the normal
    approximation: mean ``n_a n_b / 2``, variance ``n_a n_b / 12 * (n + 1 - sum(t^3 - t) / (n (n - 1)))``
    over the tie groups t of the pooled values, and a continuity correction of 1/2 (p = 1 when
    every value ties).
    """
    na, nb = len(a), len(b)
    u = sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in a for y in b)
    n = na + nb
    ties = sum(t ** 3 - t for t in _counts(list(a) + list(b)))
    var = na * nb / 12 * (n + 1 - ties / (n * (n - 1)))
    if var <= 0:
        return u / (na * nb), 1.0
    z = max(abs(u - na * nb / 2) - 0.5, 0.0) / math.sqrt(var)
    return u / (na * nb), math.erfc(z / math.sqrt(2))


def _measured(values: list[float]) -> dict:
    """Spread of the values that are not nan, and how many are (entropy is absent from a run whose last
    steps trained no row: every reward of the step equal, so every advantage 0)."""
    kept = [v for v in values if not math.isnan(v)]
    return {"spread": spread(kept) if kept else None, "absent": len(values) - len(kept)}


def _counts(values: list[float]) -> list[int]:
    groups: dict[float, int] = {}
    for v in values:
        groups[v] = groups.get(v, 0) + 1
    return list(groups.values())


def bootstrap_diff_interval(a: Sequence[float], b: Sequence[float], *, resamples: int = 4000, seed: int = 0,
                            level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of ``mean(a) - mean(b)``, each side resampled with replacement."""
    rng = random.Random(seed)
    diffs = sorted(statistics.fmean(rng.choices(a, k=len(a))) - statistics.fmean(rng.choices(b, k=len(b)))
                   for _ in range(resamples))
    tail = (1 - level) / 2
    return diffs[int(tail * resamples)], diffs[min(int((1 - tail) * resamples), resamples - 1)]


def compare_streams(runs: dict[str, list[dict]], checkpoints: Sequence[int]) -> dict:
    """The comparison of two sides' runs (``summarise``'d records) at ``checkpoints``.

    ``runs`` maps each of two side names (first: the side judged) to its runs; each run is a dict
    with ``acc`` ({step: greedy accuracy}), ``grad_gt1``, ``grad_max`` and ``entropy_end``. Returns
    ``{"steps": {step: {...}}, "end": {side: {...}}, "verdict": str, "at_least": bool}``.
    """
    if len(runs) != 2:
        raise ValueError(f"compare_streams() compares two sides, got {sorted(runs)}")
    ours, theirs = runs
    by_step = {}
    for step in checkpoints:
        acc = {side: [r["acc"][step] for r in rs if step in r["acc"]] for side, rs in runs.items()}
        missing = [side for side, values in acc.items() if len(values) < len(runs[side])]
        if missing:
            raise ValueError(f"step {step} was not evaluated in every run of {missing}: choose checkpoints "
                             f"that are multiples of --eval-every")
        a, b = acc[ours], acc[theirs]
        sa, sb = spread(a), spread(b)
        auc, p = mann_whitney(a, b)
        by_step[step] = {ours: sa, theirs: sb, "diff": sa.mean - sb.mean, "diff_se": math.hypot(sa.se, sb.se),
                         "interval": bootstrap_diff_interval(a, b, seed=step), "p_greater": auc, "p_value": p}
    last = checkpoints[-1]
    end = {side: {"runs": len(rs), "collapsed": sum(r["acc"][last] < COLLAPSE_BELOW for r in rs),
                  "grad_gt1": sum(r["grad_gt1"] for r in rs), "runs_with_spikes": sum(r["grad_gt1"] > 0 for r in rs),
                  "grad_max": max(r["grad_max"] for r in rs),
                  "entropy_end": _measured([r["entropy_end"] for r in rs])} for side, rs in runs.items()}
    behind = [s for s, c in by_step.items() if c["diff"] < -c["diff_se"]]
    above = [s for s, c in by_step.items() if c["interval"][0] > _ROUNDING]
    below = [s for s, c in by_step.items() if c["interval"][1] < -_ROUNDING]
    lower = [s for s, c in by_step.items() if c["diff"] < -_ROUNDING]
    verdict = (f"{ours} more than 1 SE below {theirs} at steps {behind}: below {theirs}'s curve" if behind else
               f"{ours} >= {theirs} - 1 SE of the difference at every checkpoint: at least {theirs}'s curve"
               + (f" within 1 SE (its mean lower at steps {lower})" if lower else ""))
    verdict += (f"; bootstrap 95% interval of the difference above 0 at steps {above}" if above else "")
    verdict += (f"; below 0 at steps {below}" if below else "")
    if not above and not below:
        verdict += "; the bootstrap 95% interval of the difference includes 0 at every checkpoint"
    return {"steps": by_step, "end": end, "verdict": verdict, "at_least": not behind}


def _entropy_text(entropy: dict) -> str:
    text = (f"mean {entropy['spread'].mean:.2f}, median {entropy['spread'].median:.2f}" if entropy["spread"] else "-")
    return text + (f" ({entropy['absent']} runs trained no row there)" if entropy["absent"] else "")


def print_comparison(result: dict, title: str) -> None:
    """The table of ``compare_streams``' result."""
    ours, theirs = result["end"]
    print(f"\n{title}")
    print(f"  {'step':>4}  {ours + ' mean/median/sd':>27}  {theirs + ' mean/median/sd':>21}  "
          f"{'diff +- SE':>14}  {'bootstrap 95%':>15}  {'P(' + ours[:2] + '>' + theirs[:2] + ')':>9}  {'p':>5}")
    for step, c in result["steps"].items():
        a, b = c[ours], c[theirs]
        print(f"  {step:4d}  {a.mean:15.3f} {a.median:5.2f} {a.sd:5.2f}  {b.mean:9.3f} {b.median:5.2f} {b.sd:5.2f}  "
              f"{c['diff']:+6.3f} +- {c['diff_se']:.3f}  [{c['interval'][0]:+.3f}, {c['interval'][1]:+.3f}]  "
              f"{c['p_greater']:9.2f}  {c['p_value']:5.2f}")
    for side, e in result["end"].items():
        print(f"  {side}: {e['runs']} runs, collapsed (< {COLLAPSE_BELOW} at the end) {e['collapsed']}; "
              f"grad norm > 1 in {e['grad_gt1']} steps over {e['runs_with_spikes']} runs (max {e['grad_max']:.1f}); "
              f"entropy over the last 10 steps " + _entropy_text(e["entropy_end"]))
    print(f"  verdict: {result['verdict']}")
