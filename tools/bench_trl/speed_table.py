"""The speed mode's tables (tools/bench_vs_trl.py speed): per side, medians of the step records, the ratios to
TRL and the achieved GFLOP/s."""
from __future__ import annotations

import statistics
from pathlib import Path

from flops import ModelShape


LENGTH_TOLERANCE = 0.05
"""Ratios to TRL are printed only when the side's mean response length is within this fraction of TRL's."""


def speed_figures(steps: dict[str, list[dict]], rows: int) -> dict[str, dict]:
    """Per side, medians over its step records (``time_s``, ``cpu_s``, ``response_length``: mean tokens of a row).

    ``cpu_us_per_token``: CPU microseconds per generated response token (EOS included) over all the side's
    steps, their CPU seconds summed over their tokens summed (``tokens_per_s`` likewise, on the wall clock). A
    step costs a fixed part (the decode runs to its longest row; the update's launches) and a part per token, and
    the steps of a side differ in length: a median of per-step figures picks one step of each side, at different
    lengths, and charges their fixed parts to different token counts. (On the ~8M bench model, 64 new tokens,
    TRL's three steps a round were 37.8, 37.8 and 27.1 tokens long at about the same cost, 5.7-6.0 CPU s; its
    median fell on a long one: ours at 34.7 tokens a step came out 2.01x TRL's speed per token by medians, 2.14x
    by sums, 2.09x per step.) The sums weight every step by its tokens. ``gen_cpu_s`` / ``update_cpu_s``: the
    median CPU seconds of a step spent in generation and in the rest of it (reward, advantages, the
    update), where the records time generation. ``vs_trl*``: TRL's figure over the side's, only when
    the side's mean response length is within :data:`LENGTH_TOLERANCE` of TRL's (``same_work``):
    at different lengths the sides did different work and a ratio would say nothing about speed.
    """
    result = {}
    for side, records in steps.items():
        cpu = [s.get("cpu_s", s["time_s"]) for s in records]
        tokens = rows * sum(s["response_length"] for s in records)
        result[side] = {"s_per_step": statistics.median(s["time_s"] for s in records),
                        "cpu_s_per_step": statistics.median(cpu),
                        "response_length": statistics.mean(s["response_length"] for s in records),
                        "tokens_per_s": tokens / sum(s["time_s"] for s in records),
                        "cpu_us_per_token": 1e6 * sum(cpu) / tokens}
        if all("gen_cpu_s" in s for s in records):
            result[side].update(gen_cpu_s=statistics.median(s["gen_cpu_s"] for s in records),
                                update_cpu_s=statistics.median(c - s["gen_cpu_s"] for c, s in zip(cpu, records)))
    ref = result.get("trl")
    for r in result.values():
        if ref is not None:
            r["same_work"] = abs(r["response_length"] - ref["response_length"]) <= LENGTH_TOLERANCE * ref["response_length"]
            if r["same_work"]:
                r.update(vs_trl=ref["s_per_step"] / r["s_per_step"], vs_trl_cpu=ref["cpu_s_per_step"] / r["cpu_s_per_step"],
                         vs_trl_per_token=ref["cpu_us_per_token"] / r["cpu_us_per_token"])
    return result


def print_speed(result: dict[str, dict]) -> None:
    """The speed table: one row per side (TRL's ratios need a ``trl`` side)."""
    print(f"  {'':18}{'s/step':>9}{'CPU s/step':>12}{'resp len':>10}{'tokens/s':>10}{'CPU us/tok':>12}"
          f"{'peak RSS MB':>13}{'vs TRL (wall)':>15}{'(CPU)':>8}{'(CPU/tok)':>11}")
    for side, r in result.items():
        ratios = (f"{r['vs_trl']:14.2f}x{r['vs_trl_cpu']:7.2f}x{r['vs_trl_per_token']:10.2f}x" if "vs_trl" in r else
                  f"  {'none: lengths differ > 5%' if r.get('same_work') is False else '':>32}")
        print(f"  {side:18}{r['s_per_step']:9.3f}{r['cpu_s_per_step']:12.3f}{r['response_length']:10.2f}"
              f"{r['tokens_per_s']:10.0f}{r['cpu_us_per_token']:12.1f}{r.get('peak_rss_mb', 0):13.0f}" + ratios)
    if any(r.get("same_work") is False for r in result.values()):
        print(f"  (no ratio where a side's mean response length differs from TRL's by more than "
              f"{LENGTH_TOLERANCE:.0%}: different work)")


def add_arithmetic(result: dict[str, dict], model_dir: Path, batch: tuple[int, int]) -> None:
    """Each side's achieved GFLOP/s of generation and of the rest of the step (tools/bench_trl/flops.py counts);
    ``batch``: prompts and group size of a step."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from common import load_tokenizer

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))  # only its shape is read
    shape = ModelShape.of(model)
    prompt_len = len(load_tokenizer(model_dir)("3+4=")["input_ids"])
    for r in result.values():
        if "gen_cpu_s" not in r:
            continue
        work = (*batch, prompt_len, r["response_length"])
        r.update(gen_gflops=shape.generation(*work) / r["gen_cpu_s"] / 1e9,
                 update_gflops=shape.update(*work) / max(r["update_cpu_s"], 1e-9) / 1e9)


def print_arithmetic(result: dict[str, dict], peak_gflops: float) -> None:
    """Achieved GFLOP/s of generation and of the rest of the step, and their fractions of the matmul peak."""
    print(f"  achieved arithmetic (CPU time; FLOPs counted as in tools/bench_trl/flops.py), this CPU's fp32 matmul "
          f"peak {peak_gflops:.1f} GFLOP/s:")
    print(f"  {'':18}{'gen CPU s':>10}{'GFLOP/s':>9}{'of peak':>9}{'update CPU s':>14}{'GFLOP/s':>9}{'of peak':>9}")
    for side, r in result.items():
        if "gen_gflops" in r:
            # a side that skips zero-advantage rows did not compute the update's counted FLOPs: no figure
            update = (f"{r['update_gflops']:9.2f}{r['update_gflops'] / peak_gflops:9.1%}"
                      if r["update_gflops"] <= peak_gflops and not r.get("skips_rows") else f"{'rows skipped':>18}")
            print(f"  {side:18}{r['gen_cpu_s']:10.3f}{r['gen_gflops']:9.2f}{r['gen_gflops'] / peak_gflops:9.1%}"
                  f"{r['update_cpu_s']:14.3f}" + update)


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
