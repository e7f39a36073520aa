"""Local load shedding: what a router or executor does in milliseconds, before any controller.

**Value-aware shedding** (:class:`LoadShedder`). Work comes in classes; the
lowest value goes first: optional, then batch, then background, and
baseline (interactive) never. Each class is degraded before it is dropped
(an optional request loses its extras, a batch one its priority). The
signal is the queue's delay, ``queue_depth / service_rate`` in seconds, read
on every admission. Each class has a degrade and a drop threshold; a class
recovers only once the delay is ``recover_ratio`` below its threshold
(hysteresis), so a queue on the edge does not flap.

**Retry budget** (:class:`RetryBudget`): retries at most ``ratio`` of recent
requests (a token bucket filled by requests, holding at most ``burst``), so a
struggling route is not buried under its own retries. Counts may be
fractional (a fluid model's requests per step).

**Circuit breaker** (:class:`CircuitBreaker`): per route; opens when the
error ratio over the last ``window`` calls passes ``failure_ratio`` (with at
least ``min_calls``), stays open ``open_s``, then lets ``probes`` calls
through half-open; all good closes it, one failure reopens it.

Time is an argument everywhere. Example::

    shed = LoadShedder(ShedConfig())
    shed.admit(WorkClass.OPTIONAL, queue_delay_s=0.4)   # -> Admission.DEGRADE
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from enum import IntEnum, StrEnum


class WorkClass(IntEnum):
    """Lower value first; the integer is the shedding order."""

    OPTIONAL = 0
    BATCH = 1
    BACKGROUND = 2
    BASELINE = 3


class Admission(StrEnum):
    ADMIT = "admit"
    DEGRADE = "degrade"
    DROP = "drop"


@dataclass(frozen=True, slots=True)
class ShedConfig:
    """Queue delay (seconds) at which each class is degraded and dropped."""

    thresholds_s: dict[WorkClass, tuple[float, float]] = field(
        default_factory=lambda: {
            WorkClass.OPTIONAL: (0.2, 0.5),
            WorkClass.BATCH: (0.5, 1.0),
            WorkClass.BACKGROUND: (1.0, 2.0),
        }
    )
    recover_ratio: float = 0.8

    def __post_init__(self) -> None:
        if WorkClass.BASELINE in self.thresholds_s:
            raise ValueError("baseline work is never shed locally")
        previous = (0.0, 0.0)
        for cls in sorted(self.thresholds_s):
            degrade, drop = self.thresholds_s[cls]
            if not 0 < degrade <= drop or degrade < previous[0] or drop < previous[1]:
                raise ValueError(f"{cls.name}: 0 < degrade <= drop, and no lower than a "
                                 "lower-value class's")  # fmt: skip
            previous = (degrade, drop)
        if not 0 < self.recover_ratio <= 1:
            raise ValueError("recover_ratio in (0, 1]")


class LoadShedder:
    """Admission per work class from its queue delay: degrade, then drop, in value order."""

    def __init__(self, config: ShedConfig) -> None:
        self.config = config
        self.state = {cls: Admission.ADMIT for cls in config.thresholds_s}

    def admit(self, cls: WorkClass, *, queue_delay_s: float) -> Admission:
        limits = self.config.thresholds_s.get(cls)
        if limits is None:
            return Admission.ADMIT
        if queue_delay_s != queue_delay_s:  # NaN: nothing known, shed as if at the drop line
            queue_delay_s = limits[1]
        degrade, drop = limits
        r = self.config.recover_ratio
        was = self.state[cls]
        if queue_delay_s >= drop or (was is Admission.DROP and queue_delay_s > drop * r):
            now = Admission.DROP
        elif queue_delay_s >= degrade or (
            was is not Admission.ADMIT and queue_delay_s > degrade * r
        ):
            now = Admission.DEGRADE
        else:
            now = Admission.ADMIT
        self.state[cls] = now
        return now


@dataclass(slots=True)
class RetryBudget:
    ratio: float = 0.1
    burst: float = 10.0
    tokens: float = 10.0

    def on_requests(self, requests: float = 1.0) -> None:
        self.tokens = min(self.burst, self.tokens + self.ratio * max(0.0, requests))

    def grant(self, wanted: float = 1.0) -> float:
        """How many of ``wanted`` retries may go (all, some, or none)."""
        granted = min(max(0.0, wanted), self.tokens)
        self.tokens -= granted
        return granted


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(slots=True)
class CircuitBreaker:
    failure_ratio: float = 0.5
    min_calls: int = 10
    window: int = 50
    open_s: float = 5.0
    probes: int = 3
    state: BreakerState = BreakerState.CLOSED
    opened_at: datetime | None = None
    outcomes: deque[bool] = field(default_factory=deque)
    probes_left: int = 0

    def allow(self, *, now: datetime) -> bool:
        if self.state is BreakerState.OPEN:
            assert self.opened_at is not None  # opening stamps it
            if (now - self.opened_at).total_seconds() < self.open_s:
                return False
            self.state, self.probes_left = BreakerState.HALF_OPEN, self.probes
        if self.state is BreakerState.HALF_OPEN:
            if self.probes_left <= 0:
                return False
            self.probes_left -= 1
        return True

    def record(self, *, ok: bool, now: datetime) -> None:
        if self.state is BreakerState.HALF_OPEN:
            if not ok:
                self._open(now)
            elif self.probes_left <= 0:
                self.state = BreakerState.CLOSED
                self.outcomes.clear()
            return
        self.outcomes.append(ok)
        while len(self.outcomes) > self.window:
            self.outcomes.popleft()
        failures = sum(1 for o in self.outcomes if not o)
        calls = len(self.outcomes)
        if calls >= self.min_calls and failures / calls >= self.failure_ratio:
            self._open(now)

    def _open(self, now: datetime) -> None:
        self.state, self.opened_at = BreakerState.OPEN, now
        self.outcomes.clear()
