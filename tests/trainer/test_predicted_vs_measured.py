"""run_report.predicted_vs_measured: a plan's predicted op times against hand-made spans."""
from __future__ import annotations

import re

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler import compile_for
from hybridflow.compiler.passes import BatchShape
from hybridflow.runtime.spans import Span
from hybridflow.trainer.run_report import predicted_vs_measured


def _plan():
    """GRPO's plan with predicted times set by hand: weight sync 0, generate 2 s, then 0.5 s per op after it."""
    plan = compile_for(ALGORITHMS["grpo"].build(), "qwen2.5-0.5b", batch=BatchShape(prompts=4, prompt_len=8, response_len=4))
    ops, clock = [], 0.0
    for op in plan.ops:
        seconds = 0.0 if op.kind == "weight_sync" else 2.0 if op.node == "actor.generate" else 0.5
        ops.append(op.model_copy(update={"predicted_start_s": clock, "predicted_end_s": clock + seconds}))
        clock += seconds
    return plan.model_copy(update={"ops": tuple(ops), "predicted_iteration_s": clock}), clock


def _cells(table: str, name: str) -> list[str]:
    line = next(line for line in table.splitlines() if line.startswith(name + " "))
    return line.split()[1:]


def test_medians_per_op_and_per_step():
    plan, predicted_step = _plan()
    spans = []
    # three iterations: generate takes 1, 4 and 3 s (median 3); the update 0.5 s twice (sums to 1 s
    # per iteration, e.g. two mini-batch spans); every iteration spans 10, 12, 11 s (median 11)
    for it, (gen, length) in enumerate([(1.0, 10.0), (4.0, 12.0), (3.0, 11.0)]):
        origin = 100.0 * it
        spans.append(Span("actor.weight_sync#0", None, "weight_sync", "actor", "cpu", origin, origin + 0.01, it))
        spans.append(Span("actor.generate", "actor.generate", "generate", "actor", "cpu", origin, origin + gen, it))
        spans.append(Span("actor.update", "actor.update", "update", "actor", "cpu", origin + 5, origin + 5.5, it))
        spans.append(Span("actor.update", "actor.update", "update", "actor", "cpu", origin + 6, origin + 6.5, it))
        spans.append(Span("extra.op", "extra.op", "compute", "controller", "cpu", origin + 9, origin + length, it))
    table = predicted_vs_measured(plan, spans)
    assert _cells(table, "actor.generate") == ["2.0000", "3.0000", "0.67"]
    assert _cells(table, "actor.update") == ["0.5000", "1.0000", "0.50"]
    assert _cells(table, "actor.weight_sync") == ["0.0000", "0.0100", "0.00"]
    assert _cells(table, "ref.logprob") == ["0.5000", "-", "-"]  # no span: no measurement
    assert _cells(table, "extra.op") == ["-", "2.0000", "-"]  # not in the plan; lasts 1, 3 and 2 s
    assert _cells(table, "step") == [f"{predicted_step:.4f}", "11.0000", f"{predicted_step / 11:.2f}"]
    assert re.search(r"median over 3 iteration", table)
