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


def test_a_burst_puts_it_ahead_for_a_moment_not_for_good() -> None:
    # a restarted detector catches up: verdicts ten times faster than the wall clock for 20
    # s, then live (one a second). The rate is still high when the burst ends, so the clock
    # runs ahead for a moment; it then stands still until the events pass it again. (It used
    # to extrapolate from the last time it told, and stayed about 20 s ahead for good: a
    # ladder on it ended probations early.)
    clock = EventClock()
    event, wall = 0.0, 0.0
    told = []
    for _ in range(200):
        clock.observe(START + timedelta(seconds=event), wall)
        event, wall = event + 1.0, wall + 0.1
        told.append(clock.now(wall))
    leads = []
    for _ in range(60):
        clock.observe(START + timedelta(seconds=event), wall)
        newest = START + timedelta(seconds=event)
        event, wall = event + 1.0, wall + 1.0
        told.append(clock.now(wall - 0.5))  # half-way to the next event
        leads.append((told[-1] - newest).total_seconds())
    assert told == sorted(told)  # never backwards
    assert max(leads) > 2.0  # ahead for a moment after the burst
    assert max(leads[20:]) < 0.6  # then as live: about half a second past the newest
