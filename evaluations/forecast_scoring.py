"""Score forecasts against what happened: MAE, MASE against the naive baselines, sMAPE.

``MASE`` here is scaled by the best naive baseline *at the same horizon, on the
same steps*: ``MAE(model, h) / min(MAE(persistence, h), MAE(seasonal_naive, h))``,
so below 1 beats both baselines, and 0.8 beats the better one by 20%.
``sMAPE`` is ``100 * mean(2 |F - A| / (|F| + |A|))`` over steps where either is
non-zero.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass(slots=True)
class HorizonErrors:
    """Running sums for one (model, horizon)."""

    n: int = 0
    abs_sum: float = 0.0
    smape_sum: float = 0.0
    smape_n: int = 0

    def add(self, forecast: float, actual: float) -> None:
        self.n += 1
        self.abs_sum += abs(forecast - actual)
        denominator = abs(forecast) + abs(actual)
        if denominator > 0:
            self.smape_sum += 2.0 * abs(forecast - actual) / denominator
            self.smape_n += 1

    def merge(self, other: HorizonErrors) -> None:
        self.n += other.n
        self.abs_sum += other.abs_sum
        self.smape_sum += other.smape_sum
        self.smape_n += other.smape_n

    @property
    def mae(self) -> float:
        return self.abs_sum / self.n if self.n else math.nan

    @property
    def smape(self) -> float:
        return 100.0 * self.smape_sum / self.smape_n if self.smape_n else math.nan


@dataclass(slots=True)
class ForecastScore:
    errors: dict[tuple[str, int], HorizonErrors] = field(
        default_factory=lambda: defaultdict(HorizonErrors)
    )

    def add(self, model: str, horizon: int, forecast: float, actual: float) -> None:
        self.errors[(model, horizon)].add(forecast, actual)

    def merge(self, other: ForecastScore) -> None:
        """Add ``other``'s errors (another series) to these."""
        for key, e in other.errors.items():
            self.errors[key].merge(e)

    def mase(self, model: str, horizon: int) -> float:
        naive = [
            self.errors[(b, horizon)].mae
            for b in ("persistence", "seasonal_naive")
            if (b, horizon) in self.errors and self.errors[(b, horizon)].n
        ]
        best = min(naive) if naive else math.nan
        return self.errors[(model, horizon)].mae / best if best and best > 0 else math.nan

    def table(self, horizons: tuple[int, ...]) -> dict[str, dict[str, float]]:
        """Per model and horizon: MAE, sMAPE and MASE (rounded)."""
        out: dict[str, dict[str, float]] = {}
        for (model, h), e in sorted(self.errors.items()):
            if h not in horizons:
                continue
            row = out.setdefault(model, {})
            row[f"mae_{h}"] = round(e.mae, 4)
            row[f"smape_{h}"] = round(e.smape, 3)
            row[f"mase_{h}"] = round(self.mase(model, h), 4)
        return out
