"""tools/bench_vs_trl.py's summary: means, standard errors, the per-seed paired difference and disturbed rounds, hand-worked."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tool_module import load_file

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_vs_trl.py"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(TOOL.parent / "bench_trl"))  # the tool imports common.py from there
    return load_file(TOOL, "bench_vs_trl_tool")


def _figures(acc: dict[int, float]) -> dict:
    return {"acc": acc, "grad_gt1": 0, "steps": 1, "grad_max": 0.0}


def test_paired_difference_and_standard_errors(bench, capsys):
    # seed 0: ours 0.2 vs trl 0.6; seed 1: ours 0.8 vs trl 0.6 at step 100.
    # means 0.5 and 0.6; SE of ours = stdev(0.2, 0.8) / sqrt(2) = 0.4243 / 1.4142 = 0.300; trl's 0.
    # paired differences -0.4 and +0.2: mean -0.1, SE = stdev(-0.4, 0.2) / sqrt(2) = 0.300.
    per_seed = {0: {"hybridflow": _figures({100: 0.2}), "trl": _figures({100: 0.6})},
                1: {"hybridflow": _figures({100: 0.8}), "trl": _figures({100: 0.6})}}
    summary = bench.print_summary(per_seed)
    line = next(l for l in capsys.readouterr().out.splitlines() if l.strip().startswith("100"))
    assert line.split() == ["100", "0.500", "+-", "0.300", "0.600", "+-", "0.000", "-0.100", "+-", "0.300"]
    assert summary["mean_accuracy"]["hybridflow"][100] == pytest.approx(0.5)


def test_standard_error_of_one_value_is_nan(bench):
    assert bench._sem([0.3]) != bench._sem([0.3])
    assert bench._sem([1.0, 3.0]) == pytest.approx(1.0)  # stdev sqrt(2), over sqrt(2)


def test_speed_figures_per_response_token(bench, capsys):
    # 4 rows per step. ours: steps of 0.02 CPU s at mean length 2.5 (10 tokens) and 0.03 s at 2.0 (8 tokens):
    # median 0.025 s/step; per token the sums, 0.05 s over 18 tokens = 2777.8 us; mean length 2.25.
    # (A median of the per-step figures, 2000 and 3750 us, would say 2875.) trl: 0.06 s at 2.3 (9.2 tokens)
    # twice, 0.12 s over 18.4 tokens = 6521.7 us: within 5% of our 2.25, so ratios are given:
    # CPU per step 0.06 / 0.025 = 2.4, per token 6521.7 / 2777.8 = 2.348.
    steps = {"hybridflow": [{"time_s": 0.04, "cpu_s": 0.02, "response_length": 2.5},
                            {"time_s": 0.05, "cpu_s": 0.03, "response_length": 2.0}],
             "trl": [{"time_s": 0.08, "cpu_s": 0.06, "response_length": 2.3}] * 2}
    result = bench.speed_figures(steps, rows=4)
    ours, trl = result["hybridflow"], result["trl"]
    assert ours["cpu_s_per_step"] == pytest.approx(0.025)
    assert ours["cpu_us_per_token"] == pytest.approx(1e6 * 0.05 / 18)
    assert trl["cpu_us_per_token"] == pytest.approx(1e6 * 0.12 / 18.4)
    assert ours["vs_trl_cpu"] == pytest.approx(2.4)
    assert ours["vs_trl_per_token"] == pytest.approx((0.12 / 18.4) / (0.05 / 18))
    assert ours["vs_trl"] == pytest.approx(0.08 / 0.045)
    assert ours["tokens_per_s"] == pytest.approx(18 / 0.09)
    bench.print_speed(result)
    row = next(l for l in capsys.readouterr().out.splitlines() if l.strip().startswith("hybridflow"))
    assert row.split()[5] == "2777.8" and row.split()[-1] == "2.35x"


def test_disturbed_one_thread_rounds_are_left_out(bench):
    calm = [{"time_s": 0.021, "cpu_s": 0.020, "response_length": 2.0}] * 3  # wall/CPU 1.05
    busy = [{"time_s": 0.060, "cpu_s": 0.020, "response_length": 2.0}] * 3  # 3.0: off its core two thirds of the time
    rounds = {"hybridflow": [calm, busy, calm], "trl": [busy, busy]}
    kept, dropped = bench.undisturbed(rounds, threads=1)
    assert dropped["hybridflow"] == [1] and kept["hybridflow"] == calm + calm
    assert dropped["trl"] == [0, 1] and kept["trl"] == busy + busy  # every round disturbed: all kept, all named
    kept, dropped = bench.undisturbed(rounds, threads=2)  # CPU time may exceed wall: no verdict
    assert dropped == {"hybridflow": [], "trl": []} and kept["hybridflow"] == calm + busy + calm
    assert bench.wall_over_cpu(busy) == pytest.approx(3.0)


def test_no_ratio_to_trl_when_the_mean_lengths_differ_by_more_than_5_percent(bench, capsys):
    # TRL 20 tokens: 20.9 (4.5% longer) is the same work, 21.1 (5.5%) is not and gets no ratio
    trl = [{"time_s": 1.0, "cpu_s": 1.0, "response_length": 20.0, "gen_cpu_s": 0.4}]
    steps = {"near": [{"time_s": 0.5, "cpu_s": 0.5, "response_length": 20.9, "gen_cpu_s": 0.2}],
             "far": [{"time_s": 0.5, "cpu_s": 0.5, "response_length": 21.1, "gen_cpu_s": 0.2}], "trl": trl}
    result = bench.speed_figures(steps, rows=4)
    assert result["near"]["same_work"] and result["near"]["vs_trl_cpu"] == pytest.approx(2.0)
    assert result["far"]["same_work"] is False and "vs_trl" not in result["far"]
    assert result["near"]["gen_cpu_s"] == pytest.approx(0.2) and result["near"]["update_cpu_s"] == pytest.approx(0.3)
    bench.print_speed(result)
    far = next(l for l in capsys.readouterr().out.splitlines() if l.strip().startswith("far"))
    assert "lengths differ" in far and "x" not in far.split("lengths")[1]


def test_flop_counts_by_hand():
    from flops import ModelShape

    # P = 1000 dense parameters, 2 layers, attention width 8: a token at context c costs 2000 + 64 c
    shape = ModelShape(dense_params=1000, layers=2, attention_width=8)
    assert shape.token(10) == 2000 + 640
    # 2 prompts of 4 tokens (context 2 on average), 3 responses each of mean length 6 (context 4 + 3)
    expected = 2 * 4 * (2000 + 64 * 2) + 2 * 3 * 6 * (2000 + 64 * 7)
    assert shape.generation(2, 3, 4, 6.0) == expected
    assert shape.update(2, 3, 4, 6.0) == 3 * expected


def test_a_side_that_skips_rows_gets_no_update_flops(bench, capsys):
    # the counted update FLOPs are the full update's: a side skipping zero-advantage rows computed fewer
    result = {"skipping": {"gen_cpu_s": 1.0, "gen_gflops": 20.0, "update_cpu_s": 0.5, "update_gflops": 40.0,
                           "skips_rows": True},
              "full": {"gen_cpu_s": 1.0, "gen_gflops": 20.0, "update_cpu_s": 0.5, "update_gflops": 40.0,
                       "skips_rows": False}}
    bench.print_arithmetic(result, 80.0)
    lines = capsys.readouterr().out.splitlines()
    skipping = next(l for l in lines if l.strip().startswith("skipping"))
    full = next(l for l in lines if l.strip().startswith("full"))
    assert skipping.split()[-2:] == ["rows", "skipped"] and "40.00" not in skipping
    assert full.split()[-2:] == ["40.00", "50.0%"]
