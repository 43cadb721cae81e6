"""Step metrics with the field's names, and the trackers they go to.

Timings come from the executor's spans, through a table keyed by (node kind,
role kind) — :data:`TIMING_NAMES` — so a new node kind is one row, not a branch.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Iterable, Mapping, Protocol, TextIO

from ..errors import WriteError
from ..runtime.spans import Span

__all__ = ["SCORE_KEYS", "training_score", "TIMING_NAMES", "timing_metrics", "Tracker", "ConsoleTracker", "JsonlTracker", "format_metrics", "nan_streak"]

TIMING_NAMES: dict[tuple[str, str], str] = {
    ("generate", "policy"): "timing_s/gen",
    ("infer.logprob", "policy"): "timing_s/old_log_prob",
    ("infer.logprob", "reference"): "timing_s/ref",
    ("infer.values", "critic"): "timing_s/values",
    ("score", "reward"): "timing_s/reward",
    ("score", "cost"): "timing_s/reward",
    ("compute", "controller"): "timing_s/adv",
    ("update", "policy"): "timing_s/update_actor",
    ("update", "critic"): "timing_s/update_critic",
    ("weight_sync", "policy"): "timing_s/update_weights",
    ("offload", "*"): "timing_s/offload",
    ("onload", "*"): "timing_s/offload",
}
"""(span kind or 'infer.<op>', role kind) -> metric name; '*' matches any role kind."""


def timing_metrics(spans: Iterable[Span], role_kinds: Mapping[str, str], ops: Mapping[str, str]) -> dict[str, float]:
    """Seconds per metric name, summed over the spans of one step. ``ops``: node name -> op name."""
    out: dict[str, float] = {}
    for span in spans:
        kind = f"infer.{ops.get(span.node or '', '')}" if span.kind == "infer" else span.kind
        role_kind = role_kinds.get(span.role, "controller")
        name = TIMING_NAMES.get((kind, role_kind)) or TIMING_NAMES.get((kind, "*"))
        if name:
            out[name] = out.get(name, 0.0) + (span.end - span.start)
    return out


SCORE_KEYS = ("critic/score/mean", "reward/score/mean")
"""The step's mean reward: ``critic/score/mean`` for a graph with a critic (verl's name), else
``reward/score/mean`` (see :mod:`hybridflow.runtime.node_metrics`)."""


def training_score(metrics: Mapping[str, float]) -> float | None:
    """The step's mean reward under whichever of :data:`SCORE_KEYS` the step has; None without one."""
    return next((metrics[k] for k in SCORE_KEYS if k in metrics), None)


class Tracker(Protocol):
    def log(self, metrics: Mapping[str, float], step: int) -> None: ...
    def close(self) -> None: ...


def format_metrics(metrics: Mapping[str, float], keys: Iterable[str]) -> str:
    parts = []
    for key in keys:
        if key in metrics and isinstance(metrics[key], (int, float)) and math.isfinite(metrics[key]):
            parts.append(f"{key.split('/', 1)[-1] if key.startswith('timing_s/') else key}={metrics[key]:.4g}")
    return "  ".join(parts)


class ConsoleTracker:
    """One line per step with the metrics people watch."""

    KEYS = (*SCORE_KEYS, "val/score/greedy", "actor/pg_loss", "actor/ppo_kl", "actor/entropy", "critic/vf_loss",
            "response_length/mean", "timing_s/step")

    def __init__(self, every: int = 1, stream: TextIO | None = None):
        self.every, self.stream = every, stream or sys.stdout

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if step % self.every == 0 or any(k.startswith("val/") for k in metrics):
            from .progress import write_line

            write_line(f"step {step:>4}  {format_metrics(metrics, self.KEYS)}", self.stream)

    def close(self) -> None:
        pass


class JsonlTracker:
    """Writes ``{"step": s, **metrics}`` per line to ``path``, and never loses an earlier record.

    A resumed run (``resume_step`` k) keeps the records of steps up to k, drops those after
    it (the resumed run redoes them) and a line cut by the interruption, and appends; the file
    is rewritten only when something is dropped, through a temporary file and a rename, so a
    kill at any moment leaves either the old file or the new one. A line that is not a JSON
    record is reported (a warning with its line number) and kept in ``<stem>.unreadable.txt``
    beside the file. A fresh run (``resume_step`` None) on a folder whose ``path`` already holds
    records sets that file aside as ``metrics.1.jsonl`` (the first free number) and starts a new one.

    Each record is written with one unbuffered write; when that fails (a full disk, a file-size
    limit) the file is cut back to the records before it, so it never ends in a half-written
    line, and :class:`~hybridflow.errors.WriteError` names the file and the reason.
    """

    def __init__(self, path: str | Path, *, resume_step: int | None = None):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.is_file() and self.path.stat().st_size:
                if resume_step is None:
                    self._set_aside()
                else:
                    self._keep_until(resume_step)
            self._file = self.path.open("ab", buffering=0)
        except OSError as err:
            raise WriteError("the metrics file cannot be written", err, self.path) from None

    def _keep_until(self, step: int) -> None:
        text = self.path.read_text(encoding="utf-8", errors="replace")
        lines = text.splitlines()
        unreadable = [(number, line) for number, line in enumerate(lines, 1) if line.strip() and _record(line) is None]
        kept = [line for line in lines if _record_kept(line, step)]
        if unreadable:
            self._report_unreadable(unreadable, last_cut=not text.endswith("\n") and unreadable[-1][0] == len(lines))
        if kept == lines and text.endswith("\n"):
            return
        temporary = self.path.with_name(self.path.name + ".tmp")
        try:
            with temporary.open("w", encoding="utf-8") as out:
                out.writelines(line + "\n" for line in kept)
                out.flush()
                os.fsync(out.fileno())
        except OSError:
            temporary.unlink(missing_ok=True)
            raise
        os.replace(temporary, self.path)

    def _report_unreadable(self, unreadable: list[tuple[int, str]], last_cut: bool) -> None:
        """Warn about lines that are no JSON record, and keep them beside the file (nothing is dropped unsaid)."""
        aside = self.path.with_name(f"{self.path.stem}.unreadable.txt")
        with aside.open("a", encoding="utf-8") as out:
            out.writelines(f"{self.path.name}:{number}: {line}\n" for number, line in unreadable)
        numbers = ", ".join(str(number) for number, _ in unreadable[:10]) + (" ..." if len(unreadable) > 10 else "")
        cut = " (the last one cut by the interruption)" if last_cut else ""
        logging.getLogger("hybridflow.trainer").warning(
            "%s: %d line(s) are not JSON records and are left out of the resumed file%s: line %s; they are kept in %s",
            self.path, len(unreadable), cut, numbers, aside)

    def _set_aside(self) -> None:
        number = 1
        while (aside := self.path.with_name(f"{self.path.stem}.{number}{self.path.suffix}")).exists():
            number += 1
        os.replace(self.path, aside)
        logging.getLogger(__name__).warning("a fresh run in %s: the earlier run's %s is kept as %s",
                                            self.path.parent, self.path.name, aside.name)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        data = (json.dumps({"step": step, **{k: float(v) for k, v in metrics.items()}}) + "\n").encode("utf-8")
        fd = self._file.fileno()
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as err:
            try:
                os.ftruncate(fd, start)  # no half-written line: the file ends with the previous record
            except OSError:
                pass
            raise WriteError(f"the metrics of step {step} cannot be written (the records of the steps before "
                             "it are kept)", err, self.path) from None

    def rewind(self, step: int) -> None:
        """Drop the records of the steps after ``step`` (a restart redoes them from its checkpoint), keep the rest."""
        self._file.close()
        try:
            self._keep_until(step)
            self._file = self.path.open("ab", buffering=0)
        except OSError as err:
            raise WriteError("the metrics file cannot be written", err, self.path) from None

    def close(self) -> None:
        self._file.close()


def recorded_history(path: str | Path, last_step: int) -> list[dict[str, float]]:
    """The metrics of steps 1..``last_step`` as ``path`` (a run's ``metrics.jsonl``) holds them, one dict per step
    (the last record of each, without its ``step``); [] where the file is missing (the run logged none there)."""
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return []
    steps: dict[int, dict[str, float]] = {}
    for record in filter(None, map(_record, lines)):
        step = record.pop("step", None)
        if isinstance(step, int) and not isinstance(step, bool) and 1 <= step <= last_step:
            steps[step] = record
    return [steps[s] for s in sorted(steps)]


def learning_curve(path: str | Path, key: str = "val/score/greedy") -> list[tuple[int, float, float]]:
    """``(step, seconds of training steps so far, value of key)`` at each record of ``path`` (a run's
    ``metrics.jsonl``) that has ``key``: the learning curve the example scripts print."""
    curve, elapsed = [], 0.0
    for record in filter(None, map(_record, Path(path).read_text(encoding="utf-8").splitlines())):
        elapsed += record.get("timing_s/step", 0.0)
        if key in record:
            curve.append((record["step"], round(elapsed, 1), record[key]))
    return curve


def format_curve(curve: Iterable[tuple[int, float, float]], name: str = "greedy_accuracy") -> str:
    """The curve as a table with a bar per row (values in [0, 1])."""
    rows = [f"{step:5d}  {seconds:7.1f}  {value:.2f}  {'#' * round(value * 40)}" for step, seconds, value in curve]
    return "\n".join([f"step  train_s  {name}", *rows])


def _record(line: str) -> dict | None:
    """The JSON record on ``line``, or None when it is not one (a cut or garbled line)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def _record_kept(line: str, resume_step: int) -> bool:
    """Whether a resumed run keeps this line: a record of a step up to ``resume_step``, or one without a step."""
    record = _record(line)
    if record is None:
        return False  # reported by JsonlTracker._report_unreadable
    step = record.get("step")
    return not isinstance(step, (int, float)) or isinstance(step, bool) or step <= resume_step


def nan_streak(metrics: Mapping[str, float], step: int, streak: int, limit: int) -> int:
    """The count of consecutive steps whose update skipped a non-finite mini-batch, this step included.

    Raises ExecutionError naming the step and the metrics when it reaches ``limit``; warns otherwise.
    """
    import logging

    from ..errors import ExecutionError

    skipped = sorted(k for k, v in metrics.items() if k.endswith("/nan_skipped") and v > 0)
    if not skipped:
        return 0
    streak += 1
    bad = sorted(k for k, v in metrics.items() if not k.startswith("val/") and isinstance(v, float) and not math.isfinite(v))
    what = ", ".join(skipped) + (f"; non-finite metrics: {', '.join(bad)}" if bad else "")
    if streak >= limit:
        raise ExecutionError(
            f"step {step}: the loss or gradient norm was not finite in {streak} steps in a row ({what}); "
            f"stopping (max_nan_steps={limit}). Lower the learning rate, check the rewards' scale, or "
            "resume from an earlier checkpoint.")
    logging.getLogger("hybridflow.trainer").warning(
        "step %d: update skipped for a non-finite loss or gradient norm (%s); %d in a row, stopping at %d",
        step, what, streak, limit)
    return streak
