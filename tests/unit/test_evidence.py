"""models.evidence: the likelihood, streaks and refractory periods the health detector and
the stream scorer both say their alarms with."""

from __future__ import annotations

import math
import random

from models.evidence import RollingMoments, likelihood, rank, refractory, streak
from models.univariate import StreamScorer, StreamScorerConfig


def test_likelihood_is_the_gaussian_lower_probability_and_rank_keeps_its_order() -> None:
    assert likelihood(0.0) == 0.5
    assert math.isclose(likelihood(1.959964), 0.975, abs_tol=1e-6)
    assert math.isclose(likelihood(-1.959964), 0.025, abs_tol=1e-6)
    zs = [-50.0, -3.0, -0.5, 0.0, 0.5, 3.0, 9.0, 40.0, 400.0]
    assert [likelihood(z) for z in zs] == sorted(likelihood(z) for z in zs)
    assert [rank(z) for z in zs] == sorted(rank(z) for z in zs)
    # far up the tail the likelihood is 1.0 in floating point; the rank still tells apart
    assert likelihood(40.0) == likelihood(400.0) == 1.0
    assert rank(40.0) < rank(400.0) < 1.0
    assert rank(0.0) == 0.5


def test_refractory_runs_for_its_period_from_the_last_alarm_and_never_before_one() -> None:
    assert not refractory(-math.inf, 0.0, 300)
    assert refractory(100, 100, 300)
    assert refractory(100, 399, 300)
    assert not refractory(100, 400, 300)


def test_a_streak_starts_at_its_first_reading_over_and_ends_at_the_first_not_over() -> None:
    since: dict[str, float] = {}
    assert streak(since, ["thermal"], 10.0) == {"thermal": 0.0}
    assert streak(since, ["tpot", "thermal"], 14.0) == {"tpot": 0.0, "thermal": 4.0}
    assert list(streak(since, ["tpot", "thermal"], 15.0)) == ["tpot", "thermal"]  # its order
    assert streak(since, ["tpot"], 16.0) == {"tpot": 2.0}
    assert since == {"tpot": 14.0}  # thermal fell under: its streak is gone, not paused
    assert streak(since, ["thermal", "tpot"], 17.0) == {"thermal": 0.0, "tpot": 3.0}
    assert streak(since, [], 18.0) == {} and since == {}


def test_rolling_moments_hold_the_window_they_were_given() -> None:
    rng = random.Random(7)
    values = [rng.gauss(3.0, 2.0) for _ in range(500)]
    moments = RollingMoments(100)
    for v in values:
        moments.add(v)
    window = values[-100:]
    mean = sum(window) / 100
    assert len(moments) == 100
    assert math.isclose(moments.mean(), mean, rel_tol=1e-9)
    spread = math.sqrt(sum((v - mean) ** 2 for v in window) / 100)
    assert math.isclose(moments.spread(), spread, rel_tol=1e-6)


def test_the_scorer_halves_its_output_for_its_refractory_values_after_one_alarm() -> None:
    """One anomaly is one detection: once the likelihood passes the alarm, the scores are
    halved for ``refractory`` values counted from the one that alarmed (its own score was
    given before it was learned)."""
    config = StreamScorerConfig(refractory=40)
    scorer, twin = StreamScorer(config), StreamScorer(StreamScorerConfig(refractory=0))
    rng = random.Random(3)
    series = [10.0 + rng.gauss(0.0, 0.1) for _ in range(600)] + [30.0] * 5
    series += [10.0 + rng.gauss(0.0, 0.1) for _ in range(100)]
    halved = []
    for value in series:
        a, b = scorer.score_one(value), twin.score_one(value)
        halved.append(math.isclose(a, 0.5 * b, rel_tol=1e-12) and b > 0)
        scorer.learn_one(value)
        twin.learn_one(value)
    assert scorer.alarmed_at > 600  # the jump alarmed
    # (a new extreme of the noise in its first values may alarm too: count from the jump)
    first = halved.index(True, 600)
    assert first == scorer.alarmed_at  # the value after the alarm's (counted from 1)
    assert halved[first : first + 39] == [True] * 39
    assert not any(halved[first + 39 :])
