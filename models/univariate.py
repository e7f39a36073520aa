"""An online anomaly scorer for one metric stream (a NAB series, a device's counter).

Three stages, each scored before it learns:

1. **surprise**: how far the value falls from what the past predicts. Two
   predictors: an exponentially weighted level, and (when timestamps come with
   the values) the value one season ago (``season_s``, a day by default). Each
   error is measured in units of that predictor's typical absolute error (also
   exponentially weighted); the smaller of the two, ``z``, becomes a raw score
   in [0, 1) by ``1 - exp(-z / 3)``, so a daily rhythm is not news. Beside it, a
   coarse histogram of every value seen so far scores how rare this value is
   (a level the stream has never held is news even when it holds steady).
2. **likelihood**: the raw scores' own distribution. The mean of the last
   ``short`` raw scores against the mean and spread of the last ``long``
   (Numenta's anomaly likelihood idea: a burst of surprise is anomalous, one
   noisy point is not) gives a z-score; the likelihood is its Gaussian
   ``1 - p``, and the output ``0.5 + 0.5 z / (1 + |z|)`` ranks the same way
   without saturating at 1.0 in floating point.
3. **refractory**: after an alarm (likelihood over ``alarm``) the output is
   damped for ``refractory`` points, so one anomaly is one detection.

The output is in [0, 1]; a higher score is more anomalous. As in river,
``score_one`` scores a value given only the past and changes nothing;
``learn_one`` learns it. Score first, then learn:

Example::

    scorer = StreamScorer()
    for at, value in series:
        score = scorer.score_one(value, at)
        scorer.learn_one(value, at)

The defaults were picked on NAB's development subset with a coarse search (48
settings of the level and error rates, the likelihood windows and the
refractory period); the other NAB categories were never looked at.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class StreamScorerConfig:
    level_alpha: float = 0.05
    error_alpha: float = 0.01
    season_s: float = 86_400.0
    max_season_samples: int = 5_000
    bins: int = 40
    short: int = 5
    long: int = 2000
    warmup: int = 50
    alarm: float = 0.995
    refractory: int = 300


class StreamScorer:
    """Scores each value of one stream against its past (0: usual, 1: anomalous);
    :meth:`learn_one` then learns it."""

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
        self.first_at: datetime | None = None
        self.season: deque[float] | None = None  # the last season of values, once known
        self.season_error = 0.0

    def score_one(self, value: float, at: datetime | None = None) -> float:
        """The score of ``value`` given only the past; changes nothing (river's contract:
        :meth:`learn_one` learns it). ``at`` is accepted for symmetry: the season is
        learned from timestamps, not scored from them."""
        del at
        c = self.config
        if not math.isfinite(value):
            return 0.0
        seen = self.n + 1  # counting this value, as learn_one will
        if seen <= c.warmup:
            return 0.0
        score, _ = self._assess(self._raw(value))
        return score * 0.5 if seen < self.quiet_until else score

    def learn_one(self, value: float, at: datetime | None = None) -> None:
        """Learn ``value`` (observed at ``at``, if known): the predictors, the histogram,
        the raw-score history and, after an alarm, the refractory period."""
        c = self.config
        if not math.isfinite(value):
            return
        if at is not None:
            self._season_from(at)
        raw = self._raw(value)
        self._learn(value)
        self.n += 1
        if self.n > c.warmup:
            _, likelihood = self._assess(raw)
            self.raw_short.append(raw)
            if self.n >= self.quiet_until and likelihood >= c.alarm:
                self.quiet_until = self.n + c.refractory
        self._remember(raw)

    def _assess(self, raw: float) -> tuple[float, float]:
        """(score, likelihood) of a raw surprise against the raw history, as if it were
        the newest of the short window."""
        recent = list(self.raw_short)
        if len(recent) == self.raw_short.maxlen:
            recent = recent[1:]
        recent.append(raw)
        short_mean = sum(recent) / len(recent)
        k = len(self.raw_long)
        mean = self.long_sum / k
        var = max(self.long_sq / k - mean * mean, 0.0)
        std = max(math.sqrt(var), 1e-3)
        z = (short_mean - mean) / std
        likelihood = 1.0 - 0.5 * math.erfc(z / math.sqrt(2.0))
        # the same order as the likelihood, without its saturation at 1.0 in floating point
        # (so the corpus threshold can still tell a strong anomaly from an overwhelming one)
        return 0.5 + 0.5 * z / (1.0 + abs(z)), likelihood

    def _season_from(self, at: datetime) -> None:
        """The season's length in samples, from the spacing of the first two timestamps."""
        if self.first_at is None:
            self.first_at = at
        elif self.season is None and self.n == 1:
            step = (at - self.first_at).total_seconds()
            samples = round(self.config.season_s / step) if step > 0 else 0
            if 2 <= samples <= self.config.max_season_samples:
                self.season = deque(maxlen=samples)

    def _raw(self, value: float) -> float:
        if self.n == 0:
            return 0.0
        z = abs(value - self.level) / max(self.error, 1e-9 + 1e-6 * abs(self.level))
        s = self.season
        if s is not None and len(s) == s.maxlen and self.n > 2 * len(s):
            z = min(z, abs(value - s[0]) / max(self.season_error, 1e-9 + 1e-6 * abs(value)))
        surprise = 1.0 - math.exp(-z / 3.0)
        rarity = 0.0
        if self.hi > self.lo:
            span = self.hi - self.lo
            if value < self.lo - 0.05 * span or value > self.hi + 0.05 * span:
                rarity = 1.0
            else:
                b = self._bin(value)
                p = (self.counts[b] + 1.0) / (self.n + self.config.bins)
                rarity = min(1.0, -math.log(p) / math.log(self.n + self.config.bins))
        return max(surprise, rarity * rarity)

    def _bin(self, value: float) -> int:
        b = int((value - self.lo) / (self.hi - self.lo) * self.config.bins)
        return min(max(b, 0), self.config.bins - 1)

    def _learn(self, value: float) -> None:
        c = self.config
        s = self.season
        if s is not None:
            if len(s) == s.maxlen:
                self.season_error += c.error_alpha * (abs(value - s[0]) - self.season_error)
            s.append(value)
        if self.n == 0:
            self.level = value
        else:
            self.error += c.error_alpha * (abs(value - self.level) - self.error)
            self.level += c.level_alpha * (value - self.level)
        if value < self.lo or value > self.hi:
            self._rebin(min(self.lo, value), max(self.hi, value))
        if self.hi > self.lo:
            self.counts[self._bin(value)] += 1

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


class WindowedGaussian:
    """The textbook baseline: the value's two-sided Gaussian tail against the mean and
    spread of the last ``window`` values (scored before learning, like every learner)."""

    def __init__(self, window: int = 6400) -> None:
        self.values: deque[float] = deque(maxlen=window)
        self.total = 0.0
        self.squares = 0.0

    def score_one(self, value: float, at: datetime | None = None) -> float:
        """The two-sided tail of ``value`` against the window; changes nothing."""
        del at
        if not math.isfinite(value):
            return 0.0
        k = len(self.values)
        if k < 2:
            return 0.0
        mean = self.total / k
        std = math.sqrt(max(self.squares / k - mean * mean, 0.0))
        return 1.0 - math.erfc(abs(value - mean) / (std * math.sqrt(2.0))) if std > 0 else 0.0

    def learn_one(self, value: float, at: datetime | None = None) -> None:
        del at
        if not math.isfinite(value):
            return
        if len(self.values) == self.values.maxlen:
            old = self.values[0]
            self.total -= old
            self.squares -= old * old
        self.values.append(value)
        self.total += value
        self.squares += value * value
