"""Peer cohorts: what "normal" looks like for devices doing the same work.

A grey-failing device passes every health check; it is only slower than its
peers. Peers are devices in the same cohort (model x accelerator type x load
band for serving latency; accelerator type for probes and temperature). Each
cohort keeps a robust location and spread of a per-sample value over a rolling
window (river's ``RollingQuantile`` and ``RollingIQR``), so one sick device
among many moves neither, and a fleet-wide change (a demand spike, a hot
afternoon) moves both, so it is not mistaken for a device fault.

The heavy state is per cohort (a few KiB each, a few hundred cohorts for a
fleet), never per device.

Example::

    peers = Cohorts(window=256, min_samples=40, sigma_floor=0.01)
    key = ("llama-70b", "H100", 7)
    score = peers.score(key, x, device)   # None until enough samples from enough peers
    peers.learn(key, x, device)           # score first, then learn
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Hashable
from dataclasses import dataclass

from river import stats

IQR_TO_SIGMA = 1.349  # IQR of a normal distribution in standard deviations


@dataclass(frozen=True, slots=True)
class PeerScore:
    """A value against its cohort: deviation from the median, in units of robust sigma."""

    deviation: float
    sigma: float
    samples: int
    peers: int  # distinct members in the window, not counting the one scored

    @property
    def z(self) -> float:
        return self.deviation / self.sigma


class Cohort:
    """Rolling median and IQR of one cohort's values, and who contributed them."""

    __slots__ = ("_iqr", "_median", "_members", "_order", "samples")

    def __init__(self, window: int) -> None:
        self._median = stats.RollingQuantile(q=0.5, window_size=window)
        self._iqr = stats.RollingIQR(q_inf=0.25, q_sup=0.75, window_size=window)
        self._order: deque[Hashable] = deque(maxlen=window)
        self._members: Counter[Hashable] = Counter()
        self.samples = 0

    def learn(self, value: float, member: Hashable) -> None:
        self._median.update(value)
        self._iqr.update(value)
        if len(self._order) == self._order.maxlen:
            old = self._order[0]
            self._members[old] -= 1
            if self._members[old] <= 0:
                del self._members[old]
        self._order.append(member)
        self._members[member] += 1
        self.samples += 1

    def peers(self, member: Hashable) -> int:
        """Distinct members in the window other than ``member``."""
        return len(self._members) - (1 if member in self._members else 0)

    @property
    def median(self) -> float:
        value = self._median.get()
        return math.nan if value is None else float(value)

    @property
    def sigma(self) -> float:
        value = self._iqr.get()
        return math.nan if value is None else float(value) / IQR_TO_SIGMA


class Cohorts:
    """Cohorts by key; ``sigma_floor`` keeps a very uniform cohort from flagging noise."""

    def __init__(
        self, *, window: int = 256, min_samples: int = 40, min_peers: int = 3, sigma_floor: float
    ) -> None:
        self.window = window
        self.min_samples = min_samples
        self.min_peers = min_peers
        self.sigma_floor = sigma_floor
        self._cohorts: dict[Hashable, Cohort] = {}

    def __len__(self) -> int:
        return len(self._cohorts)

    def score(self, key: Hashable, value: float, member: Hashable = None) -> PeerScore | None:
        """How far ``member``'s ``value`` sits from its peers; ``None`` while there are too few."""
        if not math.isfinite(value):
            return None
        cohort = self._cohorts.get(key)
        if cohort is None or cohort.samples < self.min_samples:
            return None
        peers = cohort.peers(member)
        if peers < self.min_peers:
            return None
        sigma = max(cohort.sigma, self.sigma_floor)
        return PeerScore(value - cohort.median, sigma, cohort.samples, peers)

    def learn(self, key: Hashable, value: float, member: Hashable = None) -> None:
        if not math.isfinite(value):
            return
        cohort = self._cohorts.get(key)
        if cohort is None:
            cohort = self._cohorts[key] = Cohort(self.window)
        cohort.learn(value, member)
