"""The Numenta Anomaly Benchmark's scoring, written from its published rules.

For one file (rows in time order, each with an anomaly score, and labelled
anomaly windows):

- the first ``min(floor(0.15 n), 750)`` rows are probation: neither detections
  nor windows there count;
- a detection inside a window is worth ``tp * S(p) / S(-1)`` where ``p`` is its
  position ``-(right - i + 1) / width`` (about -1 at the window's left edge,
  0 past its right edge) and ``S(p) = 2 sigmoid(-5 p) - 1``; only the best
  (earliest) detection of a window counts; a window with none costs ``-fn``;
- a detection outside every window costs ``fp * S(q)`` with ``q`` its distance
  past the previous window's right edge over that window's width less one
  (``S`` is -1 from ``q >= 3``, and with no previous window);
- a row is a detection when its score is at least the threshold. One threshold
  serves the whole corpus: the one that maximises the summed raw score
  (searched exactly here, over every distinct score);
- the corpus score is ``100 (S - S_null) / (S_perfect - S_null)``, where the
  null detector finds nothing (``-fn`` per window) and the perfect one finds
  every window at its left edge (``tp`` per window).

Example::

    files = [sweep(name, timestamps, scores, windows, STANDARD) for ...]
    threshold, raw = best_threshold(files)
    print(normalised(raw, files, STANDARD))
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class CostProfile:
    tp: float
    fp: float
    fn: float


STANDARD = CostProfile(tp=1.0, fp=0.11, fn=1.0)
PROBATION_RATIO = 0.15


def scaled_sigmoid(position: float) -> float:
    """1 just inside a window's left edge, 0 at its right edge, -1 well past it."""
    if position >= 3.0:
        return -1.0
    return 2.0 / (1.0 + math.exp(5.0 * position)) - 1.0


def probation_rows(rows: int) -> float:
    return min(math.floor(PROBATION_RATIO * rows), PROBATION_RATIO * 5000)


@dataclass(frozen=True, slots=True)
class SweptFile:
    """One file's scorable rows: anomaly score, what a detection there is worth, window."""

    name: str
    scores: tuple[float, ...]
    worth: tuple[float, ...]
    window: tuple[int, ...]  # window index, or -1 outside every window
    windows: int  # windows with at least one scorable row


def sweep(
    name: str,
    timestamps: Sequence[datetime],
    scores: Sequence[float],
    windows: Sequence[tuple[datetime, datetime]],
    profile: CostProfile,
) -> SweptFile:
    """What a detection at each row would be worth under ``profile``: inside a window,
    the scaled sigmoid of its position; outside, the false-positive weight."""
    if len(timestamps) != len(scores):
        raise ValueError(f"{name}: {len(timestamps)} timestamps but {len(scores)} scores")
    spans = []
    for start, end in windows:
        a = bisect.bisect_left(timestamps, start)
        b = bisect.bisect_right(timestamps, end) - 1
        if a <= b:
            spans.append((a, b))
    spans.sort()
    max_tp = scaled_sigmoid(-1.0)
    first = probation_rows(len(timestamps))
    out_scores, worth, window = [], [], []
    span_i, previous = 0, None  # previous: (right index, width) of the last window passed
    for i, score in enumerate(scores):
        while span_i < len(spans) and spans[span_i][1] < i:
            a, b = spans[span_i]
            previous = (b, b - a + 1)
            span_i += 1
        inside = span_i < len(spans) and spans[span_i][0] <= i
        if inside:
            a, b = spans[span_i]
            value = scaled_sigmoid(-(b - i + 1) / (b - a + 1)) * profile.tp / max_tp
        elif previous is None:
            value = -profile.fp
        else:
            right, width = previous
            q = abs(right - i) / (width - 1) if width > 1 else 3.0
            value = scaled_sigmoid(q) * profile.fp
        if i < first:
            continue
        out_scores.append(float(score))
        worth.append(value)
        window.append(span_i if inside else -1)
    return SweptFile(
        name, tuple(out_scores), tuple(worth), tuple(window), len({w for w in window if w >= 0})
    )


def file_score(swept: SweptFile, threshold: float, profile: CostProfile) -> float:
    """Raw score of one file at ``threshold``."""
    best: dict[int, float] = {}
    fp = 0.0
    for score, value, w in zip(swept.scores, swept.worth, swept.window, strict=True):
        if score < threshold:
            continue
        if w < 0:
            fp += value
        else:
            best[w] = max(best.get(w, -math.inf), value)
    missed = swept.windows - len(best)
    return fp + sum(best.values()) - missed * profile.fn


def best_threshold(files: Sequence[SweptFile], profile: CostProfile) -> tuple[float, float]:
    """The one threshold that maximises the corpus's summed raw score, and that score.

    Exact: lowers the threshold through every distinct score, updating the sum.
    """
    points = sorted(
        (
            (score, fi, value, w)
            for fi, f in enumerate(files)
            for score, value, w in zip(f.scores, f.worth, f.window, strict=True)
        ),
        key=lambda p: -p[0],
    )
    total = -profile.fn * sum(f.windows for f in files)
    best_total, best_t = total, math.inf
    found: dict[tuple[int, int], float] = {}
    for i, (score, fi, value, w) in enumerate(points):
        if w < 0:
            total += value
        else:
            key = (fi, w)
            old = found.get(key)
            if old is None:
                total += profile.fn + value
                found[key] = value
            elif value > old:
                total += value - old
                found[key] = value
        if (i + 1 == len(points) or points[i + 1][0] != score) and total > best_total:
            best_total, best_t = total, score
    return best_t, best_total


def normalised(raw: float, files: Sequence[SweptFile], profile: CostProfile) -> float:
    """100 for the perfect detector, 0 for the null detector."""
    windows = sum(f.windows for f in files)
    null, perfect = -profile.fn * windows, profile.tp * windows
    return 100.0 * (raw - null) / (perfect - null) if perfect > null else 0.0
