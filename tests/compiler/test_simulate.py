"""Winner, margin and the comparison with a paper's reported winners, on hand-made rows."""
import math
import re

from hybridflow.compiler.simulate import REPORTED_WINNERS, SimulationRow, agreement, format_table
from hybridflow.compiler.workload import WORKLOAD_PRESETS


def _row(model, gpus, colocate, split, standalone):
    times = (("colocate", colocate), ("split", split), ("standalone", standalone), ("auto", min(colocate, split, standalone)))
    return SimulationRow(model, gpus, times, None, 0.0)


def test_winner_margin_and_agreement():
    rows = (_row("llama2-34b", 128, 110.0, 100.0, 150.0),   # split by 10 %; the paper: split
            _row("llama2-13b", 128, 50.0, 60.0, math.inf),  # colocate by 20 %; the paper: standalone
            _row("llama2-7b", 16, 10.0, math.inf, math.inf))  # only colocate fits; the paper does not report 7B
    assert [r.winner for r in rows] == ["split", "colocate", "colocate"]
    assert rows[0].margin == 0.1 and rows[1].margin == 0.2 and math.isinf(rows[2].margin)
    assert agreement(rows, "paper") == (1, 2)
    text = format_table(rows, compare="paper")
    assert re.search(r"split\s+10\.0%\s+split=", text) and re.search(r"colocate\s+20\.0%\s+standalone≠", text)
    assert re.search(r"llama2-7b .* colocate\s+only\s+-", text)


def test_paper_tables_cover_figure_12():
    paper = REPORTED_WINNERS["paper"]
    assert len(paper) == 10 and paper[("llama2-13b", 128)] == "standalone" and paper[("llama2-34b", 96)] == "split"
    assert WORKLOAD_PRESETS["paper"].mini_batches == 8 and "§8.1" in WORKLOAD_PRESETS["paper"].source
    assert WORKLOAD_PRESETS["default"].mini_batches == 4
