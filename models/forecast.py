"""Online demand forecasts, several models chosen by their recent error, with a band.

:class:`DemandForecaster` follows one series (requests per step for one model in
one region, say) and forecasts it ``h`` steps ahead for each horizon in
``horizons``. Candidates, all learned online:

- ``persistence``: the last value;
- ``seasonal_naive``: the value one season ago (a day of steps by default);
- ``seasonal_mean``: each phase of the season's exponentially weighted mean
  over past seasons (a seasonal naive forecast with its noise averaged out);
- ``holt_winters``: river's additive Holt-Winters (with the season once the
  series has shown a whole one, Holt's linear trend before that);
- ``level_<alpha>``: exponentially weighted means at several gains
  (``level_alphas``): between persistence (gain 1) and a long mean, the gain
  that suits the series' noise against its drift is found by the same online
  choice rather than fixed.

Every forecast is kept until its target step arrives and then scored; each
candidate's recent absolute error per horizon is an exponentially weighted
mean, and the forecast at a horizon comes from the candidate with the lowest
(chosen online, per horizon). The band is the chosen candidate's recent
signed errors at that horizon: rolling ``band_quantiles`` (10th and 90th
percentiles by default) added to the point forecast, never below zero.

Scores before it learns; picklable; time is the step index. :meth:`~DemandForecaster.remember`
writes what it learned as plain values and :meth:`~DemandForecaster.recall` reads them
back into a forecaster made with the same settings, which then forecasts exactly as the
one remembered would have (a process that takes a series over from another goes on with
its memory).

Example::

    f = DemandForecaster(horizons=(1, 5, 15), season=1440)
    for count in per_minute_counts:
        f.learn_one(count)
        band = f.forecast()[5]     # Band(point, low, high, model) five steps ahead
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from river import stats, time_series

BASE_CANDIDATES = ("persistence", "seasonal_naive", "seasonal_mean", "holt_winters")


@dataclass(frozen=True, slots=True)
class Band:
    point: float
    low: float
    high: float
    model: str


class DemandForecaster:
    """Learns one demand series step by step and forecasts each horizon with a band, from
    the candidate with the lowest recent error at that horizon."""

    def __init__(
        self,
        *,
        horizons: tuple[int, ...] = (1, 5, 15),
        season: int = 1440,
        error_alpha: float = 0.01,
        band_quantiles: tuple[float, float] = (0.1, 0.9),
        band_window: int = 500,
        hw_alpha: float = 0.3,
        hw_beta: float = 0.01,
        hw_gamma: float = 0.2,
        level_alphas: tuple[float, ...] = (0.1, 0.3, 0.6),
    ) -> None:
        if not horizons or min(horizons) < 1:
            raise ValueError(f"horizons are steps ahead, at least 1: {horizons!r}")
        self.horizons = tuple(sorted(set(horizons)))
        self.season = season
        self.error_alpha = error_alpha
        if not all(0.0 < a < 1.0 for a in level_alphas):
            raise ValueError(f"level gains are in (0, 1): {level_alphas!r}")
        self.level_alphas = tuple(level_alphas)
        self.candidates = (*BASE_CANDIDATES, *(f"level_{a:g}" for a in self.level_alphas))
        self.hw_params = (hw_alpha, hw_beta, hw_gamma)
        self.n = 0
        self.history: deque[float] = deque(maxlen=max(season, max(self.horizons)) + 1)
        self.levels = [0.0] * len(self.level_alphas)
        self.season_alpha = 0.3
        self.phase_mean: list[float] = []  # per phase of the season, once one has passed
        # river's time series models are untyped: kept as Any at this one boundary
        self._hw_trend: Any = _holt_winters(alpha=hw_alpha, beta=hw_beta)
        self._hw_season: Any = None
        self.errors = {(m, h): math.nan for m in self.candidates for h in self.horizons}
        lo, hi = band_quantiles
        self.band_quantiles = (lo, hi)
        self.band_window = band_window
        self.residuals = {(m, h): self._band() for m in self.candidates for h in self.horizons}
        # the same signed errors as they came (the rolling quantiles keep theirs out of
        # reach): what remembering the bands takes
        self.recent: dict[tuple[str, int], deque[float]] = {
            (m, h): deque(maxlen=band_window) for m in self.candidates for h in self.horizons
        }
        # forecasts made, waiting for their target step: step -> [(model, horizon, value)]
        self.pending: dict[int, list[tuple[str, int, float]]] = {}

    # -- learning -----------------------------------------------------------------------

    def learn_one(self, demand: float) -> None:
        """The value of the next step arrived: score what was forecast for it, then learn."""
        if not math.isfinite(demand) or demand < 0:
            raise ValueError(f"a demand is a finite non-negative number, not {demand!r}")
        step = self.n
        for model, h, value in self.pending.pop(step, []):
            self._score(model, h, value, demand)
        self.history.append(demand)
        if self.season > 1:
            phase = self.n % self.season
            if len(self.phase_mean) < self.season:
                self.phase_mean.append(demand)
            else:
                self.phase_mean[phase] += self.season_alpha * (demand - self.phase_mean[phase])
        for i, a in enumerate(self.level_alphas):
            self.levels[i] = (
                demand if self.n == 0 else self.levels[i] + a * (demand - self.levels[i])
            )
        self._hw_trend.learn_one(demand)
        if self._hw_season is None and self.season > 1 and self.n + 1 >= 2 * self.season:
            # a whole season seen twice: start the seasonal model on it (river's needs one)
            self._hw_season = _holt_winters(
                alpha=self.hw_params[0],
                beta=self.hw_params[1],
                gamma=self.hw_params[2],
                seasonality=self.season,
            )
            for past in list(self.history)[-self.season - 1 :]:
                self._hw_season.learn_one(past)
        elif self._hw_season is not None:
            self._hw_season.learn_one(demand)
        self.n += 1
        for model, values in self._candidates().items():
            for h, value in values.items():
                self.pending.setdefault(self.n - 1 + h, []).append((model, h, value))

    def _score(self, model: str, horizon: int, forecast: float, actual: float) -> None:
        err = abs(actual - forecast)
        old = self.errors[(model, horizon)]
        self.errors[(model, horizon)] = (
            err if math.isnan(old) else old + self.error_alpha * (err - old)
        )
        lo, hi = self.residuals[(model, horizon)]
        lo.update(actual - forecast)
        hi.update(actual - forecast)
        self.recent[(model, horizon)].append(actual - forecast)

    def _band(self) -> tuple[Any, Any]:
        lo, hi = self.band_quantiles
        return (
            stats.RollingQuantile(q=lo, window_size=self.band_window),
            stats.RollingQuantile(q=hi, window_size=self.band_window),
        )

    # -- memory ---------------------------------------------------------------------------

    def remember(self) -> dict[str, Any]:
        """What it has learned, as JSON-able values (a non-finite number as ``None``)."""
        return {
            "n": self.n,
            "history": list(self.history),
            "levels": list(self.levels),
            "phase_mean": list(self.phase_mean),
            "errors": [[m, h, _plain(e)] for (m, h), e in self.errors.items()],
            "recent": [[m, h, list(errs)] for (m, h), errs in self.recent.items() if errs],
            "pending": [
                [step, [[m, h, v] for m, h, v in made]] for step, made in self.pending.items()
            ],
            "hw_trend": _remember_hw(self._hw_trend),
            "hw_season": None if self._hw_season is None else _remember_hw(self._hw_season),
        }

    def recall(self, memory: dict[str, Any]) -> None:
        """Take up what :meth:`remember` wrote (by a forecaster with the same settings).
        Raises ``ValueError`` on a memory of other settings (horizons, season, candidates)
        or of another shape: better to learn afresh than to forecast from a misread one."""
        try:
            errors = {(m, int(h)): math.nan if e is None else float(e)
                      for m, h, e in memory["errors"]}  # fmt: skip
            if set(errors) != set(self.errors):
                raise ValueError("remembered with other candidates or horizons")
            history = [float(v) for v in memory["history"]]
            phase_mean = [float(v) for v in memory["phase_mean"]]
            if len(phase_mean) > self.season or len(history) > (self.history.maxlen or 0):
                raise ValueError("remembered with another season")
            levels = [float(v) for v in memory["levels"]]
            if len(levels) != len(self.levels):
                raise ValueError("remembered with other level gains")
            recent = {(m, int(h)): [float(v) for v in errs] for m, h, errs in memory["recent"]}
            pending = {
                int(step): [(m, int(h), float(v)) for m, h, v in made]
                for step, made in memory["pending"]
            }
            season = memory["hw_season"]
            hw_season = None
            if season is not None:
                hw_season = _holt_winters(
                    alpha=self.hw_params[0], beta=self.hw_params[1], gamma=self.hw_params[2],
                    seasonality=self.season,
                )  # fmt: skip
                _recall_hw(hw_season, season)
            hw_trend = _holt_winters(alpha=self.hw_params[0], beta=self.hw_params[1])
            _recall_hw(hw_trend, memory["hw_trend"])
            n = int(memory["n"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a forecaster's memory: {exc!r}") from exc
        self.n, self.levels, self.phase_mean, self.errors = n, levels, phase_mean, errors
        self.history.clear()
        self.history.extend(history)
        self.pending = pending
        self._hw_trend, self._hw_season = hw_trend, hw_season
        for slot in self.residuals:
            self.residuals[slot] = lo, hi = self._band()
            self.recent[slot].clear()
            for err in recent.get(slot, ()):
                lo.update(err)
                hi.update(err)
                self.recent[slot].append(err)

    # -- forecasting ----------------------------------------------------------------------

    def _candidates(self) -> dict[str, dict[int, float]]:
        if self.n == 0:
            return {}
        last = self.history[-1]
        out: dict[str, dict[int, float]] = {
            "persistence": {h: last for h in self.horizons},
        }
        for name, value in zip(self.candidates[len(BASE_CANDIDATES) :], self.levels, strict=True):
            out[name] = {h: value for h in self.horizons}
        if self.season > 1 and len(self.history) > self.season:
            hist = self.history
            # the value one season before the target step (or the latest we have)
            out["seasonal_naive"] = {
                h: hist[len(hist) - 1 - self.season + h] if h <= self.season else last
                for h in self.horizons
            }
        if self.season > 1 and self.n >= 2 * self.season:
            out["seasonal_mean"] = {
                h: self.phase_mean[(self.n - 1 + h) % self.season] for h in self.horizons
            }
        hw = self._hw_season if self._hw_season is not None else self._hw_trend
        if self.n >= 3:
            ahead = hw.forecast(horizon=max(self.horizons))
            out["holt_winters"] = {h: max(0.0, float(ahead[h - 1])) for h in self.horizons}
        return out

    def best(self, horizon: int) -> str:
        """The candidate with the lowest recent error at horizon ``horizon`` (persistence until
        any has been scored)."""
        scored = [
            (e, m) for (m, hh), e in self.errors.items() if hh == horizon and not math.isnan(e)
        ]
        return min(scored)[1] if scored else "persistence"

    def forecast(self) -> dict[int, Band]:
        """Per horizon: the chosen model's point forecast and its band."""
        if self.n == 0:
            return {}
        candidates = self._candidates()
        out = {}
        for h in self.horizons:
            model = self.best(h)
            values = candidates.get(model) or candidates["persistence"]
            point = values[h]
            lo, hi = self.residuals[(model, h)]
            low_err, high_err = lo.get(), hi.get()
            low = point + (low_err if low_err is not None else 0.0)
            high = point + (high_err if high_err is not None else 0.0)
            out[h] = Band(point, max(0.0, min(low, point)), max(high, point), model)
        return out

    def candidate_forecasts(self) -> dict[str, dict[int, float]]:
        """Every candidate's point forecasts (for evaluation against the baselines)."""
        return self._candidates()


def _holt_winters(**params: Any) -> Any:
    return time_series.HoltWinters(**params)  # type: ignore[no-untyped-call]


def _plain(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _remember_hw(model: Any) -> dict[str, Any]:
    """A river Holt-Winters' state: its components (bounded deques) and its first values."""
    return {
        "level": list(model.level),
        "trend": None if model.trend is None else list(model.trend),
        "season": None if model.season is None else list(model.season),
        "first": list(model._first_values),
        "initialized": bool(model._initialized),
    }


def _recall_hw(model: Any, memory: dict[str, Any]) -> None:
    """Put :func:`_remember_hw`'s state into a Holt-Winters made with the same settings."""
    for name in ("level", "trend", "season"):
        part, values = getattr(model, name), memory[name]
        if (part is None) != (values is None):
            raise ValueError(f"Holt-Winters remembered with another {name}")
        if part is not None:
            part.clear()
            part.extend(float(v) for v in values)
    model._first_values = [float(v) for v in memory["first"]]
    model._initialized = bool(memory["initialized"])
