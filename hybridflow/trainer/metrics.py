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

__all__ = ["TIMING_NAMES", "timing_metrics", "Tracker", "ConsoleTracker", "JsonlTracker", "format_metrics"]

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
            print(f"step {step:>4}  {format_metrics(metrics, self.KEYS)}", file=self.stream, flush=True)

    def close(self) -> None:
        pass


class JsonlTracker:
    """Appends ``{"step": s, **metrics}`` per line to ``path``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._file.write(json.dumps({"step": step, **{k: float(v) for k, v in metrics.items()}}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
