"""tools/bench_streaming.py: its cheapest run (the local executor) prints both step times and their ratio, and its
default Ray plans compile here, with the rollout on a pool of its own and only the generate op streamed."""
from __future__ import annotations

from pathlib import Path

from tool_module import load_file

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench_streaming.py"


def test_local_run_prints_both_step_times_and_the_ratio(capsys):
    bench = load_file(BENCH, "bench_streaming")
    result = bench.main(["--executor", "local", "--rounds", "1", "--warmup", "0", "--prompts", "2", "--new-tokens", "8",
                         "--hidden", "32", "--layers", "1"])
    out = capsys.readouterr().out
    assert "whole-batch" in out and "streamed" in out and f"{result['ratio']:.2f}x" in out
    low, _, high = result["lengths"]
    assert 1 <= low <= high <= 8
    assert result["whole_s"] > 0 and result["streamed_s"] > 0


def test_default_ray_plans_put_the_rollout_apart_and_stream_only_it():
    bench = load_file(BENCH, "bench_streaming")
    args = bench.parse_args([])
    graph, specs, batches = bench.workload(bench.parse_args(["--rounds", "1", "--warmup", "0"]))
    whole, streamed = bench.plans(graph, specs, batches, args)
    assert not any(op.stream for op in whole.ops)
    (generate,) = [op for op in streamed.ops if op.stream]
    assert {op.pool for op in streamed.ops if op.node in ("reward.score", "ref.logprob")} - {generate.pool, None}
