"""Event time that keeps moving when events stop.

Controllers run on the events' clock (a replay or a simulator faster than real
time decides as it would have live), but when events stop arriving, time must
still pass, or fail-static guards could never notice the silence.
:class:`EventClock` is the newest event time seen plus the wall time elapsed
since it was seen. Pure: the caller passes both clocks.

Example::

    clock = EventClock()
    clock.observe(verdict.observed_at, time.monotonic())
    now = clock.now(time.monotonic())
"""

from __future__ import annotations

from datetime import datetime, timedelta


class EventClock:
    def __init__(self) -> None:
        self._event: datetime | None = None
        self._wall_s = 0.0

    @property
    def started(self) -> bool:
        return self._event is not None

    def observe(self, event_at: datetime, wall_s: float) -> None:
        """An event observed at ``event_at`` arrived at monotonic ``wall_s``."""
        if self._event is None or event_at > self.now(wall_s):
            self._event, self._wall_s = event_at, wall_s

    def now(self, wall_s: float) -> datetime:
        if self._event is None:
            raise RuntimeError("the event clock has seen no event yet")
        return self._event + timedelta(seconds=max(0.0, wall_s - self._wall_s))
