"""Small dependency-free SVG line charts for the report and the live page.

One time axis, any number of series, and vertical markers for actions (a
command, a verdict). The time axis spans the series' own data: a marker outside
it is listed under the chart, never allowed to stretch the axis. Markers are
numbered on the chart and spelt out underneath (labels drawn on the chart
overlap as soon as two actions are close); the legend is HTML too, so it wraps
instead of running off the edge. Each series keeps one colour; past the palette,
dashes tell series apart. A ``None`` value, or a step longer than 1.5 sampling
intervals (``step_s``, else three median steps), breaks a line: a gap is drawn
as a gap.

Example::

    html = line_chart("util", {"node-0-gpu1": [(t0, 0.4), (t1, 0.0)]},
                      markers=[(t1, "quarantine")], y_label="ratio", step_s=60)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, tzinfo
from html import escape

WIDTH, HEIGHT = 1000, 300
LEFT, RIGHT, TOP, BOTTOM = 78, 40, 50, 30
COLOURS = (  # ten hues that stay apart for the common colour-vision deficiencies
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#79706e",
)  # fmt: skip
DASHES = ("", "6 3", "2 3", "8 3 2 3")
MARKER_MERGE_PX = 14.0  # markers closer than this share one number

Point = tuple[datetime, float | None]


def _nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 times a power of ten) covering [lo, hi]."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, count - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    return [first + i * step for i in range(math.ceil((hi - first) / step - 1e-9) + 1)]


def _time_ticks(t0: float, t1: float) -> list[float]:
    span = t1 - t0
    step = next((s for s in (10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600)
                 if span / s <= 8), 86400)  # fmt: skip
    first = math.ceil(t0 / step) * step
    return [first + i * step for i in range(int((t1 - first) / step) + 1)]


def _gap_s(points: Sequence[Point], step_s: float | None) -> float:
    if step_s is not None:
        return 1.5 * step_s
    steps = sorted((b[0] - a[0]).total_seconds() for a, b in itertools.pairwise(points))
    steps = [s for s in steps if s > 0]
    return 3 * steps[len(steps) // 2] if steps else float("inf")


def fmt_number(value: float) -> str:
    """Short, readable: 12,345 / 123.5 / 0.0123 / 1.2e-05."""
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 0.001:
        return f"{value:.4g}"
    return f"{value:.2g}"


def line_chart(
    title: str,
    series: Mapping[str, Sequence[Point]],
    *,
    markers: Sequence[tuple[datetime, str]] = (),
    y_label: str = "",
    step_s: float | None = None,
) -> str:
    """A ``<figure>``: the SVG chart, its legend and its numbered markers; an empty chart
    that says so when there is no data."""
    points = [(t, v) for s in series.values() for t, v in s if v is not None]
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'class="chart" role="img" aria-label="{escape(title)}">'
        f'<text x="{LEFT}" y="20" class="title">{escape(title)}</text>'
    )
    if not points:
        svg = head + f'<text x="{LEFT}" y="{HEIGHT // 2}">no data yet</text></svg>'
        return f'<figure class="chart">{svg}</figure>'
    t0 = min(t.timestamp() for t, _ in points)
    t1 = max(t.timestamp() for t, _ in points)
    t1 = t1 if t1 > t0 else t0 + 60
    ticks = _nice_ticks(min(0.0, min(v for _, v in points)), max(v for _, v in points))
    v0, v1 = ticks[0], ticks[-1] if ticks[-1] > ticks[0] else ticks[0] + 1
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    tz = points[0][0].tzinfo

    def x(ts: float) -> float:
        return LEFT + (ts - t0) / (t1 - t0) * w

    def y(value: float) -> float:
        return TOP + h - (value - v0) / (v1 - v0) * h

    parts = [head, f'<rect x="{LEFT}" y="{TOP}" width="{w}" height="{h}" class="frame"/>']
    for tick in ticks:
        parts.append(
            f'<line x1="{LEFT}" x2="{LEFT + w}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
            f'class="grid"/><text x="{LEFT - 8}" y="{y(tick) + 4:.1f}" class="ytick">'
            f"{fmt_number(tick)}</text>"
        )
    seconds = t1 - t0 < 300
    for ts in _time_ticks(t0, t1):
        label = datetime.fromtimestamp(ts, tz=tz).strftime("%H:%M:%S" if seconds else "%H:%M")
        parts.append(f'<text x="{x(ts):.1f}" y="{HEIGHT - 10}" class="xtick">{label}</text>')
    if y_label:
        parts.append(
            f'<text transform="translate(16 {TOP + h / 2:.0f}) rotate(-90)" class="ylabel">'
            f"{escape(y_label)}</text>"
        )
    legend = []
    for i, (name, pts) in enumerate(series.items()):
        colour, dash = COLOURS[i % len(COLOURS)], DASHES[(i // len(COLOURS)) % len(DASHES)]
        style = f' stroke-dasharray="{dash}"' if dash else ""
        ordered = sorted(pts, key=lambda p: p[0])
        gap_s = _gap_s(ordered, step_s)
        runs: list[list[str]] = [[]]
        previous: datetime | None = None
        for t, v in ordered:
            if v is None or (previous is not None and (t - previous).total_seconds() > gap_s):
                runs.append([])  # missing data is a gap, never a straight line across it
            if v is not None:
                runs[-1].append(f"{x(t.timestamp()):.1f},{y(v):.1f}")
            previous = t
        for run in runs:
            if len(run) == 1:  # a lone sample between gaps: a dot, not nothing
                cx, cy = run[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{colour}" class="dot"/>')
            elif run:
                parts.append(
                    f'<polyline points="{" ".join(run)}" stroke="{colour}"{style} class="line"/>'
                )
        legend.append(
            f'<span class="key"><svg width="22" height="8"><line x1="0" x2="22" y1="4" y2="4" '
            f'stroke="{colour}" stroke-width="2.5"{style}/></svg>{escape(name)}</span>'
        )
    notes = _markers(parts, markers, t0=t0, t1=t1, to_x=x, height=h, tz=tz)
    figure = [f'<figure class="chart">{"".join(parts)}</svg>']
    figure.append(f'<figcaption><div class="legend">{"".join(legend)}</div>{notes}</figcaption>')
    return "".join(figure) + "</figure>"


def _markers(
    parts: list[str],
    markers: Sequence[tuple[datetime, str]],
    *,
    t0: float,
    t1: float,
    to_x: Callable[[float], float],
    height: float,
    tz: tzinfo | None,
) -> str:
    """Draw numbered marker lines into ``parts``; return their list as HTML."""
    inside = sorted((m for m in markers if t0 <= m[0].timestamp() <= t1), key=lambda m: m[0])
    outside = len(markers) - len(inside)
    groups: list[tuple[float, list[tuple[datetime, str]]]] = []
    for at, label in inside:
        px = to_x(at.timestamp())
        if groups and px - groups[-1][0] < MARKER_MERGE_PX:
            groups[-1][1].append((at, label))
        else:
            groups.append((px, [(at, label)]))
    items = []
    for n, (px, group) in enumerate(groups, start=1):
        parts.append(
            f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{TOP}" y2="{TOP + height}" class="marker"/>'
            f'<circle cx="{px:.1f}" cy="{TOP - 7}" r="7" class="badge"/>'
            f'<text x="{px:.1f}" y="{TOP - 3.5}" class="badge-n">{n}</text>'
        )
        labels = "; ".join(
            f"{at.astimezone(tz).strftime('%H:%M:%S')} {escape(label)}" for at, label in group
        )
        items.append(f"<li value='{n}'>{labels}</li>")
    html = f"<ol class='markers'>{''.join(items)}</ol>" if items else ""
    if outside:
        html += f"<p class='note'>{outside} marker(s) outside the data's time range, not drawn</p>"
    return html
