"""What the fleet's health detector and the single-stream scorer share: how a reading
becomes an alarm.

The two ask different questions. The health detector (:mod:`models.health`)
compares a device with its peers at one moment (a fleet has peers; a NAB series
has none). The stream scorer (:mod:`models.univariate`) compares one stream
with its own past. What they do with the answer is the same, and lives here
once:

- **Likelihood.** A z-score against a learned location and spread becomes a
  probability, :func:`likelihood` (the Gaussian's ``1 - p`` of the upper tail),
  and a score with the same order that never saturates, :func:`rank`. The
  scorer judges the mean of its recent surprise against that mean's own
  history (:class:`RollingMoments`) this way; the windowed-Gaussian baseline
  uses the same moments.
- **Streaks.** A signal over its threshold is only *suspect* until it has held
  for a while: :func:`streak` keeps, per signal, since when it has been over,
  and forgets it the moment it is not. The detector judges each device's
  signals with it, and each watched group's (node, rack, cohort) medians.
- **Refractory.** After something is said, the same thing is not said again
  for a period: :func:`refractory`. The scorer halves its output for
  ``refractory`` values after an alarm (one anomaly, one detection); the
  detector re-emits an unchanged verdict, a device's or a group's, only once
  per verdict interval, a device's in its own slot of it (:func:`next_slot`), so
  a fleet's keep-alives do not all come in the same second. Time is whatever
  the caller counts in: values seen, or seconds of event time.

Everything here is plain numbers and dicts (no objects per device), so a
device's pickled state does not grow by sharing it.
"""

from __future__ import annotations

import math
import zlib
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

__all__ = ["RollingMoments", "likelihood", "next_slot", "phase", "rank", "refractory", "streak"]


def likelihood(sigmas: float) -> float:
    """The probability that a Gaussian value falls below ``sigmas`` standard deviations
    over its mean: how sure it is that a reading this far up is not chance (0.5 at the
    mean)."""
    return 1.0 - 0.5 * math.erfc(sigmas / math.sqrt(2.0))


def rank(sigmas: float) -> float:
    """A score in (0, 1) with :func:`likelihood`'s order that does not saturate at 1.0 in
    floating point (so a strong anomaly and an overwhelming one stay apart)."""
    return 0.5 + 0.5 * sigmas / (1.0 + abs(sigmas))


def refractory(last: float, now: float, period: float) -> bool:
    """Whether ``now`` still falls inside the refractory ``period`` that began at ``last``
    (the last alarm, the last verdict). ``last`` of ``-inf``: never began."""
    return now - last < period


def phase(key: str, slots: int) -> float:
    """One of ``slots`` evenly spaced shares of a period, in [0, 1), fixed for ``key`` in
    every process and run (CRC-32 of its UTF-8): where in each period its keep-alive
    falls."""
    return (zlib.crc32(key.encode()) % slots) / slots


def next_slot(at: float, period: float, offset: float) -> float:
    """When the slot after the one ``at`` falls in begins, slots being ``period`` long and
    shifted by ``offset``: a keep-alive said at ``at`` is said again then. Its keep-alives
    come at most ``period`` apart, and keys with offsets spread over the period say theirs
    spread over it too; :func:`refractory`'s, counted from a start many keys share (their
    first sample), come all together every period."""
    return offset + (math.floor((at - offset) / period) + 1.0) * period


def streak(since: dict[str, float], over: Collection[str], at: float) -> dict[str, float]:
    """How long each signal in ``over`` has been over, as of ``at``. ``since`` (signal ->
    when its streak began) is updated in place: a streak starts at its first reading over,
    and a signal not in ``over`` loses its streak. The result is in ``over``'s order."""
    if not over:  # what most readings of a healthy device come to: nothing held
        since.clear()
        return {}
    held = {name: at - since.setdefault(name, at) for name in over}
    if len(since) > len(held):
        for name in [n for n in since if n not in held]:
            del since[name]
    return held


@dataclass(slots=True)
class RollingMoments:
    """The last ``size`` values with their running sum and sum of squares: mean and spread
    in O(1) per value (the scorer's likelihood history, the windowed Gaussian's window)."""

    size: int
    values: deque[float] = field(init=False)
    total: float = 0.0
    squares: float = 0.0

    def __post_init__(self) -> None:
        self.values = deque(maxlen=self.size)

    def __len__(self) -> int:
        return len(self.values)

    def add(self, value: float) -> None:
        if len(self.values) == self.values.maxlen:
            old = self.values[0]
            self.total -= old
            self.squares -= old * old
        self.values.append(value)
        self.total += value
        self.squares += value * value

    def mean(self) -> float:
        return self.total / len(self.values)

    def spread(self) -> float:
        """The population standard deviation of the values held."""
        mean = self.mean()
        return math.sqrt(max(self.squares / len(self.values) - mean * mean, 0.0))
