"""What the health detector keeps: its settings, one device's record, and the small
pieces of arithmetic it shares (a weighted regression, signal bookkeeping).

Kept apart from :mod:`models.health` so the detector reads as the rules it applies.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import NamedTuple

from models.counts import RateRise
from schemas.base import AcceleratorType
from schemas.commands import MAX_CLOCK_SKEW_S
from schemas.verdicts import COUNTED_SIGNALS, HealthStatus, Signal


@dataclass(frozen=True, slots=True)
class HealthConfig:
    heartbeat_timeout_s: float = 5.0
    stall_wall_s: float = 30.0
    blind_ratio: float = 0.3
    verdict_interval_s: float = 30.0
    # an unchanged verdict is said again once per interval, in one of keepalive_slots slots of
    # it that the device's id fixes: a tenth of the fleet's keep-alives every 3 s, not all of
    # them in the second every device first reported (8,000 at once held a hard fault's
    # quarantine 1-3 s behind them, bench.latency_under_load); more slots spread them thinner
    keepalive_slots: int = 10
    sustain_s: float = 10.0
    # correctable ECC: a Poisson CUSUM for a storm of ecc_rise_ratio times the device's quiet
    # rate (models.counts.RateRise); its prior is ecc_prior_events in ecc_prior_s
    ecc_rise_ratio: float = 100.0
    ecc_threshold: float = 16.0
    ecc_prior_events: float = 1.0
    ecc_prior_s: float = 3600.0
    thermal_margin_celsius: float = 8.0
    thermal_tau_s: float = 45.0  # temperature follows power with about this time constant
    tpot_margin_ratio: float = 0.10
    tpot_stale_s: float = 30.0
    # a TPOT cohort's reference is its samples of the last tpot_peer_age_s (and at most its
    # window): peers now. A load band no device ran in for longer holds the TPOT of before a
    # rollout since, which would read as the first device back in it being slow. At 1-s
    # serving stats a band of four devices holds 240 samples in it, so a busy band is unchanged
    tpot_peer_age_s: float = 60.0
    # and its peers are the devices that taught it within tpot_peer_fresh_s, the time a
    # device is held over before it is dying (sustain_s): a device slow that long was slow
    # against peers seen meanwhile, not against a record of peers since capped, drained or
    # slow themselves (the reference of before a rollout, when the rollout's other devices
    # stopped teaching the cohort)
    tpot_peer_fresh_s: float = 10.0
    probe_margin_ratio: float = 0.10
    peer_z: float = 4.0
    fast_alpha: float = 0.3
    history_alpha: float = 0.002
    history_max_ratio: float = 0.05  # a device may run this much slower than peers by nature
    warmup_samples: int = 30
    # non-fatal XIDs: a Poisson CUSUM (models.counts.RateRise) for a flap of one XID every
    # xid_flap_every_s against a quiet rate of xid_quiet_per_day, held fixed (a device throws
    # too few in a day for its own record to say its rate). At the defaults an XID adds
    # ln(864) = 6.8 and quiet time drains 0.01 a second, so 12 is crossed by two XIDs within
    # 150 s or three within 14 minutes; by Wald's bound a device at the quiet rate crosses it
    # about once in e^12 (160,000) XIDs. It reads over only while XIDs keep coming (the
    # newest within xid_flap_every_s): a device that stopped is not stepped further on them
    xid_flap_every_s: float = 100.0
    xid_quiet_per_day: float = 1.0
    xid_threshold: float = 12.0
    fatal_latch_s: float = 600.0
    # how far an event's own clock may run ahead of the broker's before it is clamped: the
    # bound commands get (MAX_CLOCK_SKEW_S); NTP keeps a host within milliseconds of it
    max_skew_s: float = MAX_CLOCK_SKEW_S
    # a capped device's probe is judged (over its clock ratio, against uncapped peers) once
    # its clocks have held within clock_settle_ratio for clock_settle_s: the probe then ran
    # at the clock it is divided by. GEMM throughput follows the SM clock; TPOT does not
    clock_settle_s: float = 15.0
    clock_settle_ratio: float = 0.02
    confirm_gap_s: float = 1.0  # hard evidence confirmed: two samples this far apart
    # a deviation most of a device's node, rack or cohort shares is the group's, not the
    # device's (models.attribution); off, every device is judged alone against its peers
    common_mode: bool = True

    def ecc_rise(self) -> RateRise:
        """The correctable-ECC storm test these settings describe."""
        return RateRise(
            ratio=self.ecc_rise_ratio,
            threshold=self.ecc_threshold,
            prior_events=self.ecc_prior_events,
            prior_s=self.ecc_prior_s,
        )

    def __post_init__(self) -> None:
        if self.keepalive_slots < 1:
            raise ValueError("keepalive_slots: at least one slot per verdict interval")

    def xid_quiet_per_s(self) -> float:
        return self.xid_quiet_per_day / 86_400.0

    def xid_rise(self) -> RateRise:
        """The XID flap test these settings describe (its quiet rate: :meth:`xid_quiet_per_s`)."""
        return RateRise(
            ratio=1.0 / (self.xid_flap_every_s * self.xid_quiet_per_s()),
            threshold=self.xid_threshold,
        )


@dataclass(slots=True)
class DeviceState:
    """What the detector remembers of one device: numbers only (see the size test)."""

    node_id: str
    region: str
    rack_id: str
    kind: AcceleratorType
    seen_s: float = 0.0
    live_s: float = 0.0  # broker time of its newest sample (liveness is judged on it)
    hard_seen: int = 0  # samples in a row that reported a double-bit error or fatal XID
    hard_at_s: float = -math.inf  # broker time of the last of them
    probe_fails: int = 0  # probe results in a row that failed
    probe_failed_at_s: float = -math.inf
    confirmed_emitted: bool = False
    source: Hashable = None  # where its samples come from (a topic partition)
    clock_max_mhz: float = 0.0
    clock_ratio: float = 1.0
    clock_moved_s: float = -math.inf  # when the clock ratio last moved by more than settle
    status: HealthStatus = HealthStatus.HEALTHY
    keepalive_s: float = -math.inf  # when its unchanged verdict is said again: its next slot
    dbe: int = 0
    fatal_xid: int = 0
    fatal_at_s: float = -math.inf
    xid_cusum: float = 0.0  # the XID flap statistic (models.counts) as of xid_at_s
    xid_at_s: float = -math.inf  # its newest non-fatal XID's time
    probe_failed: bool = False
    probe_slow: int = 0  # probes in a row slow against their type's peers (as each read)
    probe_x: float = math.nan  # its newest probe's throughput over its clock ratio
    sbe_last: int = -1  # the correctable ECC counter as last read (-1: not yet)
    sbe_at_s: float = math.nan  # and when
    ecc_cusum: float = 0.0  # the rise statistic (models.counts)
    ecc_quiet_events: float = 0.0  # the device's quiet record, its baseline's evidence
    ecc_quiet_s: float = 0.0
    power_smooth: float = math.nan
    temp_resid: float = 0.0
    thermal_sigma: float = 0.0
    thermal_hot: bool = False
    capped: bool = False  # clocks held down by a power cap or brake: by our hand, not a fault
    tpot_fast: float = 0.0
    tpot_history: float = 0.0
    tpot_n: int = 0
    tpot_seen_s: float = -math.inf  # event time of its newest sample its peers scored
    tpot_band: int = -1  # the load band of its newest sample (its cohort: model, type, region)
    tpot_sigma: float = 0.0
    model: str = ""  # the model it serves, as its serving metrics last said
    served_s: float = -math.inf  # event time of the newest serving sample judged
    since: dict[str, float] = field(default_factory=dict)  # soft signal -> over since


@dataclass(slots=True)
class EwRegression:
    """Exponentially weighted simple regression ``y ~ a + b * x`` (per cohort)."""

    alpha: float = 0.01
    n: int = 0
    mx: float = 0.0
    my: float = 0.0
    vxx: float = 0.0
    cxy: float = 0.0

    @property
    def slope(self) -> float | None:
        """``b``, once the fit has seen enough to say it (None before)."""
        if self.n < 30 or self.vxx <= 1e-9:
            return None
        return self.cxy / self.vxx

    def residual(self, power_watts: float, temp_celsius: float) -> float | None:
        slope = self.slope
        if slope is None:
            return None
        return temp_celsius - (self.my + slope * (power_watts - self.mx))

    def learn(self, power_watts: float, temp_celsius: float) -> None:
        a = max(self.alpha, 1.0 / (self.n + 1))
        dx, dy = power_watts - self.mx, temp_celsius - self.my
        self.mx += a * dx
        self.my += a * dy
        self.vxx = (1 - a) * (self.vxx + a * dx * dx)
        self.cxy = (1 - a) * (self.cxy + a * dx * dy)
        self.n += 1


def counted(name: str) -> bool:
    """Soft signals that count occurrences (probes in a row): one is suspect,
    ``threshold`` of them is sustained by construction."""
    return name in COUNTED_SIGNALS


def sequential(name: str) -> bool:
    """Soft signals that are a sequential test's statistic (a CUSUM, models.counts): the
    test has weighed the evidence over time already, so over its threshold is sustained."""
    return name in ("ecc_sbe_rise", "xid_rise")


class Reading(NamedTuple):
    """A signal as the detector weighs it on every sample: a tuple, not a contract (a
    verdict's :class:`~schemas.verdicts.Signal` is made from it, through :func:`finite`,
    only when a verdict goes out)."""

    name: str
    value: float
    threshold: float


def over_threshold(signal: Reading | Signal) -> bool:
    if counted(signal.name):
        return signal.value >= 1
    return signal.threshold > 0 and signal.value >= signal.threshold


def finite(signal: Reading | Signal) -> Signal:
    if math.isfinite(signal.value) and math.isfinite(signal.threshold):
        return Signal(
            name=signal.name, value=round(signal.value, 4), threshold=round(signal.threshold, 4)
        )
    return Signal(name=signal.name, value=0.0, threshold=0.0)


def describe(signal: Reading | Signal, for_s: float) -> str:
    held = f" for {for_s:.0f}s" if for_s >= 1 else ""
    return f"{signal.name} {signal.value:.3g} (threshold {signal.threshold:.3g}){held}"
