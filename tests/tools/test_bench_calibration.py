"""tools/bench_calibration.py: one interleaved round of the quick calibration prints its figures and ratios."""
from __future__ import annotations

import re

from tool_module import load_file
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_calibration.py"


def test_one_round_prints_start_up_memory_and_the_ratio_to_calibration_off(tmp_path, capsys):
    module = load_file(TOOL, "bench_calibration")
    assert module.main(["--modes", "off,new", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if re.match(r"(off|new) +\d", line)}
    assert set(rows) == {"off", "new"}
    assert rows["off"][-3:] == ["x1.00,", "x1.00,", "x1.00"]  # the baseline against itself
    assert float(rows["off"][3]) == 0.0 and float(rows["new"][3]) > 0  # calibration ran in the new mode only
    assert "load average before:" in out
    assert (tmp_path / "model_tiny" / "config.json").is_file()


def test_unknown_modes_are_refused(capsys):
    import pytest

    module = load_file(TOOL, "bench_calibration")
    with pytest.raises(SystemExit):
        module.main(["--modes", "off,fast"])
    assert "unknown ['fast']" in capsys.readouterr().err


def test_the_extrapolation_check_says_when_the_model_is_measured_whole(tmp_path, capsys):
    module = load_file(TOOL, "bench_calibration")
    assert module.main(["--extrapolation", "--out", str(tmp_path)]) == 0  # the tiny model: 2 layers
    assert "measures it whole" in capsys.readouterr().out
