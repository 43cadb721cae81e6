"""hybridflow explain: per-op medians and spread, the critical path, the cost model's errors and their causes,
computed from a plan and spans made by hand; then the command on a tiny real run."""
from __future__ import annotations

import json

import pytest

from hybridflow import cli
from hybridflow.algorithms import ALGORITHMS
from hybridflow.commands.explain import explain_lines
from hybridflow.compiler import compile_for
from hybridflow.compiler.passes import BatchShape
from hybridflow.errors import RunFolderError
from hybridflow.runtime.spans import Span, chrome_trace
from hybridflow.trainer.run_folder import iteration_spans, read_run_spans
from hybridflow.trainer.step_analysis import cost_model_errors, critical_path, op_timings, quantile, step_timing

PREDICTED = {"actor.weight_sync": 0.0, "actor.generate": 2.0}
"""Predicted seconds by hand; every other op 0.5 s."""


def _plan(cluster: str | None = None):
    """GRPO's plan (ops: weight_sync, generate, actor.logprob, reward.score on 'host', grpo_advantage on the
    controller, ref.logprob, update; all but reward and the advantage on pool0), predicted times set by hand."""
    plan = compile_for(ALGORITHMS["grpo"].build(), "qwen2.5-0.5b", batch=BatchShape(prompts=4, prompt_len=8, response_len=4))
    ops, clock = [], 0.0
    for op in plan.ops:
        seconds = PREDICTED.get(op.name, 0.5)
        ops.append(op.model_copy(update={"predicted_start_s": clock, "predicted_end_s": clock + seconds}))
        clock += seconds
    update = {"ops": tuple(ops), "predicted_iteration_s": clock} | ({"cluster": cluster} if cluster else {})
    return plan.model_copy(update=update)


def _iteration(it: int, gen: float, origin: float) -> list[Span]:
    """One iteration's spans, laid end to end as the interpreter would run them (g = generate's seconds):
    weight sync [0, .01], generate [.01, g+.01], actor.logprob +0.5, then on pool0 ref.logprob 1.0 and the update in
    two 1.0 s mini-batch spans; meanwhile reward.score 1.0 on host, then the advantage 0.25 on the controller.
    The step: g + 3.51 s. Each pool op also has a per-slot span (pool0/rank0), which explain must not count."""
    g = gen + 0.01
    rows = [("actor.weight_sync", None, "weight_sync", "pool0", 0.0, 0.01),
            ("actor.generate", "actor.generate", "generate", "pool0", 0.01, g),
            ("actor.logprob", "actor.logprob", "infer", "pool0", g, g + 0.5),
            ("reward.score", "reward.score", "score", "host", g, g + 1.0),
            ("grpo_advantage", "grpo_advantage", "compute", "controller", g + 1.0, g + 1.25),
            ("ref.logprob", "ref.logprob", "infer", "pool0", g + 0.5, g + 1.5),
            ("actor.update", "actor.update", "update", "pool0", g + 1.5, g + 2.5),
            ("actor.update", "actor.update", "update", "pool0", g + 2.5, g + 3.5)]
    spans = []
    for op, node, kind, device, start, end in rows:
        spans.append(Span(op, node, kind, op.split(".")[0], device, origin + start, origin + end, it))
        if device == "pool0":
            spans.append(Span(op, node, kind, "actor", "pool0/rank0", origin + start, origin + end + 50.0, it))
    return spans


def _spans() -> list[Span]:
    """Iteration 0 (the warm-up: generate 100 s, left out), then generate 1, 4, 3 s."""
    spans = []
    for it, gen in enumerate([100.0, 1.0, 4.0, 3.0]):
        spans += _iteration(it, gen, 1000.0 * it)
    return spans


def test_medians_spread_and_step_leave_out_the_warm_up_and_the_slots():
    plan = _plan()
    spans = iteration_spans(plan, _spans())
    timings = {t.name: t for t in op_timings(plan, spans)}
    generate = timings["actor.generate"]
    assert generate.measured_s == pytest.approx((1.0, 4.0, 3.0)) and generate.median_s == pytest.approx(3.0)
    assert generate.spread_s == pytest.approx((1.0, 4.0))  # under 10 iterations: min-max
    assert generate.ratio == pytest.approx(1.5)
    assert timings["actor.update"].median_s == pytest.approx(2.0)  # two mini-batch spans summed per iteration
    assert timings["actor.weight_sync"].ratio is None  # predicted 0 s: no finite ratio
    step = step_timing(plan, spans)
    assert step.iterations == (1, 2, 3)
    assert step.median_s == pytest.approx(3.0 + 3.51) and step.spread_s == pytest.approx((1.0 + 3.51, 4.0 + 3.51))


def test_spread_is_p10_p90_from_ten_iterations():
    plan = _plan()
    spans = []
    for it in range(1, 12):  # generate 1..11 s
        spans += _iteration(it, float(it), 1000.0 * it)
    generate = next(t for t in op_timings(plan, iteration_spans(plan, spans)) if t.name == "actor.generate")
    assert generate.spread_s == pytest.approx((2.0, 10.0))  # p10 and p90 of 1..11
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == pytest.approx(2.5) and quantile([5.0], 0.9) == 5.0


def test_critical_path_with_and_without_the_pools_order():
    plan = _plan()
    spans = iteration_spans(plan, _spans())
    timings, step = op_timings(plan, spans), step_timing(plan, spans)
    # pool0 runs logprob then ref.logprob in turn: 0.01 + 3 + 0.5 + 1.0 + 2.0 = 6.51 s, the whole step
    full = critical_path(plan, timings, step, spans)
    assert full.ops == ("actor.weight_sync", "actor.generate", "actor.logprob", "ref.logprob", "actor.update")
    assert full.seconds == pytest.approx(6.51) and full.fraction == pytest.approx(1.0)
    # by the deps alone ref.logprob needs only the generation (3.01 + 1.0 + 2.0 = 6.01 s), and the reward branch,
    # 3.01 + 1.0 + 0.25 + 2.0 = 6.26 s, is the longest
    deps = critical_path(plan, timings, step, spans, with_pool_order=False)
    assert deps.ops == ("actor.weight_sync", "actor.generate", "reward.score", "grpo_advantage", "actor.update")
    # each step's share: (g + 3.26) / (g + 3.51) for g = 1, 4, 3 s; the median is g = 3's
    assert deps.seconds == pytest.approx(6.26) and deps.fraction == pytest.approx(6.26 / 6.51)
    assert sorted(deps.shares) == pytest.approx(sorted(((g + 3.26) / (g + 3.51) for g in (1.0, 4.0, 3.0))))
    assert critical_path(plan, timings, step).fraction is None  # no spans: no shares


def test_largest_errors_first_with_their_causes():
    plan = _plan()
    spans = iteration_spans(plan, _spans())
    timings, step = op_timings(plan, spans), step_timing(plan, spans)
    errors = cost_model_errors(timings, step, calibrated=False)
    # measured / predicted: update 2/0.5 = 4; reward, ref 1/0.5 = 2 and the advantage 0.25/0.5 = 1/2 (as far off);
    # generate 1.5; then the ops off by under 1% of the step: actor.logprob (exact), the weight sync (0.01 s, priced 0)
    assert [e.op.name for e in errors] == ["actor.update", "reward.score", "grpo_advantage", "ref.logprob",
                                           "actor.generate", "actor.weight_sync", "actor.logprob"]
    assert errors[0].ratio == pytest.approx(4.0)
    causes = {e.op.name: e.cause.name for e in errors}
    assert causes["actor.update"] == "uncalibrated model" and causes["actor.weight_sync"] == "priced as free"
    calibrated = {e.op.name: e for e in cost_model_errors(timings, step, calibrated=True)}
    # generate: 1.5x, as the whole step (6.51 / 4.5 = 1.45x): the machine, not the op
    assert calibrated["actor.generate"].cause.name == "machine slower than calibrated"
    assert calibrated["actor.update"].cause.name == "cost rule"  # steady, and 4x against a step 1.45x off


@pytest.mark.parametrize("seconds, cause", [((0.001, 0.001, 0.001), "dispatch overhead"),
                                             ((0.1, 0.3, 0.2), "contention")])
def test_tiny_ops_are_dispatch_overhead_and_varying_ones_contention(seconds, cause):
    plan = _plan(cluster="local-cpu+calibrated:1")
    spans = [s for s in _spans() if s.op != "grpo_advantage"]
    spans += [Span("grpo_advantage", "grpo_advantage", "compute", "grpo", "controller", 1000.0 * it, 1000.0 * it + d, it)
              for it, d in enumerate((0.5, *seconds))]
    spans = iteration_spans(plan, spans)
    error = next(e for e in cost_model_errors(op_timings(plan, spans), step_timing(plan, spans), calibrated=True)
                 if e.op.name == "grpo_advantage")
    assert error.cause.name == cause
    if cause == "contention":
        assert "varied 3.0-fold" in error.explanation


def test_explain_text_and_the_trace_it_reads(tmp_path):
    plan = _plan()
    spans = _spans()
    validation = [Span("actor.generate", "actor.generate", "generate", "actor", "pool0", 2500.0, 2900.0, 2)]
    (tmp_path / "trace.json").write_text(json.dumps(chrome_trace(spans + validation, beside=validation)))
    read = read_run_spans(tmp_path)
    assert len(read) == len(spans)  # validation's span left out
    lines, rows = explain_lines(plan, iteration_spans(plan, read), [(1, 9.0), (2, 7.0), (3, 8.0)])
    text = "\n".join(lines)
    assert "3 iteration(s) 1..3 (iteration 0, the warm-up, left out)" in text
    assert "along the deps and each pool's op order: actor.weight_sync -> actor.generate -> actor.logprob -> " \
           "ref.logprob -> actor.update\n    medians summed 6.5100 s: 100% of the measured step" in text
    assert "median over 2 step(s)): 7.5000 s" in text  # the trainer's step 1 is the warm-up
    generate = next(line for line in lines if line.startswith("*actor.generate"))
    assert generate.split()[3:] == ["2.0000", "3.0000", "1.0000-4.0000", "1.50"]
    assert [r.name for r in rows if r.critical] == ["actor.weight_sync", "actor.generate", "actor.logprob",
                                                    "ref.logprob", "actor.update"]


def test_a_folder_that_is_no_run_is_named(tmp_path, capsys):
    assert cli.main(["explain", str(tmp_path / "nothing")]) == 1
    assert "no such run folder" in capsys.readouterr().err
    with pytest.raises(RunFolderError, match="trace.json: missing"):
        read_run_spans(tmp_path)


def test_explain_a_tiny_run(fast_config, capsys):
    from hybridflow.trainer import Trainer
    from hybridflow.trainer.run_report import write_artifacts

    trainer = Trainer(fast_config(max_steps=3, rollout_batch_size=4))
    trainer.train()
    write_artifacts(trainer)
    out = trainer.output_dir
    assert cli.main(["explain", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2 iteration(s) 1..2 (iteration 0, the warm-up, left out)" in text
    assert "critical path" in text and "% of the measured step" in text
    assert "largest cost-model errors (measured / predicted):" in text
    assert "what the cost model would choose now" in text and "  placement " in text
    svg = (out / "explain.svg").read_text()
    assert svg.startswith("<svg") and all(op.name in svg for op in trainer.plan.ops)


def test_with_staleness_a_step_is_a_call_and_the_next_steps_generation_does_not_close_it():
    import warnings

    from hybridflow.compiler.compile import compile

    with warnings.catch_warnings():  # no importance-sampling correction in GRPO's graph: a warning, not the point
        warnings.simplefilter("ignore")
        plan = compile(ALGORITHMS["grpo"].build(), "a100-80g:1", {"actor": "qwen2.5-0.5b", "reward": "rule"},
                       placement="actor+ref@4;actor.generate@4", staleness=1, allow_uncorrected_staleness=True,
                       batch=BatchShape(prompts=64, prompt_len=256, response_len=256))
    assert {op.name for op in plan.ops if op.iteration_offset} == {"actor.weight_sync", "actor.generate"}
    spans = []
    for call in range(4):  # call c trains iteration c and starts the generation of iteration c + 1, which runs 4.9 s
        o = 100.0 * call
        rows = [("actor.weight_sync", "pool0", 0.0, 0.1, 1), ("actor.generate", "pool1", 0.1, 5.0, 1),
                ("reward.score", "host", 0.0, 0.01, 0), ("grpo_advantage", "controller", 0.01, 0.02, 0),
                ("actor.logprob", "pool0", 0.1, 0.6, 0), ("ref.logprob", "pool0", 0.6, 1.1, 0),
                ("actor.update", "pool0", 1.1, 3.1, 0)]
        spans += [Span(op, None if op.endswith("sync") else op, "node", "actor", pool, o + a, o + b, call + ahead, call=call)
                  for op, pool, a, b, ahead in rows]
    spans = iteration_spans(plan, spans)
    step = step_timing(plan, spans)
    # call 0 (the warm-up) sent only iteration 1's generation once iteration 0 is left out: no step
    assert step.iterations == (1, 2, 3) and step.median_s == pytest.approx(3.1)
    generate = next(t for t in op_timings(plan, spans) if t.name == "actor.generate")
    assert generate.measured_s == pytest.approx((4.9,) * 4)  # iterations 1..4, sent in calls 0..3


def test_a_run_without_its_config_is_explained_but_not_compiled_again(tmp_path, capsys):
    plan = _plan()
    (tmp_path / "plan.json").write_text(plan.to_json())
    (tmp_path / "trace.json").write_text(json.dumps(chrome_trace(_spans())))
    assert cli.main(["explain", str(tmp_path), "--svg", str(tmp_path / "chart.svg")]) == 0
    text = capsys.readouterr().out
    assert "medians summed 6.5100 s: 100% of the measured step" in text
    assert "not compiled again: " in text and "config.json: missing" in text
    svg = (tmp_path / "chart.svg").read_text()
    assert "actor.update  x4.00" in svg and "\u25cf actor.generate  x1.50" in svg  # measured / predicted; critical
    assert "grpo_advantage  x0.50" in svg and "\u25cf grpo_advantage" not in svg  # off the critical path
