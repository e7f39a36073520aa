"""Peer cohorts: what "normal" looks like for devices doing the same work.

A grey-failing device passes every health check; it is only slower than its
peers. Peers are devices in the same cohort (model x accelerator type x region
x load band for serving latency; accelerator type for probes and temperature). Each
cohort keeps a robust location and spread (median and interquartile range,
linearly interpolated) of a per-sample value over a rolling window, so one sick
device among many moves neither, and a fleet-wide change (a demand spike, a
hot afternoon) moves both, so it is not mistaken for a device fault.

The window is the last ``window`` samples that are at most ``max_age_s`` old
(event time). Peers are peers *now*: a cohort no device visited for a while
(a load band the traffic left) holds what was normal then, and a rollout since
would read as the first returning device's own slowness. With an age limit, a
cohort's stale samples leave it, and it is scored again once ``min_samples``
fresh ones have come from enough peers.

The heavy state is per cohort (a few KiB each, a few hundred cohorts for a
fleet), never per device.

Example::

    peers = Cohorts(window=256, min_samples=40, sigma_floor=0.01, max_age_s=60.0)
    key = ("llama-70b", "H100", "us-east", 7)
    score = peers.score(key, x, device, at_s=t)   # None until enough fresh samples from peers
    peers.learn(key, x, device, at_s=t)           # score first, then learn
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

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


def _quantile(ordered: list[float], share: float) -> float:
    """The ``share`` quantile of sorted values, interpolated linearly between neighbours."""
    at = (len(ordered) - 1) * share
    low = int(at)
    if low + 1 >= len(ordered):
        return ordered[low]
    part = at - low
    return ordered[low] * (1.0 - part) + ordered[low + 1] * part


class Cohort:
    """One cohort's window: its samples in order (value, member, time) and their values sorted."""

    __slots__ = ("_members", "_order", "_seen", "_sorted", "max_age_s", "newest_s", "window")

    def __init__(self, window: int, max_age_s: float = math.inf) -> None:
        self.window = window
        self.max_age_s = max_age_s
        self._order: deque[tuple[float, Hashable, float]] = deque()
        self._sorted: list[float] = []
        self._members: dict[Hashable, int] = {}  # member -> its samples in the window
        self._seen: dict[Hashable, float] = {}  # member -> its newest sample's time
        self.newest_s = -math.inf

    @property
    def samples(self) -> int:
        """Samples in the window now."""
        return len(self._order)

    def _drop_oldest(self) -> None:
        value, member, _ = self._order.popleft()
        ordered = self._sorted
        del ordered[bisect_left(ordered, value)]
        left = self._members[member] - 1
        if left:
            self._members[member] = left
        else:
            del self._members[member]
            self._seen.pop(member, None)

    def expire(self, now_s: float) -> None:
        """Drop the samples older than ``max_age_s`` at ``now_s`` (or the newest time seen)."""
        if now_s > self.newest_s:
            self.newest_s = now_s
        cutoff = self.newest_s - self.max_age_s
        order = self._order
        while order and order[0][2] < cutoff:
            self._drop_oldest()

    def learn(self, value: float, member: Hashable, at_s: float) -> None:
        self.expire(at_s)
        if len(self._order) >= self.window:
            self._drop_oldest()
        self._order.append((value, member, at_s))
        insort(self._sorted, value)
        self._members[member] = self._members.get(member, 0) + 1
        self._seen[member] = max(at_s, self._seen.get(member, at_s))

    def peers(self, member: Hashable, since_s: float = -math.inf) -> int:
        """Distinct members in the window other than ``member`` (with a sample since
        ``since_s``)."""
        if since_s == -math.inf:
            return len(self._members) - (member in self._members)
        return sum(1 for m, at in self._seen.items() if m != member and at >= since_s)

    @property
    def median(self) -> float:
        return _quantile(self._sorted, 0.5) if self._sorted else math.nan

    @property
    def sigma(self) -> float:
        if not self._sorted:
            return math.nan
        return (_quantile(self._sorted, 0.75) - _quantile(self._sorted, 0.25)) / IQR_TO_SIGMA


class Cohorts:
    """Cohorts by key; ``sigma_floor`` keeps a very uniform cohort from flagging noise.

    A value is scored once its cohort holds ``min_samples`` and ``min_peers`` other
    members; with ``fresh_s``, only members with a sample in the last ``fresh_s`` count as
    peers (a cohort whose other members all stopped teaching it, capped, drained or slow
    themselves, is a record of the past, not peers)."""

    def __init__(
        self,
        *,
        window: int = 256,
        min_samples: int = 40,
        min_peers: int = 3,
        sigma_floor: float,
        max_age_s: float = math.inf,
        fresh_s: float = math.inf,
    ) -> None:
        if window < 1 or min_samples > window:
            raise ValueError(f"window {window} must hold min_samples {min_samples}")
        if not max_age_s > 0:
            raise ValueError(f"max_age_s must be positive, not {max_age_s}")
        if not fresh_s > 0:
            raise ValueError(f"fresh_s must be positive, not {fresh_s}")
        self.window = window
        self.min_samples = min_samples
        self.min_peers = min_peers
        self.sigma_floor = sigma_floor
        self.max_age_s = max_age_s
        self.fresh_s = fresh_s
        self._cohorts: dict[Hashable, Cohort] = {}

    def __len__(self) -> int:
        return len(self._cohorts)

    def score(
        self, key: Hashable, value: float, member: Hashable = None, *, at_s: float
    ) -> PeerScore | None:
        """How far ``member``'s ``value`` sits from its peers; ``None`` while there are too few."""
        if not math.isfinite(value):
            return None
        ready = self._ready(key, member, at_s)
        if ready is None:
            return None
        cohort, peers = ready
        sigma = max(cohort.sigma, self.sigma_floor)
        return PeerScore(value - cohort.median, sigma, cohort.samples, peers)

    def ready(self, key: Hashable, member: Hashable = None, *, at_s: float) -> bool:
        """Whether ``key``'s cohort could score ``member`` at ``at_s`` (enough samples, and
        peers fresh then): a score taken earlier is only as good as its peers are now."""
        return self._ready(key, member, at_s) is not None

    def _ready(self, key: Hashable, member: Hashable, at_s: float) -> tuple[Cohort, int] | None:
        """``key``'s cohort and ``member``'s fresh peers in it, when it can score now."""
        cohort = self._cohorts.get(key)
        if cohort is None:
            return None
        cohort.expire(at_s)
        if cohort.samples < self.min_samples:
            return None
        peers = cohort.peers(member, at_s - self.fresh_s)
        if peers < self.min_peers:
            return None
        return cohort, peers

    def learn(self, key: Hashable, value: float, member: Hashable = None, *, at_s: float) -> None:
        if not math.isfinite(value):
            return
        cohort = self._cohorts.get(key)
        if cohort is None:
            cohort = self._cohorts[key] = Cohort(self.window, self.max_age_s)
        cohort.learn(value, member, at_s)
