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


def test_strong_scaling_by_hand():
    from hybridflow.compiler.simulate import format_scaling, strong_scaling

    rows = (_row("llama2-7b", 16, 100.0, 120.0, 130.0), _row("llama2-7b", 64, 40.0, 30.0, 50.0),
            _row("llama2-7b", 128, 20.0, 25.0, 16.0),
            _row("llama2-70b", 16, math.inf, math.inf, math.inf),  # does not fit: scaling starts at 64
            _row("llama2-70b", 64, 80.0, 90.0, 95.0), _row("llama2-70b", 128, 50.0, 45.0, 60.0),
            _row("llama2-13b", 128, 10.0, 12.0, 14.0))  # one count only: left out
    a, b = strong_scaling(rows)
    # 7B: auto 100 s on 16 -> 16 s on 128: (100·16)/(16·128) = 1600/2048 = 0.78125
    assert (a.model, a.gpus, a.seconds) == ("llama2-7b", (16, 128), (100.0, 16.0)) and a.efficiency == 0.78125
    # 70B: 80 s on 64 -> 45 s on 128: (80·64)/(45·128) = 5120/5760 = 0.8889
    assert b.gpus == (64, 128) and math.isclose(b.efficiency, 5120 / 5760)
    text = format_scaling((a, b))
    assert "mean 83.5%" in text and "llama2-7b 16->128 GPUs: 100.0 s -> 16.0 s, efficiency 78.1%" in text
    assert "no model fits" in format_scaling(strong_scaling(rows[-1:]))


def test_assumptions_reach_the_cluster_and_the_options():
    import pytest

    from hybridflow.compiler.cluster import ClusterSpec
    from hybridflow.compiler.cost import CostOptions
    from hybridflow.compiler.simulate import apply_settings
    from hybridflow.errors import ConfigError

    base = ClusterSpec.preset("a100-80g")
    cluster, options = apply_settings(base, CostOptions(), ["decode_step_overhead_s=0.004", "train_micro_batch = 2"])
    assert cluster.decode_step_overhead_s == 0.004 and options.train_micro_batch == 2
    assert cluster.model_copy(update={"decode_step_overhead_s": 0.0}) == base  # nothing else moved
    assert apply_settings(base, CostOptions(), []) == (base, CostOptions())
    for bad, message in (("warp=9", "not a field"), ("mfu_train=1.5", "mfu_train"), ("nodes=4", "--gpus"),
                         ("train_micro_batch", "FIELD=VALUE"), ("train_micro_batch=0", "train_micro_batch")):
        with pytest.raises(ConfigError, match=message):
            apply_settings(base, CostOptions(), [bad])
