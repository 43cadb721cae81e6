"""A plan's predicted schedule as a Chrome / Perfetto trace (Trace Event Format JSON).

:func:`plan_trace` writes one thread track per device pool (and one for the
controller) in one process named after the plan, and one complete event
(``"ph": "X"``, microseconds) per op with its kind, role, node, items,
volume, peak memory, deps and note as arguments; a cross-pool weight sync
appears on both pools' tracks. Open the file in ui.perfetto.dev or
chrome://tracing. The event layout matches the real run's trace
(:func:`hybridflow.runtime.spans.chrome_trace`), so the two read alike.
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["plan_trace", "write_plan_trace"]


def plan_trace(plan) -> dict:
    """The Trace Event Format object of ``plan``'s predicted timeline."""
    name = f"predicted: {plan.graph.name} on {plan.cluster} ({plan.strategy})"
    tracks = [p.name for p in plan.pools] + ["controller"]
    tid = {track: k for k, track in enumerate(tracks)}
    events: list[dict] = [{"ph": "M", "pid": 0, "name": "process_name", "args": {"name": name}}]
    for track in tracks:
        label = track if track == "controller" else f"{track} ({len(plan.pool(track).devices)} devices)"
        events.append({"ph": "M", "pid": 0, "tid": tid[track], "name": "thread_name", "args": {"name": label}})
        events.append({"ph": "M", "pid": 0, "tid": tid[track], "name": "thread_sort_index", "args": {"sort_index": tid[track]}})
    for op in plan.ops:
        args = {"kind": op.kind, "role": op.role, "node": op.node, "iteration_offset": op.iteration_offset,
                "deps": list(op.deps)}
        for key in ("items", "volume_bytes", "peak_memory_bytes", "target_pool", "note"):
            value = getattr(op, key)
            if value not in (None, (), ""):
                args[key] = list(value) if isinstance(value, tuple) else value
        for track in filter(None, (op.pool or "controller", op.target_pool)):
            events.append({"ph": "X", "pid": 0, "tid": tid[track], "name": op.name, "cat": op.kind,
                           "ts": round(op.predicted_start_s * 1e6, 3),
                           "dur": round((op.predicted_end_s - op.predicted_start_s) * 1e6, 3), "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"predicted_iteration_s": plan.predicted_iteration_s, "staleness": plan.staleness}}


def write_plan_trace(plan, path: str | Path) -> Path:
    """Write :func:`plan_trace` as JSON to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan_trace(plan)))
    return path
