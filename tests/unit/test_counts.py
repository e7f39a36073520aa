"""The Poisson CUSUM behind the correctable-ECC signal: quiet devices stay quiet, a storm
is caught early, the baseline is the device's own, and bad settings are refused."""

from __future__ import annotations

import random

import pytest

from models.counts import RateRise, RiseState

QUIET_PER_S = 1.0 / 3600.0  # the prior's own rate


def _run(rise: RateRise, rate_per_s: float, seconds: float, seed: int) -> tuple[int, RiseState]:
    """Alarms (each restarts the statistic) of a device counting at ``rate_per_s``."""
    rng, state, t, alarms = random.Random(seed), RiseState(), 0.0, 0
    while (t := t + (gap := rng.expovariate(rate_per_s))) < seconds:
        state = rise.update(state, 1, gap)
        if state.statistic >= rise.threshold:
            alarms += 1
            state = RiseState(0.0, state.quiet_events, state.quiet_s)
    return alarms, state


def test_devices_at_their_quiet_rate_do_not_alarm_in_thousands_of_device_days() -> None:
    rise = RateRise()
    alarms = sum(_run(rise, QUIET_PER_S, 86400.0, seed)[0] for seed in range(2000))
    assert alarms == 0  # Wald: about one in e^16 events; these are ~48,000


def test_a_storm_at_a_hundred_times_the_quiet_rate_is_caught_in_minutes() -> None:
    rise, rng = RateRise(), random.Random(3)
    taken = []
    for _ in range(200):
        state = rise.update(RiseState(), 0, 3600.0)  # an hour of quiet behind it
        for second in range(1, 3600):
            state = rise.update(state, int(rng.random() < 100 * QUIET_PER_S), 1.0)
            if state.statistic >= rise.threshold:
                taken.append(second)
                break
    assert len(taken) == 200
    # ln(100) per error, so four errors (about 144 s of such a storm) in a short run
    assert sorted(taken)[100] < 300


def test_a_device_that_always_logged_more_learns_its_own_rate() -> None:
    rise = RateRise()
    alarms, state = _run(rise, 5 * QUIET_PER_S, 86400.0, seed=1)
    assert alarms == 0
    assert state.quiet_s > 0.9 * 86400.0  # the day was learned as quiet
    learned = rise.base_per_s(state.quiet_events, state.quiet_s)
    assert 3 * QUIET_PER_S < learned < 8 * QUIET_PER_S


def test_the_statistic_is_capped_so_a_storms_end_drains_in_bounded_time() -> None:
    rise = RateRise()
    state = rise.update(RiseState(), 10_000, 60.0)
    assert state.statistic == rise.cap_ratio * rise.threshold
    assert state.quiet_events == 0  # a storm never teaches the baseline
    base = rise.base_per_s(0.0, 0.0)
    drain_s = (state.statistic - rise.threshold) / ((rise.ratio - 1) * base)
    assert drain_s < 2 * 3600
    assert rise.step(state.statistic, 0, drain_s + 1.0, base) < rise.threshold


@pytest.mark.parametrize(
    ("settings", "message"),
    [({"ratio": 1.0}, "ratio must be > 1"), ({"threshold": 0.0}, "must be > 0")],
)
def test_settings_that_test_nothing_are_refused(settings: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RateRise(**settings)
