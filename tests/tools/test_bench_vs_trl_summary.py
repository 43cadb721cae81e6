"""tools/bench_vs_trl.py's summary: means, standard errors and the per-seed paired difference, hand-worked."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_vs_trl.py"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(TOOL.parent / "bench_trl"))  # the tool imports common.py from there
    spec = importlib.util.spec_from_file_location("bench_vs_trl_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


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
