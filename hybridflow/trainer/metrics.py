"""Step metrics with the field's names, and the trackers they go to.

Timings come from the executor's spans, through a table keyed by (node kind,
role kind) — :data:`TIMING_NAMES` — so a new node kind is one row, not a branch.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Iterable, Mapping, Protocol, TextIO

from ..runtime.spans import Span

__all__ = ["TIMING_NAMES", "timing_metrics", "Tracker", "ConsoleTracker", "JsonlTracker", "format_metrics", "nan_streak"]

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

    KEYS = ("critic/score/mean", "val/score/greedy", "actor/pg_loss", "actor/ppo_kl", "actor/entropy", "critic/vf_loss",
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
    """Writes ``{"step": s, **metrics}`` per line to ``path``.

    A fresh run (``resume_step`` None) starts the file anew; a resumed run keeps the lines
    of steps up to ``resume_step`` (those after it are redone) and appends.
    """

    def __init__(self, path: str | Path, *, resume_step: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if resume_step is not None and self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    if json.loads(line)["step"] <= resume_step:
                        kept.append(line + "\n")
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a line cut by the interruption
        self._file = self.path.open("w", encoding="utf-8")
        self._file.writelines(kept)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._file.write(json.dumps({"step": step, **{k: float(v) for k, v in metrics.items()}}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


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
