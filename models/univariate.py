"""An online anomaly scorer for one metric stream (a NAB series, a device's counter).

Four stages, each scored before it learns:

1. **raw surprise**, in [0, 1]: the mean of three views of the value, each
   asking a different question of the past:
   - *prediction*: how far the value falls from what the past predicts. Two
     predictors: an exponentially weighted level and (when timestamps come
     with the values) the value one season ago (``season_s``, a day by
     default). Each error is measured in units of that predictor's typical
     absolute error; the smaller of the two, ``z``, maps to ``1 - exp(-z / 3)``,
     so a daily rhythm is not news;
   - *rarity*: how rare the value's level is in a coarse histogram of every
     value seen (a level the stream has never held is news even when it holds
     steady);
   - *sequence*: whether the stream has ever moved this way before. Values are
     cut into ``context_bins`` fixed bins (their width set from the first
     ``context_warmup`` values); a memory counts which bin followed each context
     of the last 1 to ``context_order`` bins, and the score is the share of
     those contexts after which this bin was never seen. A rhythm that changes
     shape without leaving its range is news here and nowhere else.
2. **likelihood**: the raw scores' own distribution (Numenta's anomaly
   likelihood idea). The mean ``m`` of the last ``short`` raw scores is
   compared with the history of that same quantity (up to ``long`` of them): a
   burst of surprise is anomalous, one noisy point is not, and a stream that is
   always surprising is not. It is compared as ``-ln(1 - m)``, which is
   unbounded as ``m`` nears 1: on ``m`` itself a z-score could never pass
   ``(1 - mean) / spread``, a ceiling that differs from stream to stream, so
   the strongest anomalies of a noisy stream and of a quiet one would land at
   different scores and one threshold could not serve both (on NAB's
   development subset, a threshold chosen on the artificial files scored the
   AWS files 23 with ``m``, 58 with ``-ln(1 - m)``). The z-score's Gaussian
   ``1 - p`` is the likelihood; the output ``0.5 + 0.5 z / (1 + |z|)`` ranks the
   same way without saturating at 1.0 in floating point.
3. **a value never near**: one further outside the range seen so far than
   ``outside_margin`` of it (5%) scores at least as an alarm, higher the further
   out (the alarm's z-score times how many margins out it lies), and alarms. A
   lone spike past anything the stream has held is otherwise averaged away by
   the likelihood's short window. Numenta's NAB detector applies the same rule,
   with the same tolerance, beside its likelihood; on NAB's development subset it
   raised the AWS files, scored with a threshold chosen on the others alone, from
   58.2 to 64.2, and left the artificial files as they were (74.1).
4. **refractory**: after an alarm (likelihood over ``alarm``, or a value never
   near) the output is halved for ``refractory`` values, so one anomaly is one
   detection.

Stages 2 and 4 are :mod:`models.evidence`'s likelihood and refractory, the same
code the fleet's health detector says its verdicts with.

The output is in [0, 1]; a higher score is more anomalous. As in river,
``score_one`` scores a value given only the past and changes nothing;
``learn_one`` learns it. Score first, then learn:

Example::

    scorer = StreamScorer()
    for at, value in series:
        score = scorer.score_one(value, at)
        scorer.learn_one(value, at)

The structure (three views averaged, likelihood over the short mean's own
history) was chosen on NAB's development subset and validated leaving one
category out (``fleetloop eval nab --loco``): each category scored with the
defaults and a threshold chosen on the others. Settings chosen on the others
(:func:`neighbours`) transferred worse than the defaults, so the defaults stay
fixed. The other NAB categories were never looked at.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from datetime import datetime
from statistics import NormalDist

from models.evidence import RollingMoments, likelihood, rank, refractory

__all__ = ["StreamScorer", "StreamScorerConfig", "WindowedGaussian", "neighbours"]


@dataclass(frozen=True, slots=True)
class StreamScorerConfig:
    level_alpha: float = 0.05
    error_alpha: float = 0.01
    season_s: float = 86_400.0
    max_season_samples: int = 5_000
    bins: int = 40  # the rarity histogram, over the range seen so far
    context_bins: int = 20  # the sequence memory's bins over the warm-up range
    context_order: int = 2  # contexts of the last 1 .. context_order bins
    context_warmup: int = 150
    max_contexts: int = 20_000  # the memory stops growing here (each holds a few counts)
    short: int = 10
    long: int = 8_000
    warmup: int = 50
    alarm: float = 0.995
    refractory: int = 300
    min_spread: float = 0.01  # the history's spread is never taken as tighter than this
    # a value further than this share of the range seen so far outside it is an anomaly
    # on its own: the stream has never been near it (the rarity view's "never held")
    outside_margin: float = 0.05

    def __post_init__(self) -> None:
        if not 0.5 < self.alarm < 1.0:
            raise ValueError(f"alarm is a likelihood in (0.5, 1), not {self.alarm}")
        if self.outside_margin <= 0:
            raise ValueError(
                f"outside_margin is a share of the range, > 0, not {self.outside_margin}"
            )


def neighbours(config: StreamScorerConfig | None = None) -> dict[str, StreamScorerConfig]:
    """``config`` (the defaults) by name, and its neighbours: the likelihood's short window,
    the refractory period and the sequence memory's order each halved and doubled (or one
    shorter and one longer), one at a time. What ``eval nab --loco`` chooses among."""
    base = config or StreamScorerConfig()
    changes = (
        ("short", base.short // 2),
        ("short", base.short * 2),
        ("refractory", base.refractory // 2),
        ("refractory", base.refractory * 2),
        ("context_order", base.context_order - 1),
        ("context_order", base.context_order + 1),
    )
    out = {"defaults": base}
    for name, value in changes:
        out[f"{name}={value}"] = replace(base, **{name: value})
    return out


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
        self.first_at: datetime | None = None
        self.season: deque[float] | None = None  # the last season of values, once known
        self.season_error = 0.0
        # the sequence memory: fixed bins once warm, the last bins, what followed each context
        self.early: list[float] | None = []
        self.origin = 0.0
        self.width = 0.0
        self.recent_bins: deque[int] = deque(maxlen=c.context_order)
        self.followers: dict[tuple[int, ...], dict[int, int]] = {}
        # the likelihood: the last raw scores, and the history of their mean
        self.raw_short: deque[float] = deque(maxlen=c.short)
        self.history = RollingMoments(c.long)  # of _surprisal(short mean)
        self.alarmed_at = -math.inf  # values seen at the last alarm (refractory from it)
        self._alarm_sigmas = NormalDist().inv_cdf(c.alarm)  # the z-score the alarm stands at

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
        score = self._assess(self._raw(value))[0]
        beyond = self._beyond(value)
        if beyond > 1.0:  # at least as anomalous as an alarm, more the further out it lies
            score = max(score, rank(self._alarm_sigmas * beyond))
        return score * 0.5 if refractory(self.alarmed_at, seen, c.refractory) else score

    def learn_one(self, value: float, at: datetime | None = None) -> None:
        """Learn ``value`` (observed at ``at``, if known): the predictors, the histogram,
        the sequence memory, the raw-score history and, after an alarm, the refractory
        period."""
        c = self.config
        if not math.isfinite(value):
            return
        if at is not None:
            self._season_from(at)
        raw = self._raw(value)
        _, sure = self._assess(raw)
        outside = self._beyond(value) > 1.0
        self._learn(value)
        self.n += 1
        quiet = refractory(self.alarmed_at, self.n, c.refractory)
        if self.n > c.warmup and not quiet and (sure >= c.alarm or outside):
            self.alarmed_at = self.n
        self.raw_short.append(raw)
        self.history.add(_surprisal(sum(self.raw_short) / len(self.raw_short)))

    def _assess(self, raw: float) -> tuple[float, float]:
        """(score, likelihood) of the short mean, were ``raw`` its newest, against the
        history of that mean (both as :func:`_surprisal`)."""
        if not self.history:
            return 0.5, 0.5
        recent = list(self.raw_short)
        if len(recent) == self.raw_short.maxlen:
            recent = recent[1:]
        recent.append(raw)
        now = _surprisal(sum(recent) / len(recent))
        spread = max(self.history.spread(), self.config.min_spread)
        z = (now - self.history.mean()) / spread
        # the score: the likelihood's order, without its saturation at 1.0 in floating point
        # (so the corpus threshold can still tell a strong anomaly from an overwhelming one)
        return rank(z), likelihood(z)

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
        """The mean of the three views: prediction, rarity and sequence."""
        if self.n == 0:
            return 0.0
        return (self._prediction(value) + self._rarity(value) ** 2 + self._novelty(value)) / 3.0

    def _prediction(self, value: float) -> float:
        z = abs(value - self.level) / max(self.error, 1e-9 + 1e-6 * abs(self.level))
        s = self.season
        if s is not None and len(s) == s.maxlen and self.n > 2 * len(s):
            z = min(z, abs(value - s[0]) / max(self.season_error, 1e-9 + 1e-6 * abs(value)))
        return 1.0 - math.exp(-z / 3.0)

    def _beyond(self, value: float) -> float:
        """How far ``value`` lies outside the range seen so far, in ``outside_margin``s
        of that range (0 inside it; over 1, an anomaly on its own)."""
        if self.hi <= self.lo:
            return 0.0
        margin = self.config.outside_margin * (self.hi - self.lo)
        return max(self.lo - value, value - self.hi, 0.0) / margin

    def _rarity(self, value: float) -> float:
        if self.hi <= self.lo:
            return 0.0
        if self._beyond(value) > 1.0:
            return 1.0
        p = (self.counts[self._bin(value)] + 1.0) / (self.n + self.config.bins)
        return min(1.0, -math.log(p) / math.log(self.n + self.config.bins))

    def _novelty(self, value: float) -> float:
        """The share of the recent contexts after which this value's bin never came."""
        order = self.config.context_order
        if self.early is not None or len(self.recent_bins) < order:
            return 0.0
        now = self._context_bin(value)
        recent = tuple(self.recent_bins)
        unseen = sum(now not in self.followers.get(recent[-k:], ()) for k in range(1, order + 1))
        return unseen / order

    def _context_bin(self, value: float) -> int:
        return math.floor((value - self.origin) / self.width)

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
        self._learn_sequence(value)

    def _learn_sequence(self, value: float) -> None:
        """Before ``context_warmup`` values, keep them; then fix the bins over their range
        and learn them all; after, learn each value as it comes."""
        early = self.early
        if early is None:
            self._follow(self._context_bin(value))
            return
        early.append(value)
        if len(early) < self.config.context_warmup:
            return
        lo, hi = min(early), max(early)
        self.origin = lo
        self.width = (hi - lo) / self.config.context_bins if hi > lo else max(abs(lo) * 0.01, 1e-6)
        self.early = None
        for v in early:
            self._follow(self._context_bin(v))

    def _follow(self, now: int) -> None:
        recent = tuple(self.recent_bins)
        for k in range(1, len(recent) + 1):
            seen = self.followers.get(recent[-k:])
            if seen is None:
                if len(self.followers) >= self.config.max_contexts:
                    continue
                seen = self.followers[recent[-k:]] = {}
            seen[now] = seen.get(now, 0) + 1
        self.recent_bins.append(now)

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


def _surprisal(mean: float) -> float:
    """``-ln(1 - mean)`` of a mean raw score in [0, 1]: unbounded as it nears 1 (capped at
    ``ln 10^4`` so a run of certain anomalies stays finite)."""
    return -math.log(max(1.0 - mean, 1e-4))


class WindowedGaussian:
    """The textbook baseline: the value's two-sided Gaussian tail against the mean and
    spread of the last ``window`` values (scored before learning, like every learner)."""

    def __init__(self, window: int = 6400) -> None:
        self.window = RollingMoments(window)

    def score_one(self, value: float, at: datetime | None = None) -> float:
        """The two-sided tail of ``value`` against the window; changes nothing."""
        del at
        if not math.isfinite(value) or len(self.window) < 2:
            return 0.0
        std = self.window.spread()
        if std <= 0:
            return 0.0
        return 1.0 - math.erfc(abs(value - self.window.mean()) / (std * math.sqrt(2.0)))

    def learn_one(self, value: float, at: datetime | None = None) -> None:
        del at
        if math.isfinite(value):
            self.window.add(value)
