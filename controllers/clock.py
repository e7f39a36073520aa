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
        self._event: datetime | None = None
        self._newest: datetime | None = None  # the newest event time seen
        self._wall_s = 0.0
        self._anchor: tuple[datetime, float] | None = None  # last point the rate was taken at
        self.rate = 1.0
        self.min_gap_s = min_gap_s
        self.alpha = alpha
        self.max_ahead_s = max_ahead_s

    @property
    def started(self) -> bool:
        return self._event is not None

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
        if self._event is None or event_at > self.now(wall_s):
            self._event, self._wall_s = event_at, wall_s
        if self._newest is None or event_at > self._newest:
            self._newest = event_at

    def now(self, wall_s: float) -> datetime:
        if self._event is None:
            raise RuntimeError("the event clock has seen no event yet")
        assert self._newest is not None
        ahead = max(0.0, wall_s - self._wall_s) * self.rate
        return min(
            self._event + timedelta(seconds=ahead),
            self._newest + timedelta(seconds=self.max_ahead_s),
        )
