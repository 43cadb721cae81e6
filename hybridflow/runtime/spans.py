"""Spans of the ops a run executed, and their Chrome / Perfetto trace.

Every executor records one :class:`Span` per op it runs. :func:`chrome_trace`
turns them into the Trace Event Format (complete events, ``"ph": "X"``, times
in microseconds) that ``chrome://tracing`` and ui.perfetto.dev open; each
device (or worker) is one track. Spans of plans run beside the iterations (validation) carry
``"beside": true`` in their event's args, so that a reader of the trace (``hybridflow explain``) can
leave them out of the iterations' timings.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

__all__ = ["Span", "SpanRecorder", "chrome_trace", "write_chrome_trace"]


@dataclass(frozen=True)
class Span:
    """One op run: what, where, and when (seconds on the recorder's clock)."""

    op: str
    node: str | None
    kind: str
    role: str
    device: str
    start: float
    end: float
    iteration: int = 0
    sent: int | None = None
    """The executor's event number when the op was sent (an order, not a time: see ``PlanExecutor.events``)."""
    done: int | None = None
    """The event number when its results were collected."""
    call: int | None = None
    """The ``run_iteration`` call (numbered from 0) during which it was sent; with overlap, a generation of
    iteration i+1 is sent during call i."""


class SpanRecorder:
    """Collects spans; ``record(...)`` is a context manager timing the block it wraps."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self.spans: list[Span] = []

    def now(self) -> float:
        return time.perf_counter() - self.origin

    def add(self, span: Span) -> None:
        self.spans.append(span)

    def started(self, op: str) -> None:
        """Called as an executor starts op ``op`` (before its span exists); a hook for progress displays."""

    class _Timer:
        def __init__(self, recorder: "SpanRecorder", fields: dict) -> None:
            self.recorder, self.fields = recorder, fields

        def __enter__(self):
            self.start = self.recorder.now()
            return self

        def __exit__(self, *exc) -> None:
            self.recorder.add(Span(start=self.start, end=self.recorder.now(), **self.fields))

    def record(self, *, op: str, node: str | None, kind: str, role: str, device: str, iteration: int = 0, **order):
        """Time the block; ``order`` may give the span's ``sent``, ``done`` and ``call`` (see :class:`Span`)."""
        return self._Timer(self, dict(op=op, node=node, kind=kind, role=role, device=device, iteration=iteration, **order))


def chrome_trace(spans: Iterable[Span], *, process: str = "hybridflow run", beside: Iterable[Span] = ()) -> dict:
    """The Trace Event Format object of ``spans``: one thread track per device. Those of ``spans`` that are in
    ``beside`` (the executor's ``side_spans``: validation) are marked ``"beside": true`` in their args."""
    spans = list(spans)
    marked = {id(s) for s in beside}
    tracks = {device: i for i, device in enumerate(dict.fromkeys(s.device for s in spans))}
    events: list[dict] = [{"ph": "M", "pid": 0, "name": "process_name", "args": {"name": process}}]
    events += [{"ph": "M", "pid": 0, "tid": tid, "name": "thread_name", "args": {"name": device}}
               for device, tid in tracks.items()]
    for s in spans:
        events.append({
            "ph": "X", "pid": 0, "tid": tracks[s.device], "name": s.op, "cat": s.kind,
            "ts": round(s.start * 1e6, 3), "dur": round(max(s.end - s.start, 0.0) * 1e6, 3),
            "args": {k: v for k, v in asdict(s).items() if k not in ("start", "end")} | ({"beside": True} if id(s) in marked else {}),
        })
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(spans: Iterable[Span], path: str | os.PathLike, **kwargs) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(spans, **kwargs)))
    return path
