"""A rise in the rate of rare events (correctable ECC errors, XIDs): a Poisson CUSUM.

A device's counter grows by ``events`` over ``elapsed_s``. Under its quiet rate
``base`` the count is Poisson(``base * elapsed_s``); under a storm it is
Poisson(``ratio * base * elapsed_s``). Page's CUSUM adds each interval's
log-likelihood ratio of the two and floors the sum at zero::

    S <- max(0, S + events * ln(ratio) - (ratio - 1) * base * elapsed_s)

so every event raises S by ``ln(ratio)`` and quiet time drains it at
``(ratio - 1) * base`` per second. S over ``threshold`` is a rise. It is the
quickest test of its false-alarm rate for that change (Lorden, Moustakides), it
needs no window, and it reads counters the way they arrive: irregularly,
several events per sample, with gaps where samples were dropped.

By Wald's bound a healthy device reaches ``threshold`` about once in
``exp(threshold)`` events; ``bench.ecc_cusum`` measures the false alarms per
1,000 device-days and the storms caught before their double-bit fault.

The quiet rate is a Gamma posterior: a prior of ``prior_events`` in
``prior_s`` (weak: an hour's worth), plus what the device itself counted while
its statistic was low. A device that always logs a few errors an hour learns
that; the events of a rise are not learned as its baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True, slots=True)
class RateRise:
    """The rise a CUSUM looks for, and when it says so."""

    ratio: float = 100.0  # the storm: this many times the quiet rate
    threshold: float = 16.0  # Wald: one healthy alarm in about e^16 (9 million) events
    prior_events: float = 1.0  # the quiet rate before a device has shown its own:
    prior_s: float = 3600.0  # one event an hour, held as lightly as an hour of watching
    cap_ratio: float = 2.0  # S stops at this many thresholds: a storm's end drains in time

    def __post_init__(self) -> None:
        if self.ratio <= 1.0:
            raise ValueError(f"ratio must be > 1 (a rise), got {self.ratio}")
        if self.threshold <= 0.0 or self.prior_events <= 0.0 or self.prior_s <= 0.0:
            raise ValueError("threshold, prior_events and prior_s must be > 0")

    def base_per_s(self, quiet_events: float, quiet_s: float) -> float:
        """The quiet rate: the prior and the device's own quiet record together."""
        return (self.prior_events + quiet_events) / (self.prior_s + quiet_s)

    def step(self, statistic: float, events: int, elapsed_s: float, base_per_s: float) -> float:
        """The statistic after ``events`` more in ``elapsed_s`` at quiet rate ``base_per_s``."""
        gain = events * math.log(self.ratio) - (self.ratio - 1.0) * base_per_s * elapsed_s
        return min(max(0.0, statistic + gain), self.cap_ratio * self.threshold)

    def update(self, state: RiseState, events: int, elapsed_s: float) -> RiseState:
        """``state`` after ``events`` more in ``elapsed_s``: the statistic steps against the
        quiet rate so far, and the interval is learned as quiet while the statistic stays
        under half the threshold (the run-up to a rise never teaches the baseline)."""
        statistic, quiet_events, quiet_s = state
        base = self.base_per_s(quiet_events, quiet_s)
        statistic = self.step(statistic, events, elapsed_s, base)
        if statistic < 0.5 * self.threshold:
            quiet_events, quiet_s = quiet_events + events, quiet_s + elapsed_s
        return RiseState(statistic, quiet_events, quiet_s)


class RiseState(NamedTuple):
    """What a CUSUM keeps per counter: three numbers."""

    statistic: float = 0.0
    quiet_events: float = 0.0
    quiet_s: float = 0.0
