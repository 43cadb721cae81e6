"""What the ``run`` and ``quickstart`` commands print and leave behind besides the metrics.

:func:`quiet_libraries` keeps transformers' load reports and progress bars off the
console and shows hybridflow's own log lines; :func:`write_artifacts` draws the algorithm
graph and writes the run's Chrome trace; :func:`summary_lines` is the closing summary:
reward before and after, and where everything was written; :func:`predicted_vs_measured`
sets a compiled plan's predicted op times against the spans a run recorded.
"""
from __future__ import annotations

import json
import logging
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping

if TYPE_CHECKING:
    from ..compiler.plan import ExecutionPlan
    from ..runtime.spans import Span
    from .trainer import Trainer

__all__ = ["quiet_libraries", "write_artifacts", "validation_history", "summary_lines", "predicted_vs_measured"]


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of each record."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def quiet_libraries() -> None:
    """transformers: errors only, no progress bars; hybridflow: INFO lines on stderr."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    logger = logging.getLogger("hybridflow")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("[hybridflow] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def write_artifacts(trainer: "Trainer") -> dict[str, Path]:
    """Draw the algorithm graph (DOT, and SVG with Graphviz) and write the Chrome trace; returns their paths.

    A trace.json or timing.txt an earlier run left (the run this one resumed) is kept beside the new one as
    ``trace.1.json`` / ``timing.1.txt`` (the first free number), not replaced. A file that cannot be written
    is a WriteError naming it.
    """
    from ..errors import WriteError
    from ..runtime.spans import write_chrome_trace
    from ..viz.graph import draw_graph

    out = trainer.output_dir
    try:
        drawn = draw_graph(trainer.graph, out / f"{trainer.algorithm}_graph", trainer.plan.edge_lags())
        paths = {"graph": drawn.svg or drawn.dot}
        if trainer.executor is not None and trainer.executor.recorder.spans:
            trace, timing = out / "trace.json", out / "timing.txt"
            for path in (trace, timing):
                _keep_earlier(path, trainer.written_artifacts)
            # one track per worker on Ray (trace_spans), one per device locally
            paths["trace"] = write_chrome_trace(trainer.executor.trace_spans(), trace, beside=trainer.executor.side_spans)
            spans = [s for s in trainer.executor.recorder.spans if s.iteration >= 1] or trainer.executor.recorder.spans
            table = predicted_vs_measured(trainer.plan, spans)  # iteration 0 warms up
            timing.write_text(table + "\n")
            paths["timing"] = timing
            trainer.written_artifacts.update((trace, timing))
    except OSError as err:
        raise WriteError("the run's drawing, trace or timing table cannot be written (metrics.jsonl and the "
                         "checkpoints are complete)", err) from None
    return paths


def _keep_earlier(path: Path, written: set[Path]) -> None:
    """Rename a ``path`` not in ``written`` (the trainer's: an earlier run's) to ``<stem>.<n><suffix>``, the first free n."""
    import logging
    import os

    if not path.is_file() or path in written:
        return
    number = 1
    while (aside := path.with_name(f"{path.stem}.{number}{path.suffix}")).exists():
        number += 1
    os.replace(path, aside)
    logging.getLogger("hybridflow.trainer").info("the earlier run's %s is kept as %s", path.name, aside.name)


def validation_history(output_dir: Path, validations: Mapping[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    """``step -> val/... metrics`` of the run in ``output_dir``, from its metrics.jsonl (which a resumed run keeps),
    else from ``validations`` (the trainer's, of this process)."""
    found: dict[int, dict[str, float]] = {}
    path = output_dir / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            vals = {k: v for k, v in row.items() if k.startswith("val/")}
            if vals:
                found[int(row["step"])] = vals
    for step, metrics in validations.items():
        found.setdefault(step, metrics)
    return found


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def summary_lines(trainer: "Trainer", wall_s: float, artifacts: dict[str, Path]) -> list[str]:
    """The closing summary of a run."""
    cfg, out = trainer.config, trainer.output_dir
    lines = [f"done: {trainer.step} steps of {trainer.algorithm} in {wall_s:.1f} s"]
    if trainer.out_of_time:
        lines[0] += f" (stopped at step {trainer.step} of {cfg.max_steps}: max_time_s={cfg.max_time_s:g} reached)"
    if trainer.stop_signal:
        lines[0] += f" (stopped by {trainer.stop_signal} at step {trainer.step} of {cfg.max_steps}; resume='auto' continues)"
    vals = validation_history(out, trainer.validations)
    if vals:
        first, last = vals[min(vals)], vals[max(vals)]
        for key in sorted(first):
            if key in last:
                lines.append(f"  {key:<22} {first[key]:.3f} at step {min(vals)}  ->  {last[key]:.3f} at step {max(vals)}"
                             f"   ({len(trainer.val_rows)} validation prompts)")
    from .metrics import training_score

    scores = [s for s in map(training_score, trainer.history) if s is not None]
    if scores:
        k = max(1, min(10, len(scores) // 2))
        lines.append(f"  training reward          {_mean(scores[:k]):.3f} (first {k} steps)  ->  "
                     f"{_mean(scores[-k:]):.3f} (last {k} steps)")
    lines.append(f"metrics:    {out / 'metrics.jsonl'}" if "jsonl" in cfg.trackers else "metrics:    console only")
    if "tensorboard" in cfg.trackers and (out / "tensorboard").is_dir():
        lines.append(f"tensorboard: tensorboard --logdir {out / 'tensorboard'}")
    lines.append(f"plan:       {out / 'plan.json'}   drawing: {artifacts.get('graph')}")
    if "trace" in artifacts:
        lines.append(f"trace:      {artifacts['trace']} (open in ui.perfetto.dev or chrome://tracing)")
    table = artifacts["timing"].read_text() if "timing" in artifacts else None
    if table:
        step = next(line for line in table.splitlines() if line.startswith("step "))
        pred, meas, ratio = step.split()[1:4]
        lines.append(f"step time:  predicted {pred} s, measured {meas} s (ratio {ratio}); per op: {artifacts['timing']}")
    if trainer.determinism:
        lines.append(f"determinism: {trainer.determinism}")
    if trainer.config.record_hashes:
        lines.append(f"hashes:     {out / 'hashes.jsonl'} (compare runs: hybridflow diff {out} OTHER_RUN)")
    if trainer.last_checkpoint is not None:
        lines.append(f"checkpoint: {trainer.last_checkpoint}")
        lines.append(f"export:     hybridflow export {trainer.last_checkpoint} --to {out / 'hf_model'}")
    return lines


def _op_key(node: str | None, role: str, kind: str) -> str:
    """A node op by its node's name; a transition (weight_sync, offload, onload) as ``role.kind``."""
    return node if node else f"{role}.{kind}"


def predicted_vs_measured(plan: "ExecutionPlan", spans: Iterable["Span"]) -> str:
    """A table of each op's predicted seconds (``plan``) against its measured median (``spans``), and the step's.

    Ops are matched by node name (transitions by ``role.kind``), so the plan
    may be a compiled one and the spans a run of another plan of the same
    graph (the trainer's local plan). An op's measured time is the median over
    iterations of its spans' summed durations in the iteration; the step's is
    the median of each iteration's first start to last end, against the plan's
    ``predicted_iteration_s``. ratio = predicted / measured; ``-`` where a side
    has no figure.
    """
    predicted: dict[str, float] = defaultdict(float)
    for op in plan.ops:
        predicted[_op_key(op.node, op.role, op.kind)] += op.predicted_end_s - op.predicted_start_s
    per_iteration: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    bounds: dict[int, list[float]] = {}
    for span in spans:
        per_iteration[span.iteration][_op_key(span.node, span.role, span.kind)] += span.end - span.start
        first, last = bounds.get(span.iteration, (span.start, span.end))
        bounds[span.iteration] = [min(first, span.start), max(last, span.end)]
    keys = list(predicted) + sorted({k for ops in per_iteration.values() for k in ops} - set(predicted))
    measured = {k: statistics.median(ops.get(k, 0.0) for ops in per_iteration.values()) for k in keys
                if any(k in ops for ops in per_iteration.values())}
    step = statistics.median(end - start for start, end in bounds.values()) if bounds else None
    width = max([len(k) for k in keys] + [4])

    def row(name: str, pred: float | None, meas: float | None) -> str:
        ratio = f"{pred / meas:7.2f}" if pred is not None and meas else f"{'-':>7}"
        cells = [f"{v:12.4f}" if v is not None else f"{'-':>12}" for v in (pred, meas)]
        return f"{name:<{width}}  {cells[0]}  {cells[1]}  {ratio}"

    lines = [f"{'op':<{width}}  {'predicted s':>12}  {'measured s':>12}  {'ratio':>7}"]
    lines += [row(k, predicted.get(k), measured.get(k)) for k in keys]
    lines.append(row("step", plan.predicted_iteration_s, step))
    lines.append(f"(measured: median over {len(bounds)} iteration(s); ratio = predicted / measured)")
    return "\n".join(lines)
