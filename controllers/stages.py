"""Stages between what a controller wants and what it applies, composed in order.

Each stage takes the value the previous one passed on, the value applied now
and the time, and returns the value it lets through and, when it changed it, a
reason. :class:`Stages` runs them in order (deadband -> stabilise -> rate
limit -> clamp, say) and reports the last stage that had a say.

- :class:`Tolerance`: ignore a change smaller than ``ratio`` of the current
  value (at least ``floor``): measurement noise does not move the output
  (HPA's tolerance); with ``up_only``, increases wait for ``ratio`` and cuts
  only for ``floor`` (a cut that protects the baseline is never held back
  for long: it grows past the floor, or the breach rule takes it).
- :class:`Stabiliser`: a move in the ``cautious`` direction must have been
  recommended for the whole window: increases apply the lowest recommendation
  of the last ``window_s`` (HPA's scale-down stabilisation, turned to where
  the risk lies); moves the other way pass at once.
- :class:`RateLimit`: at most ``up_per_s`` / ``down_per_s`` of change per
  second of elapsed time.
- :class:`Clamp`: stay within ``[lo, hi]``.

Example::

    stages = Stages([Tolerance(0.05), Stabiliser(60.0), RateLimit(0.01, 1.0), Clamp(0, 1)])
    applied, reason = stages.step(desired=0.4, current=0.3, now=period_end)
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Protocol


class StageReason(StrEnum):
    WITHIN_TOLERANCE = "within_tolerance"
    STABILISING = "stabilising"
    RATE_LIMITED = "rate_limited"
    CLAMPED = "clamped"


class Stage(Protocol):
    def __call__(
        self, value: float, *, current: float, now: datetime
    ) -> tuple[float, StageReason | None]: ...


class Tolerance:
    def __init__(self, ratio: float, *, floor: float = 0.0, up_only: bool = False) -> None:
        if not (ratio >= 0 and floor >= 0):
            raise ValueError("tolerance ratio and floor are >= 0")
        self.ratio, self.floor, self.up_only = ratio, floor, up_only

    def __call__(
        self, value: float, *, current: float, now: datetime
    ) -> tuple[float, StageReason | None]:
        if self.up_only and value < current:
            # a cut passes unless it is below the floor (noise, too small to act on)
            if current - value <= self.floor and value > 0:
                return current, StageReason.WITHIN_TOLERANCE
            return value, None
        if value != current and abs(value - current) <= max(self.ratio * abs(current), self.floor):
            return current, StageReason.WITHIN_TOLERANCE
        return value, None


class Stabiliser:
    def __init__(self, window_s: float, *, cautious: str = "up") -> None:
        if window_s < 0 or cautious not in ("up", "down"):
            raise ValueError("window_s >= 0; cautious is 'up' or 'down'")
        self.window_s, self.up = window_s, cautious == "up"
        self.recent: deque[tuple[datetime, float]] = deque()

    def forget(self) -> None:
        """Start the window again (the conditions it was holding out against are gone)."""
        self.recent.clear()

    def note(self, value: float, *, now: datetime) -> None:
        """Remember ``value`` as if a step had wanted it at ``now`` (a cut made between
        steps: a rise past it waits out the window, as after one a step makes)."""
        self.recent.append((now, value))

    def __call__(
        self, value: float, *, current: float, now: datetime
    ) -> tuple[float, StageReason | None]:
        self.recent.append((now, value))
        while self.recent and self.recent[0][0] < now - timedelta(seconds=self.window_s):
            self.recent.popleft()
        values = [v for _, v in self.recent]
        if self.up and value > current:
            allowed = max(current, min(values))
        elif not self.up and value < current:
            allowed = min(current, max(values))
        else:
            return value, None
        return allowed, (StageReason.STABILISING if allowed != value else None)


class RateLimit:
    def __init__(self, up_per_s: float, down_per_s: float) -> None:
        if not (up_per_s > 0 and down_per_s > 0):
            raise ValueError("rate limits are positive (math.inf for none)")
        self.up_per_s, self.down_per_s = up_per_s, down_per_s
        self.last_at: datetime | None = None

    def __call__(
        self, value: float, *, current: float, now: datetime
    ) -> tuple[float, StageReason | None]:
        # the first step has no elapsed time to allow a change for: only unlimited moves pass
        dt = 0.0 if self.last_at is None else max(0.0, (now - self.last_at).total_seconds())
        self.last_at = now
        hi = current + self.up_per_s * dt if math.isfinite(self.up_per_s) else math.inf
        lo = current - self.down_per_s * dt if math.isfinite(self.down_per_s) else -math.inf
        limited = min(max(value, lo), hi)
        return limited, (StageReason.RATE_LIMITED if limited != value else None)


class Clamp:
    def __init__(self, lo: float, hi: float) -> None:
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise ValueError(f"clamp needs finite lo <= hi, not {lo!r}, {hi!r}")
        self.lo, self.hi = lo, hi

    def __call__(
        self, value: float, *, current: float, now: datetime
    ) -> tuple[float, StageReason | None]:
        clamped = min(max(value, self.lo), self.hi)
        return clamped, (StageReason.CLAMPED if clamped != value else None)


class Stages:
    """The stages in order; :meth:`step` reports the last one that changed the value."""

    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = list(stages)

    def step(
        self, *, desired: float, current: float, now: datetime
    ) -> tuple[float, StageReason | None]:
        value, why = desired, None
        for stage in self.stages:
            value, reason = stage(value, current=current, now=now)
            why = reason or why
        return value, why
