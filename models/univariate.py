"""An online anomaly scorer for one metric stream (a NAB series, a device's counter).

Three stages, each scored before it learns:

1. **surprise**: how far the value falls from what the recent past predicts.
   The prediction is an exponentially weighted level; the error is measured in
   units of the stream's typical absolute error (also exponentially weighted),
   and turned into a raw score in [0, 1) by ``1 - exp(-z / 3)``. Beside it, a
   coarse histogram of every value seen so far scores how rare this value is
   (a level the stream has never held is news even when it holds steady).
2. **likelihood**: the raw scores' own distribution. The mean of the last
   ``short`` raw scores against the mean and spread of the last ``long``
   (Numenta's anomaly likelihood idea: a burst of surprise is anomalous, one
   noisy point is not) gives a Gaussian tail probability ``p``; the
   likelihood is ``1 - p``.
3. **refractory**: after an alarm (likelihood over ``alarm``) the output is
   damped for ``refractory`` points, so one anomaly is one detection.

The output is in [0, 1]; a higher score is more anomalous. ``score_one``
returns the score of a value given only the past, then learns it.

Example::

    scorer = StreamScorer()
    for value in series:
        score = scorer.score_one(value)
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StreamScorerConfig:
    level_alpha: float = 0.1
    error_alpha: float = 0.01
    bins: int = 40
    short: int = 10
    long: int = 1000
    warmup: int = 50
    alarm: float = 0.995
    refractory: int = 100


class StreamScorer:
    """See the module docstring."""

    def __init__(self, config: StreamScorerConfig | None = None) -> None:
        self.config = c = config or StreamScorerConfig()
        self.n = 0
        self.level = 0.0
        self.error = 0.0
        self.lo = math.inf
        self.hi = -math.inf
        self.counts = [0] * c.bins
        self.raw_short: deque[float] = deque(maxlen=c.short)
        self.raw_long: deque[float] = deque(maxlen=c.long)
        self.long_sum = 0.0
        self.long_sq = 0.0
        self.quiet_until = 0

    def score_one(self, x: float) -> float:
        c = self.config
        if not math.isfinite(x):
            return 0.0
        raw = self._raw(x)
        self._learn(x)
        self.n += 1
        if self.n <= c.warmup:
            self._remember(raw)
            return 0.0
        self.raw_short.append(raw)
        short_mean = sum(self.raw_short) / len(self.raw_short)
        k = len(self.raw_long)
        mean = self.long_sum / k
        var = max(self.long_sq / k - mean * mean, 0.0)
        std = max(math.sqrt(var), 1e-3)
        likelihood = 1.0 - 0.5 * math.erfc((short_mean - mean) / (std * math.sqrt(2.0)))
        self._remember(raw)
        if self.n < self.quiet_until:
            return likelihood * 0.5
        if likelihood >= c.alarm:
            self.quiet_until = self.n + c.refractory
        return likelihood

    def _raw(self, x: float) -> float:
        if self.n == 0:
            return 0.0
        z = abs(x - self.level) / max(self.error, 1e-9 + 1e-6 * abs(self.level))
        surprise = 1.0 - math.exp(-z / 3.0)
        rarity = 0.0
        if self.hi > self.lo:
            span = self.hi - self.lo
            if x < self.lo - 0.05 * span or x > self.hi + 0.05 * span:
                rarity = 1.0
            else:
                b = self._bin(x)
                p = (self.counts[b] + 1.0) / (self.n + self.config.bins)
                rarity = min(1.0, -math.log(p) / math.log(self.n + self.config.bins))
        return max(surprise, rarity * rarity)

    def _bin(self, x: float) -> int:
        b = int((x - self.lo) / (self.hi - self.lo) * self.config.bins)
        return min(max(b, 0), self.config.bins - 1)

    def _learn(self, x: float) -> None:
        c = self.config
        if self.n == 0:
            self.level = x
        else:
            self.error += c.error_alpha * (abs(x - self.level) - self.error)
            self.level += c.level_alpha * (x - self.level)
        if x < self.lo or x > self.hi:
            self._rebin(min(self.lo, x), max(self.hi, x))
        if self.hi > self.lo:
            self.counts[self._bin(x)] += 1

    def _rebin(self, lo: float, hi: float) -> None:
        """The range grew: spread the old counts onto the new bins (by bin centre)."""
        old_lo, old_hi, old = self.lo, self.hi, self.counts
        self.lo, self.hi = lo, hi
        self.counts = [0] * self.config.bins
        if old_hi > old_lo and hi > lo:
            width = (old_hi - old_lo) / len(old)
            for i, n in enumerate(old):
                if n:
                    self.counts[self._bin(old_lo + (i + 0.5) * width)] += n

    def _remember(self, raw: float) -> None:
        if len(self.raw_long) == self.raw_long.maxlen:
            old = self.raw_long[0]
            self.long_sum -= old
            self.long_sq -= old * old
        self.raw_long.append(raw)
        self.long_sum += raw
        self.long_sq += raw * raw
