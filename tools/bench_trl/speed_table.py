"""The speed mode's table: per side, medians of the step records and the ratios to TRL (tools/bench_vs_trl.py speed)."""
from __future__ import annotations

import statistics


def speed_figures(steps: dict[str, list[dict]], rows: int) -> dict[str, dict]:
    """Per side, medians over its step records (``time_s``, ``cpu_s``, ``response_length``: mean tokens of a row).

    ``cpu_us_per_token``: the median over steps of ``cpu_s / (rows * response_length)``, CPU
    microseconds per generated response token (EOS included): the sides' cost at equal work when,
    once they train, they sample responses of different lengths. ``vs_trl*``: TRL's figure over the side's.
    """
    result = {}
    for side, records in steps.items():
        cpu = [s.get("cpu_s", s["time_s"]) for s in records]
        result[side] = {"s_per_step": statistics.median(s["time_s"] for s in records),
                        "cpu_s_per_step": statistics.median(cpu),
                        "response_length": statistics.mean(s["response_length"] for s in records),
                        "tokens_per_s": statistics.median(rows * s["response_length"] / s["time_s"] for s in records),
                        "cpu_us_per_token": statistics.median(1e6 * c / (rows * s["response_length"])
                                                              for c, s in zip(cpu, records))}
    ref = result.get("trl")
    for r in result.values():
        if ref is not None:
            r.update(vs_trl=ref["s_per_step"] / r["s_per_step"], vs_trl_cpu=ref["cpu_s_per_step"] / r["cpu_s_per_step"],
                     vs_trl_per_token=ref["cpu_us_per_token"] / r["cpu_us_per_token"])
    return result


def print_speed(result: dict[str, dict]) -> None:
    """The speed table: one row per side (TRL's ratios need a ``trl`` side)."""
    print(f"  {'':18}{'s/step':>9}{'CPU s/step':>12}{'resp len':>10}{'tokens/s':>10}{'CPU us/tok':>12}"
          f"{'peak RSS MB':>13}{'vs TRL (wall)':>15}{'(CPU)':>8}{'(CPU/tok)':>11}")
    for side, r in result.items():
        print(f"  {side:18}{r['s_per_step']:9.3f}{r['cpu_s_per_step']:12.3f}{r['response_length']:10.2f}"
              f"{r['tokens_per_s']:10.0f}{r['cpu_us_per_token']:12.1f}{r.get('peak_rss_mb', 0):13.0f}"
              f"{r.get('vs_trl', float('nan')):14.2f}x{r.get('vs_trl_cpu', float('nan')):7.2f}x"
              f"{r.get('vs_trl_per_token', float('nan')):10.2f}x")


DISTURBED_WALL_OVER_CPU = 1.3
"""A one-thread round whose steps took this many times their CPU time (median) lost the core to another process."""


def wall_over_cpu(records: list[dict]) -> float:
    """Median over a round's steps of wall seconds over process CPU seconds (1.0: the run had its core to itself)."""
    return statistics.median(s["time_s"] / s["cpu_s"] for s in records if s.get("cpu_s", 0) > 0) if records else 1.0


def undisturbed(rounds: dict[str, list[list[dict]]], threads: int) -> tuple[dict[str, list[dict]], dict[str, list[int]]]:
    """Each side's step records from its undisturbed rounds, and the indices of the rounds left out.

    With one thread a run that other processes keep off its core shows it as wall time well above its
    CPU time (over :data:`DISTURBED_WALL_OVER_CPU`); such rounds are left out, unless every round of
    the side was disturbed (then all are kept and the list names them all). With more threads CPU time
    may exceed the wall clock and the test says nothing: every round is kept.
    """
    kept, dropped = {}, {}
    for side, side_rounds in rounds.items():
        bad = [i for i, r in enumerate(side_rounds) if threads == 1 and wall_over_cpu(r) > DISTURBED_WALL_OVER_CPU]
        use = [r for i, r in enumerate(side_rounds) if i not in bad] or side_rounds
        kept[side] = [s for r in use for s in r]
        dropped[side] = bad
    return kept, dropped
