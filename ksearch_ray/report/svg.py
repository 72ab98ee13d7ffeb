"""Small inline SVG charts for the HTML report: no plotting library, nothing fetched at view time.

One chart kind is all the report needs: a best-so-far step line over some x axis (round, running
time, dollars), optionally over a scatter of every passing candidate and marks for the failed
ones. All text is escaped: labels can come from a model's output.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 560, 250
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 14, 42


@dataclass
class Point:
    x: float
    y: float | None  # None: a failed candidate, drawn as a mark on the x axis
    label: str


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About `count` round numbers covering [lo, hi] (1, 2 or 5 times a power of ten apart)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        if value >= lo - step * 1e-9:
            ticks.append(round(value, 12))
        value += step
    return ticks


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000 or abs(value) < 0.01:
        return f"{value:.3g}"
    return f"{value:.4g}"


def step_chart(
    best: Sequence[Point],
    *,
    x_label: str,
    y_label: str,
    x_end: float | None = None,
    others: Sequence[Point] = (),
    reference_y: float | None = 1.0,
    x_format: Callable[[float], str] = _fmt,
) -> str:
    """Best-so-far as a step line (it holds until the next improvement, up to `x_end`), over the
    `others` scatter; a dashed line at `reference_y` (the baseline) when it lies in range."""
    ys = [p.y for p in (*best, *others) if p.y is not None]
    xs = [p.x for p in (*best, *others)] + ([x_end] if x_end is not None else [])
    if not ys or not xs:
        return ""
    y_lo, y_hi = min(ys), max(ys)
    if reference_y is not None and y_lo <= reference_y * 1.5 and y_hi >= reference_y / 1.5:
        y_lo, y_hi = min(y_lo, reference_y), max(y_hi, reference_y)
    pad = (y_hi - y_lo) * 0.08 or abs(y_hi) * 0.1 or 1.0
    y_lo, y_hi = max(0.0, y_lo - pad) if y_lo >= 0 else y_lo - pad, y_hi + pad
    x_lo, x_hi = min(0.0, min(xs)), max(xs)
    if x_hi <= x_lo:
        x_hi = x_lo + 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x_lo) / (x_hi - x_lo) * plot_w

    def sy(y: float) -> float:
        return TOP + (1 - (y - y_lo) / (y_hi - y_lo)) * plot_h

    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{escape(y_label)} against {escape(x_label)}" xmlns="http://www.w3.org/2000/svg">',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" class="plot"/>',
    ]
    for tick in nice_ticks(y_lo, y_hi):
        y = sy(tick)
        parts.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(_fmt(tick))}</text>')
    for tick in nice_ticks(x_lo, x_hi, 6):
        x = sx(tick)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP + plot_h}" y2="{TOP + plot_h + 4}" class="axis"/>')
        parts.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 17}" text-anchor="middle">{escape(x_format(tick))}</text>')
    parts.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 6}" text-anchor="middle" class="label">{escape(x_label)}</text>')
    parts.append(f'<text transform="translate(14 {TOP + plot_h / 2}) rotate(-90)" text-anchor="middle" class="label">{escape(y_label)}</text>')
    if reference_y is not None and y_lo <= reference_y <= y_hi:
        y = sy(reference_y)
        parts.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" class="reference"><title>baseline</title></line>')
    for p in others:
        if p.y is None:
            parts.append(f'<path d="M{sx(p.x) - 3:.1f},{TOP + plot_h - 9} l6,6 m0,-6 l-6,6" class="failed"><title>{escape(p.label)}</title></path>')
        else:
            parts.append(f'<circle cx="{sx(p.x):.1f}" cy="{sy(p.y):.1f}" r="2.5" class="other"><title>{escape(p.label)}</title></circle>')
    line: list[str] = []
    for i, p in enumerate(best):
        assert p.y is not None
        line.append(f"M{sx(p.x):.1f},{sy(p.y):.1f}" if i == 0 else f"H{sx(p.x):.1f} V{sy(p.y):.1f}")
    if best and x_end is not None and x_end > best[-1].x:
        line.append(f"H{sx(x_end):.1f}")
    if line:
        parts.append(f'<path d="{" ".join(line)}" class="best"/>')
    for p in best:
        assert p.y is not None
        parts.append(f'<circle cx="{sx(p.x):.1f}" cy="{sy(p.y):.1f}" r="3.5" class="bestpt"><title>{escape(p.label)}</title></circle>')
    parts.append("</svg>")
    return "\n".join(parts)
