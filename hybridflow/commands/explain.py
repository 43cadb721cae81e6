"""``hybridflow explain RUN_DIR``: where a finished run's step went, against what its plan predicted.

Reads the run's ``plan.json`` (predicted op times), ``trace.json`` (measured spans; the first iteration, the
warm-up, is left out as in ``timing.txt``, and validation's spans too) and ``metrics.jsonl``, and prints:

1. per op: predicted seconds, the measured median and spread over the iterations, measured / predicted;
2. the critical path: the longest chain through the plan's ops weighted by the measured medians, along the deps
   and each pool's op order, and along the deps alone, with the share of the measured step each explains;
3. the cost model's largest errors, each with a likely cause
   (:data:`~hybridflow.trainer.step_analysis.CAUSES`);
4. what the calibrated model would choose now on this machine for the run's config and batch
   (:func:`~hybridflow.trainer.recompile.recompile_run`; ``--no-compile`` skips it), and the predicted gain over
   the run's placement priced the same way.

It draws predicted against measured per op in ``RUN_DIR/explain.svg`` (``--svg`` elsewhere).
Keep module-level imports light: this module is imported by ``hybridflow --help``.
"""
from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

__all__ = ["add_arguments", "run", "explain_lines", "recompile_lines", "recompiled_lines"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run's output folder (plan.json, trace.json, metrics.jsonl)")
    parser.add_argument("--top", type=int, default=5, help="how many of the cost model's largest errors to list (default 5)")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip compiling the run's config again (what the calibrated model would choose now)")
    parser.add_argument("--svg", default=None, help="where to draw predicted vs measured (default RUN_DIR/explain.svg)")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (one that registers the custom ops the run's graph uses); repeatable")


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:.2f}"


def _table(timings, step, critical: set[str]) -> list[str]:
    width = max([len(t.name) for t in timings] + [4]) + 2
    spread_name = "p10-p90 s" if len(step.measured_s) >= 10 else "min-max s"
    lines = [f"{'op':<{width}}{'kind':<12}{'pool':<12}{'predicted s':>12}{'measured s':>12}  {spread_name:<17}{'meas/pred':>9}"]
    for t in timings:
        spread = f"{t.spread_s[0]:.4f}-{t.spread_s[1]:.4f}" if t.spread_s else "-"
        name = ("*" if t.name in critical else " ") + t.name
        lines.append(f"{name:<{width}}{t.kind:<12}{(t.pool or 'controller'):<12}{t.predicted_s:>12.4f}"
                     f"{_s(t.median_s):>12}  {spread:<17}{_ratio(t.ratio):>9}")
    spread = f"{step.spread_s[0]:.4f}-{step.spread_s[1]:.4f}" if step.spread_s else "-"
    ratio = step.median_s / step.predicted_s if step.median_s and step.predicted_s else None
    lines.append(f"{' step':<{width}}{'':<24}{step.predicted_s:>12.4f}{_s(step.median_s):>12}  {spread:<17}{_ratio(ratio):>9}")
    return lines


def _path_line(path, label: str) -> str:
    share = (f": {path.fraction:.0%} of the measured step (median over the steps of the chain's share of each; the "
             f"step's median {path.step_s:.4f} s)") if path.fraction is not None else ""
    return f"  {label}: {' -> '.join(path.ops)}\n    medians summed {path.seconds:.4f} s{share}"


def explain_lines(plan, spans, step_times=(), *, top: int = 5) -> tuple[list[str], list]:
    """The report's sections 1-3 for ``plan`` and its run's per-op ``spans`` (:func:`iteration_spans`), and the
    chart's rows. ``step_times``: (step, the trainer's ``timing_s/step``) from metrics.jsonl."""
    from ..trainer.planning import plan_summary
    from ..trainer.step_analysis import cost_model_errors, critical_path, op_timings, step_timing
    from ..viz.timing_chart import TimingRow

    timings, step = op_timings(plan, spans), step_timing(plan, spans)
    calibrated = "calibrated" in plan.cluster
    lines = [f"{plan.graph.name} on {plan.machine or plan.cluster}: placement {plan.strategy} ({plan_summary(plan)}); "
             f"priced with {plan.cluster} ({'calibrated' if calibrated else 'datasheet figures'})"]
    if not step.measured_s:
        lines.append("no op of the plan has a span in trace.json: nothing measured to explain")
        return lines, []
    warm = " (iteration 0, the warm-up, left out)" if step.iterations[0] >= 1 else ""
    lines.append(f"measured: {len(step.measured_s)} iteration(s) {step.iterations[0]}..{step.iterations[-1]}{warm}; "
                 "medians, and the spread over the iterations")
    full = critical_path(plan, timings, step, spans, with_pool_order=True)
    deps = critical_path(plan, timings, step, spans, with_pool_order=False)
    lines += ["", *_table(timings, step, set(full.ops)), "(* on the critical path)"]
    trainer_steps = [seconds for number, seconds in step_times if number >= 2] or [s for _, s in step_times]
    if trainer_steps:
        lines.append(f"the trainer's step (metrics.jsonl timing_s/step, median over {len(trainer_steps)} step(s)): "
                     f"{statistics.median(trainer_steps):.4f} s, the ops' span plus the controller's work around them")
    lines += ["", "critical path (longest chain weighted by the measured medians):",
              _path_line(full, "along the deps and each pool's op order"), _path_line(deps, "along the deps alone")]
    errors = cost_model_errors(timings, step, calibrated=calibrated)[:top]
    lines += ["", "largest cost-model errors (measured / predicted):"]
    width = max([len(e.op.name) for e in errors] + [4])
    for e in errors:
        lines.append(f"  {e.op.name:<{width}}  x{_ratio(e.ratio):<6}  {e.op.median_s:.4f} s measured, "
                     f"{e.op.predicted_s:.4f} s predicted: {e.explanation}")
    rows = [TimingRow(t.name, t.predicted_s, t.median_s, *(t.spread_s or (None, None)), critical=t.name in full.ops)
            for t in timings]
    rows.append(TimingRow("step", step.predicted_s, step.median_s, *(step.spread_s or (None, None))))
    return lines, rows


def recompile_lines(run_dir: Path, plan, measured_step_s: float | None) -> list[str]:
    """Section 4: the run's config compiled again now, here (:func:`~hybridflow.trainer.recompile.recompile_run`)."""
    from ..trainer.recompile import recompile_run
    from ..trainer.run_folder import read_run_config

    return recompiled_lines(recompile_run(read_run_config(run_dir), plan), plan, measured_step_s)


def recompiled_lines(now, plan, measured_step_s: float | None) -> list[str]:
    """Section 4's text for ``now`` (a :class:`~hybridflow.trainer.recompile.Recompiled`) against the run's ``plan``."""
    from .compile import placement_lines

    figures = "calibrated on this machine now" if now.calibrated else "datasheet figures (the models are not local folders)"
    lines = [f"what the cost model would choose now ({figures}; the run's config and batch):"]
    lines += ["  " + line for line in placement_lines(now.plan)]
    new_s, old_s = now.plan.predicted_iteration_s or 0.0, plan.predicted_iteration_s or 0.0
    measured = f", measured {measured_step_s:.4f} s" if measured_step_s else ""
    if now.run_placement_now_s is not None:
        then = now.run_placement_now_s
        lines.append(f"  the run's placement ({plan.strategy}) priced now: {then:.4f} s per step; the new choice: "
                     f"{new_s:.4f} s, a predicted gain of x{then / new_s if new_s else float('nan'):.2f} "
                     f"({then - new_s:+.4f} s per step; the run's plan predicted {old_s:.4f} s{measured})")
    elif now.run_placement_problem is not None:
        lines.append(f"  the run's placement cannot be priced now ({now.run_placement_problem}); the run's plan "
                     f"predicted {old_s:.4f} s at its compile{measured}")
    else:
        lines.append(f"  the same placement as the run's: no gain from compiling again (the run's plan predicted "
                     f"{old_s:.4f} s; priced now {new_s:.4f} s{measured})")
    return lines


def run(args: argparse.Namespace) -> int:
    from ..algorithms.resolve import import_modules
    from ..errors import RunFolderError
    from ..trainer.run_folder import iteration_spans, read_run_plan, read_run_spans, read_step_times
    from ..trainer.run_report import quiet_libraries
    from ..trainer.step_analysis import step_timing
    from ..viz.timing_chart import write_timing_chart

    import_modules(args.imports, "--import")
    run_dir = Path(args.run_dir)
    plan = read_run_plan(run_dir)
    spans = iteration_spans(plan, read_run_spans(run_dir))
    lines, rows = explain_lines(plan, spans, read_step_times(run_dir), top=args.top)
    print("\n".join(lines), flush=True)
    if rows:
        svg = Path(args.svg) if args.svg else run_dir / "explain.svg"
        write_timing_chart(rows, svg, title=f"{plan.graph.name}: predicted vs measured per op ({run_dir.name})")
    if not args.no_compile:
        quiet_libraries()
        try:
            section = recompile_lines(run_dir, plan, step_timing(plan, spans).median_s)
        except RunFolderError as err:  # a run from before config.json: the rest of the report stands
            section = [f"not compiled again: {err}"]
        print("\n" + "\n".join(section), flush=True)
    if rows:
        print(f"\ndrawn: {svg}")
    return 0
