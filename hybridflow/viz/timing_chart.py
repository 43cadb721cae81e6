"""Predicted against measured seconds per op, as a self-contained SVG written by hand (``hybridflow explain``).

One row per op: a light bar for the cost model's prediction, a dark bar for the measured median, and a whisker for
the measured spread, on a logarithmic axis (the ops of one step span several orders of magnitude). The row's label
ends with measured / predicted. Ops on the critical path are marked with a dot.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

__all__ = ["TimingRow", "timing_chart_svg", "write_timing_chart"]

LABEL_W, CHART_W, ROW_H, FONT = 260, 640, 26, 11
PREDICTED, MEASURED, WHISKER = "#9ecae1", "#08519c", "#333"


@dataclass(frozen=True)
class TimingRow:
    """One op: its name, predicted seconds, measured median and spread (None: not measured)."""

    name: str
    predicted_s: float
    median_s: float | None
    low_s: float | None = None
    high_s: float | None = None
    critical: bool = False


def _text(x: float, y: float, text: str, size: int = FONT, anchor: str = "start", weight: str = "normal") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" font-family="sans-serif" text-anchor="{anchor}" '
            f'font-weight="{weight}">{html.escape(text)}</text>')


def _decades(rows: Sequence[TimingRow]) -> tuple[int, int]:
    values = [v for r in rows for v in (r.predicted_s, r.median_s, r.low_s, r.high_s) if v is not None and v > 0]
    if not values:
        return -4, 0
    return math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))


def timing_chart_svg(rows: Sequence[TimingRow], *, title: str) -> str:
    """The chart's SVG text."""
    lo, hi = _decades(rows)
    hi = max(hi, lo + 1)

    def x_of(seconds: float | None) -> float:
        if seconds is None or seconds <= 0:
            return LABEL_W
        return LABEL_W + (math.log10(seconds) - lo) / (hi - lo) * CHART_W

    top = 40
    height = top + ROW_H * len(rows) + 70
    width = LABEL_W + CHART_W + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
           '<rect width="100%" height="100%" fill="white"/>', _text(8, 20, title, 13, weight="bold")]
    bottom = top + ROW_H * len(rows)
    for decade in range(lo, hi + 1):
        x = x_of(10.0 ** decade)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="#ccc" stroke-width="0.6"/>')
        out.append(_text(x, bottom + 14, f"{10.0 ** decade:g} s", 10, "middle"))
    for k, row in enumerate(rows):
        y = top + k * ROW_H
        if k % 2 == 0:
            out.append(f'<rect x="0" y="{y}" width="{width}" height="{ROW_H}" fill="#f6f6f6"/>')
        ratio = f"  x{row.median_s / row.predicted_s:.2f}" if row.median_s is not None and row.predicted_s > 0 else ""
        mark = "\u25cf " if row.critical else "  "
        out.append(_text(8, y + ROW_H / 2 + 4, f"{mark}{row.name}{ratio}"))
        tip = (f"{row.name}: predicted {row.predicted_s:.4g} s" + (f", measured {row.median_s:.4g} s" if row.median_s is not None else
                                                                   ", not measured"))
        out.append(f"<g><title>{html.escape(tip)}</title>")
        out.append(f'<rect x="{LABEL_W}" y="{y + 4}" width="{max(1.0, x_of(row.predicted_s) - LABEL_W):.1f}" height="8" '
                   f'fill="{PREDICTED}"/>')
        if row.median_s is not None:
            out.append(f'<rect x="{LABEL_W}" y="{y + 13}" width="{max(1.0, x_of(row.median_s) - LABEL_W):.1f}" height="8" '
                       f'fill="{MEASURED}"/>')
        if row.low_s is not None and row.high_s is not None:
            a, b, mid = x_of(row.low_s), x_of(row.high_s), y + 17
            out.append(f'<line x1="{a:.1f}" y1="{mid}" x2="{b:.1f}" y2="{mid}" stroke="{WHISKER}" stroke-width="1.2"/>')
            out += [f'<line x1="{v:.1f}" y1="{mid - 4}" x2="{v:.1f}" y2="{mid + 4}" stroke="{WHISKER}"/>' for v in (a, b)]
        out.append("</g>")
    legend_y = bottom + 34
    out.append(f'<rect x="{LABEL_W}" y="{legend_y - 9}" width="14" height="8" fill="{PREDICTED}"/>')
    out.append(_text(LABEL_W + 18, legend_y, "predicted (plan.json)", 10))
    out.append(f'<rect x="{LABEL_W + 150}" y="{legend_y - 9}" width="14" height="8" fill="{MEASURED}"/>')
    out.append(_text(LABEL_W + 168, legend_y, "measured median, whisker: spread (trace.json)", 10))
    out.append(_text(LABEL_W, legend_y + 16, "\u25cf on the critical path; xR = measured / predicted", 10))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_timing_chart(rows: Sequence[TimingRow], path: str | Path, *, title: str) -> Path:
    """Write :func:`timing_chart_svg` to ``path``; returns it."""
    path = Path(path)
    path.write_text(timing_chart_svg(rows, title=title), encoding="utf-8")
    return path
