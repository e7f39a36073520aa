"""Event time that keeps moving when events stop, for a while.

Controllers run on the events' clock (a replay or a simulator faster than real
time decides as it would have live), but between events time must still pass,
or dwell times and probations would only end when the next event happens to
arrive, and fail-static guards could never notice a silence.
:class:`EventClock` extrapolates from the newest event time seen, at the rate
event time has been advancing against the wall clock (1 for a live fleet; the
speed-up for a simulator or a replay), estimated from the events themselves,
for at most ``max_ahead_s`` of event time: when nothing arrives at all, the
pipeline cannot tell a silent fleet from a silent feed, so time stops there and
the controllers hold (a replay that has ended does not go on deciding).
Pure: the caller passes both clocks.

Example::

    clock = EventClock()
    clock.observe(verdict.observed_at, time.monotonic())
    now = clock.now(time.monotonic())
"""

from __future__ import annotations

from datetime import datetime, timedelta


class EventClock:
    def __init__(
        self, *, min_gap_s: float = 0.5, alpha: float = 0.3, max_ahead_s: float = 60.0
    ) -> None:
        self._newest: datetime | None = None  # the newest event time seen
        self._newest_wall_s = 0.0  # when it arrived
        self._floor: datetime | None = None  # the latest time told: never told less again
        self._anchor: tuple[datetime, float] | None = None  # last point the rate was taken at
        self.rate = 1.0
        self.min_gap_s = min_gap_s
        self.alpha = alpha
        self.max_ahead_s = max_ahead_s

    @property
    def started(self) -> bool:
        return self._newest is not None

    def observe(self, event_at: datetime, wall_s: float) -> None:
        """An event observed at ``event_at`` arrived at monotonic ``wall_s``."""
        if self._anchor is None:
            self._anchor = (event_at, wall_s)
        else:
            gap = wall_s - self._anchor[1]
            if gap >= self.min_gap_s:
                sample = (event_at - self._anchor[0]).total_seconds() / gap
                sample = min(max(sample, 0.1), 1000.0)
                self.rate += self.alpha * (sample - self.rate)
                self._anchor = (event_at, wall_s)
        if self._newest is None or event_at > self._newest:
            self._newest, self._newest_wall_s = event_at, wall_s

    def now(self, wall_s: float) -> datetime:
        """The newest event time, moved on at the rate for the wall time since it arrived
        (at most ``max_ahead_s``), and never less than a time already told. Extrapolated
        from the newest event itself, not from the last time told: a rate still high from
        a burst (a restarted detector catching up) puts the clock ahead for a moment, and
        it then stands still while the events catch up, rather than staying ahead of them
        for good (a ladder whose clock ran ahead of the verdicts would end probations
        early)."""
        if self._newest is None:
            raise RuntimeError("the event clock has seen no event yet")
        ahead = min(self.max_ahead_s, max(0.0, wall_s - self._newest_wall_s) * self.rate)
        told = self._newest + timedelta(seconds=ahead)
        if self._floor is not None and told < self._floor:
            return self._floor
        self._floor = told
        return told


def instant(text: str) -> datetime:
    """An instant a memory wrote (``datetime.isoformat``), read back. Raises ``ValueError``
    on text that is not an instant with its zone (a naive time cannot be compared with
    event time)."""
    when = datetime.fromisoformat(text)
    if when.tzinfo is None:
        raise ValueError(f"an instant without its zone: {text!r}")
    return when


def maybe_instant(text: str | None) -> datetime | None:
    """:func:`instant`, None staying None."""
    return None if text is None else instant(text)
