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
