"""Peer cohorts: a robust location and spread over the last samples that are recent enough."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from models.cohort import IQR_TO_SIGMA, Cohorts


def test_the_reference_is_the_median_and_iqr_of_the_last_window_samples() -> None:
    peers = Cohorts(window=64, min_samples=16, sigma_floor=0.0)
    noise = random.Random(3)
    values = [noise.gauss(0.0, 1.0) for _ in range(500)]
    for n, value in enumerate(values):
        peers.learn("k", value, f"dev{n % 5}", at_s=float(n))
    last = values[-64:]
    quartile_1, median, quartile_3 = statistics.quantiles(last, n=4, method="inclusive")
    score = peers.score("k", 1.0, "dev0", at_s=500.0)
    assert score is not None
    assert score.deviation == pytest.approx(1.0 - median, abs=1e-12)
    assert score.sigma == pytest.approx((quartile_3 - quartile_1) / IQR_TO_SIGMA, abs=1e-12)
    assert (score.samples, score.peers) == (64, 4)


def test_samples_older_than_max_age_are_peers_no_longer() -> None:
    peers = Cohorts(window=256, min_samples=20, sigma_floor=0.01, max_age_s=60.0)
    for second in range(30):  # a band four devices ran in, then left
        for device in range(4):
            peers.learn("band", 0.0, device, at_s=float(second))
    assert peers.score("band", 0.14, 9, at_s=40.0) is not None
    # 100 s later the band's samples are over a minute old: nothing to judge against
    assert peers.score("band", 0.14, 9, at_s=130.0) is None
    # the devices that come back build its reference afresh, from what is normal now
    for second in range(130, 136):
        for device in range(4):
            peers.learn("band", 0.14, device, at_s=float(second))
    score = peers.score("band", 0.14, 9, at_s=136.0)
    assert score is not None and score.samples == 24 and score.deviation == pytest.approx(0.0)


def test_without_an_age_limit_an_old_reference_reads_a_fleet_shift_as_the_device() -> None:
    peers = Cohorts(window=256, min_samples=20, sigma_floor=0.01)
    for second in range(30):
        for device in range(4):
            peers.learn("band", 0.0, device, at_s=float(second))
    score = peers.score("band", 0.14, 9, at_s=1000.0)
    assert score is not None and score.deviation == pytest.approx(0.14)


def test_a_member_whose_samples_all_aged_out_is_not_counted_as_a_peer() -> None:
    peers = Cohorts(window=256, min_samples=1, min_peers=4, sigma_floor=0.01, max_age_s=10.0)
    for device, at_s in (("a", 0.0), ("b", 5.0), ("c", 12.0), ("d", 13.0), ("e", 14.0)):
        peers.learn("k", 0.0, device, at_s=at_s)
    score = peers.score("k", 0.0, "x", at_s=14.0)  # "a" is gone: b, c, d and e
    assert score is not None and (score.peers, score.samples) == (4, 4)
    assert peers.score("k", 0.0, "x", at_s=16.0) is None  # "b" is gone too: three
    peers.learn("k", 0.0, "f", at_s=16.0)
    score = peers.score("k", 0.0, "x", at_s=16.0)
    assert score is not None and score.peers == 4


@pytest.mark.parametrize(
    ("window", "min_samples", "max_age_s"), [(0, 0, 60.0), (10, 20, 60.0), (10, 5, 0.0)]
)
def test_settings_that_could_never_score_are_refused(
    window: int, min_samples: int, max_age_s: float
) -> None:
    with pytest.raises(ValueError):
        Cohorts(window=window, min_samples=min_samples, sigma_floor=0.01, max_age_s=max_age_s)


def test_values_that_are_not_finite_are_neither_scored_nor_learned() -> None:
    peers = Cohorts(window=8, min_samples=1, min_peers=0, sigma_floor=0.01)
    peers.learn("k", math.nan, "a", at_s=0.0)
    assert len(peers) == 0 and peers.score("k", math.inf, "a", at_s=0.0) is None
