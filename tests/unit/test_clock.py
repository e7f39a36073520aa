"""The event clock: extrapolates at the rate event time advances, never runs backwards."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controllers.clock import EventClock
from tests.factories import START


def test_before_any_event_there_is_no_time() -> None:
    with pytest.raises(RuntimeError, match="no event"):
        EventClock().now(0.0)


def test_live_fleet_runs_at_wall_speed_between_events() -> None:
    clock = EventClock()
    for i in range(10):
        clock.observe(START + timedelta(seconds=i), float(i))
    assert clock.rate == pytest.approx(1.0)
    assert clock.now(12.0) == START + timedelta(seconds=12)


def test_a_fast_simulator_is_extrapolated_at_its_speed() -> None:
    clock = EventClock()
    for i in range(20):  # five simulated seconds per wall second
        clock.observe(START + timedelta(seconds=5 * i), float(i))
    assert clock.rate == pytest.approx(5.0, rel=0.01)
    ahead = (clock.now(21.0) - START).total_seconds()
    assert ahead == pytest.approx(5 * 19 + 10, abs=0.1)


def test_late_events_never_move_it_back() -> None:
    clock = EventClock()
    clock.observe(START + timedelta(seconds=10), 0.0)
    clock.observe(START, 0.1)  # an old event arriving late
    assert clock.now(0.1) >= START + timedelta(seconds=10)


def test_with_no_events_at_all_time_stops_after_a_while() -> None:
    # a feed that has stopped (or a replay that has ended) must not go on deciding
    clock = EventClock(max_ahead_s=60.0)
    for i in range(10):
        clock.observe(START + timedelta(seconds=i), float(i))
    assert clock.now(30.0) == START + timedelta(seconds=30)
    assert clock.now(10_000.0) == START + timedelta(seconds=9 + 60)
    clock.observe(START + timedelta(seconds=500), 10_001.0)  # the feed is back
    assert START + timedelta(seconds=500) <= clock.now(10_002.0) <= START + timedelta(seconds=501)
