"""Small dependency-free SVG line charts for the report and the live page.

One time axis, any number of series, and vertical markers for actions (a
command, its result). Values are plotted as given; a ``None`` breaks a line.

Example::

    svg = line_chart("util", {"node-0-gpu1": [(t0, 0.4), (t1, 0.0)]},
                     markers=[(t1, "quarantine")], y_label="ratio")
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape

WIDTH, HEIGHT = 860, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 40
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b")

Point = tuple[datetime, float | None]


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    step = (hi - lo) / (n - 1)
    return [lo + i * step for i in range(n)]


def _gap_s(points: Sequence[Point]) -> float:
    """A break longer than three typical steps (the median) ends a line."""
    steps = sorted((b[0] - a[0]).total_seconds() for a, b in itertools.pairwise(points))
    steps = [s for s in steps if s > 0]
    return 3 * steps[len(steps) // 2] if steps else float("inf")


def _fmt(v: float) -> str:
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def line_chart(
    title: str,
    series: Mapping[str, Sequence[Point]],
    *,
    markers: Sequence[tuple[datetime, str]] = (),
    y_label: str = "",
) -> str:
    """An SVG chart; an empty one that says so when there is no data."""
    points = [(t, v) for s in series.values() for t, v in s if v is not None]
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'class="chart" role="img" aria-label="{escape(title)}">'
        f'<text x="{LEFT}" y="18" class="title">{escape(title)}</text>'
    )
    if not points:
        return head + f'<text x="{LEFT}" y="{HEIGHT // 2}">no data yet</text></svg>'
    times = [t.timestamp() for t, _ in points] + [t.timestamp() for t, _ in markers]
    t0, t1 = min(times), max(times)
    t1 = t1 if t1 > t0 else t0 + 1
    v0 = min(0.0, min(v for _, v in points))
    v1 = max(v for _, v in points)
    v1 = v1 if v1 > v0 else v0 + 1
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: datetime) -> float:
        return LEFT + (t.timestamp() - t0) / (t1 - t0) * w

    def y(v: float) -> float:
        return TOP + h - (v - v0) / (v1 - v0) * h

    parts = [head, f'<rect x="{LEFT}" y="{TOP}" width="{w}" height="{h}" class="frame"/>']
    for tick in _ticks(v0, v1):
        parts.append(
            f'<text x="{LEFT - 6}" y="{y(tick) + 4:.1f}" class="ytick">{_fmt(tick)}</text>'
        )
    for i in range(5):
        ts = t0 + (t1 - t0) * i / 4
        label = datetime.fromtimestamp(ts, tz=points[0][0].tzinfo).strftime("%H:%M:%S")
        parts.append(
            f'<text x="{LEFT + w * i / 4:.1f}" y="{HEIGHT - 22}" class="xtick">{label}</text>'
        )
    if y_label:
        parts.append(f'<text x="12" y="{TOP + h / 2:.0f}" class="ylabel">{escape(y_label)}</text>')
    for i, (name, pts) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        ordered = sorted(pts, key=lambda p: p[0])
        gap_s = _gap_s(ordered)
        runs: list[list[str]] = [[]]
        previous: datetime | None = None
        for t, v in ordered:
            if v is None or (previous is not None and (t - previous).total_seconds() > gap_s):
                runs.append([])  # missing data is a gap, never a straight line across it
            if v is not None:
                runs[-1].append(f"{x(t):.1f},{y(v):.1f}")
            previous = t
        for run in runs:
            if run:
                parts.append(f'<polyline points="{" ".join(run)}" stroke="{colour}" class="line"/>')
        parts.append(
            f'<text x="{LEFT + 8 + 180 * i}" y="{HEIGHT - 6}" fill="{colour}" class="legend">'
            f"{escape(name)}</text>"
        )
    for t, label in markers:
        parts.append(
            f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{TOP}" y2="{TOP + h}" class="marker"/>'
            f'<text x="{x(t) + 3:.1f}" y="{TOP + 12}" class="marker-label">{escape(label)}</text>'
        )
    return "".join(parts) + "</svg>"
