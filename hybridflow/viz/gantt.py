"""Gantt charts as self-contained SVG, written by hand: a plan's predicted schedule, a real run's trace, or both.

- predicted: one row per device pool of an :class:`~hybridflow.compiler.plan.ExecutionPlan`
  (and one for the controller), one bar per op from ``predicted_start_s`` to
  ``predicted_end_s``; a cross-pool weight sync is drawn on both pools.
- measured: one row per track of a Chrome trace (``hybridflow.runtime.spans.chrome_trace``:
  complete events, microseconds), one iteration of it (the last by default),
  shifted to start at 0.

Both sections share one time axis, so a run can be read against its
prediction. Bars are coloured by role (the graph drawing's colours); weight
syncs are hatched, offload/onload grey, and work for a later iteration
(staleness) has a dashed outline. Every bar has a tooltip with its details.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path

from .graph import PALETTE, ROLE_COLOURS

__all__ = ["Bar", "Row", "plan_rows", "trace_rows", "gantt_svg", "draw_gantt"]

TRANSFER_COLOUR = "#bdbdbd"
LABEL_W, CHART_W, ROW_H, BAR_H, FONT = 190, 1000, 30, 22, 11


@dataclass(frozen=True)
class Bar:
    """One op on one row."""

    start: float
    end: float
    label: str
    role: str
    kind: str
    tooltip: str
    later_iteration: int = 0
    """k > 0: the op works for iteration i + k (staleness)."""


@dataclass(frozen=True)
class Row:
    label: str
    bars: tuple[Bar, ...]


def _colour(role: str, roles: list[str]) -> str:
    if role in ROLE_COLOURS:
        return ROLE_COLOURS[role]
    return PALETTE[roles.index(role) % len(PALETTE)] if role in roles else PALETTE[0]


def plan_rows(plan) -> list[Row]:
    """One row per pool (in plan order) and one for the controller, with the predicted ops."""
    rows: dict[str, list[Bar]] = {p.name: [] for p in plan.pools}
    rows["controller"] = []
    for op in plan.ops:
        what = op.node or op.kind
        tip = [f"{op.name} ({op.kind}) on {op.role}", f"{op.predicted_start_s:.4g} .. {op.predicted_end_s:.4g} s "
               f"({op.predicted_end_s - op.predicted_start_s:.4g} s)"]
        if op.iteration_offset:
            tip.append(f"works for iteration i+{op.iteration_offset}")
        if op.items:
            tip.append("moves " + ", ".join(op.items))
        if op.volume_bytes is not None:
            tip.append(f"{op.volume_bytes / 2**30:.3g} GiB per device")
        if op.peak_memory_bytes is not None:
            tip.append(f"peak {op.peak_memory_bytes / 2**30:.3g} GiB per device")
        if op.note:
            tip.append(op.note)
        bar = Bar(op.predicted_start_s, op.predicted_end_s, what if op.kind == "node" else f"{op.kind} {op.role}",
                  op.role, op.kind, "\n".join(tip), op.iteration_offset)
        for pool in filter(None, (op.pool or "controller", op.target_pool)):
            rows[pool].append(bar)
    labels = {p.name: f"{p.name} ({len(p.devices)} dev.)" for p in plan.pools}
    return [Row(labels.get(name, name), tuple(bars)) for name, bars in rows.items() if bars or name != "controller"]


def _trace_events(trace: dict) -> tuple[dict[int, str], list[dict]]:
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else []
    names = {e.get("tid"): e.get("args", {}).get("name", str(e.get("tid"))) for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    complete = [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    return names, complete


def trace_rows(trace: dict, iteration: int | None = None) -> tuple[list[Row], int | None]:
    """Rows of one iteration of a real run's Chrome trace (default: the last), times shifted to start at 0."""
    names, events = _trace_events(trace)
    iterations = sorted({e.get("args", {}).get("iteration") for e in events} - {None})
    if iteration is not None and iteration not in iterations:
        from ..errors import TraceError

        held = f"iterations {iterations[0]}..{iterations[-1]}" if iterations else "no iteration numbers"
        raise TraceError(f"--iteration {iteration}: the trace holds {held}; pick one of those "
                         "(or leave --iteration out for the last)")
    chosen = iteration if iteration is not None else (iterations[-1] if iterations else None)
    if chosen is not None:
        events = [e for e in events if e.get("args", {}).get("iteration", chosen) == chosen]
    origin = min((e["ts"] for e in events), default=0.0)
    rows: dict[object, list[Bar]] = {}
    for e in events:
        args = e.get("args", {})
        start, end = (e["ts"] - origin) / 1e6, (e["ts"] - origin + e.get("dur", 0.0)) / 1e6
        kind = args.get("kind", e.get("cat", "node"))
        tip = f"{e.get('name')} ({kind}) on {args.get('role', '?')}\n{start:.4g} .. {end:.4g} s ({end - start:.4g} s)"
        rows.setdefault(e.get("tid"), []).append(Bar(start, end, str(args.get("node") or e.get("name")), str(args.get("role", "")),
                                                     str(kind), tip))
    return [Row(names.get(tid, f"track {tid}"), tuple(bars)) for tid, bars in rows.items()], chosen


def _step(span: float) -> float:
    """A 1/2/5 x 10^k tick step giving 5-10 ticks over ``span``."""
    raw = span / 8 if span > 0 else 1.0
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _text(x: float, y: float, text: str, size: int = FONT, anchor: str = "start", weight: str = "normal") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}">'
            f"{html.escape(text)}</text>")


def _fit(label: str, role: str, width: float, char: float = 5.8) -> str:
    """The label, or without its ``role.`` prefix (the colour says the role), or cut with an ellipsis, to fit ``width`` px."""
    for text in (label, label.removeprefix(f"{role}.")):
        if width > char * len(text) + 6:
            return text
    keep = int((width - 6) / char) - 1
    return text[:keep] + "…" if keep >= 2 else ""


def _bar_svg(bar: Bar, x0: float, scale: float, y: float, roles: list[str]) -> str:
    x, w = x0 + bar.start * scale, max(1.5, (bar.end - bar.start) * scale)
    fill = TRANSFER_COLOUR if bar.kind in ("offload", "onload") else _colour(bar.role, roles)
    style = ' stroke-dasharray="4 2"' if bar.later_iteration else ""
    parts = [f'<g><title>{html.escape(bar.tooltip)}</title>',
             f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{BAR_H}" fill="{fill}" stroke="#333" stroke-width="0.8"{style}/>']
    if bar.kind == "weight_sync":
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{BAR_H}" fill="url(#hatch)"/>')
    label = _fit(bar.label + (f" (for i+{bar.later_iteration})" if bar.later_iteration else ""), bar.role, w)
    if label:
        parts.append(_text(x + 3, y + BAR_H / 2 + 4, label, 10))
    return "".join(parts) + "</g>"


def _section(title: str, rows: list[Row], y: float, scale: float, roles: list[str]) -> tuple[list[str], float]:
    out = [_text(8, y + 16, title, 13, weight="bold")]
    y += 24
    for k, row in enumerate(rows):
        if k % 2 == 0:
            out.append(f'<rect x="0" y="{y:.1f}" width="{LABEL_W + CHART_W + 20}" height="{ROW_H}" fill="#f6f6f6"/>')
        out.append(_text(8, y + ROW_H / 2 + 4, row.label, FONT))
        out += [_bar_svg(b, LABEL_W, scale, y + (ROW_H - BAR_H) / 2, roles) for b in sorted(row.bars, key=lambda b: b.start)]
        y += ROW_H
    return out, y + 8


def gantt_svg(plan=None, trace: dict | None = None, *, iteration: int | None = None, title: str | None = None) -> str:
    """The SVG text: the plan's predicted schedule and/or a run's trace, on one time axis."""
    sections: list[tuple[str, list[Row]]] = []
    if plan is not None:
        head = f"predicted: {plan.graph.name} on {plan.cluster}, placement {plan.strategy}"
        if plan.predicted_iteration_s:
            head += f", {plan.predicted_iteration_s:.4g} s per iteration"
        sections.append((head, plan_rows(plan)))
    if trace is not None:
        rows, chosen = trace_rows(trace, iteration)
        sections.append((f"measured: run trace" + (f", iteration {chosen}" if chosen is not None else ""), rows))
    bars = [b for _, rows in sections for r in rows for b in r.bars]
    span = max((b.end for b in bars), default=1.0) or 1.0
    step = _step(span)
    span = math.ceil(span / step) * step
    scale = CHART_W / span
    roles = sorted({b.role for b in bars})
    out, y = [], 46.0
    for name, rows in sections:
        body, y = _section(name, rows, y, scale, roles)
        out += body
    axis = [f'<line x1="{LABEL_W}" y1="{y:.1f}" x2="{LABEL_W + CHART_W}" y2="{y:.1f}" stroke="#333"/>']
    for k in range(int(round(span / step)) + 1):
        x = LABEL_W + k * step * scale
        axis.append(f'<line x1="{x:.1f}" y1="40" x2="{x:.1f}" y2="{y:.1f}" stroke="#ccc" stroke-width="0.6"/>')
        axis.append(_text(x, y + 14, f"{k * step:g}", 10, "middle"))
    axis.append(_text(LABEL_W + CHART_W / 2, y + 30, "seconds from the start of the iteration", 11, "middle"))
    legend, lx = [], 8.0
    for role in roles:
        legend.append(f'<rect x="{lx:.1f}" y="{y + 42:.1f}" width="14" height="12" fill="{_colour(role, roles)}" stroke="#333" stroke-width="0.6"/>')
        legend.append(_text(lx + 18, y + 52, role, 10))
        lx += 26 + 6.2 * len(role)
    for fill, extra, text in (("#fff", '<rect x="{x}" y="{y}" width="14" height="12" fill="url(#hatch)"/>', "weight sync"),
                              (TRANSFER_COLOUR, "", "offload / onload"),
                              ("#fff", '<rect x="{x}" y="{y}" width="14" height="12" fill="none" stroke="#333" stroke-dasharray="4 2"/>',
                               "work for a later iteration")):
        legend.append(f'<rect x="{lx:.1f}" y="{y + 42:.1f}" width="14" height="12" fill="{fill}" stroke="#333" stroke-width="0.6"/>'
                      + extra.format(x=f"{lx:.1f}", y=f"{y + 42:.1f}"))
        legend.append(_text(lx + 18, y + 52, text, 10))
        lx += 26 + 6.2 * len(text)
    height = y + 64
    width = LABEL_W + CHART_W + 20
    heading = _text(8, 22, title or "schedule", 15, weight="bold")
    defs = ('<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
            '<line x1="0" y1="0" x2="0" y2="6" stroke="#7a4a00" stroke-width="2"/></pattern></defs>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:.0f}" viewBox="0 0 {width} {height:.0f}" '
            f'font-family="Helvetica, Arial, sans-serif">{defs}<rect width="100%" height="100%" fill="white"/>'
            + heading + "".join(out) + "".join(axis) + "".join(legend) + "</svg>\n")


def draw_gantt(out: str | Path, plan=None, trace: dict | None = None, *, iteration: int | None = None,
               title: str | None = None) -> Path:
    """Write the Gantt chart to ``out`` (``.svg`` added when missing); returns the path."""
    path = Path(out)
    if path.suffix != ".svg":
        path = path.with_name(path.name + ".svg")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(gantt_svg(plan, trace, iteration=iteration, title=title))
    return path
