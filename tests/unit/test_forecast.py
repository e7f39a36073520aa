"""Demand forecasts, the warming policy as scenario tables, and `fleetloop eval forecast`."""

from __future__ import annotations

import json
import math
import pickle
import random
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from agents.sim.fleet import poisson
from controllers.warming import WarmingConfig, WarmingPolicy, WarmReason, replicas_for
from evaluations.forecast_scoring import ForecastScore
from fleetloop.cli import main
from models.forecast import Band, DemandForecaster


def _seasonal(count: int, season: int = 24, seed: int = 5) -> list[float]:
    rng = random.Random(seed)
    return [
        max(0.0, 100 + 60 * math.sin(2 * math.pi * t / season) + rng.gauss(0, 4))
        for t in range(count)
    ]


def test_forecaster_contract() -> None:
    f = DemandForecaster(horizons=(1, 3), season=24)
    assert f.forecast() == {}  # usable before it has learned anything
    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(ValueError, match="non-negative"):
            f.learn_one(bad)
    series = _seasonal(200)
    for y in series:
        f.learn_one(y)
    bands = f.forecast()
    assert set(bands) == {1, 3}
    assert all(0.0 <= b.low <= b.point <= b.high for b in bands.values())
    clone = pickle.loads(pickle.dumps(f))
    assert clone.forecast() == bands  # state round-trips
    again = DemandForecaster(horizons=(1, 3), season=24)
    for y in series:
        again.learn_one(y)
    assert again.forecast() == bands  # deterministic


@pytest.mark.parametrize("learned", [0, 1, 2, 30, 60, 130])  # before, in and past the seasons
def test_a_recalled_forecaster_goes_on_as_the_one_remembered(learned: int) -> None:
    series = _seasonal(learned + 60, seed=11)
    first = DemandForecaster(horizons=(1, 3, 5), season=24, band_window=40)
    for y in series[:learned]:
        first.learn_one(y)
    taken = DemandForecaster(horizons=(1, 3, 5), season=24, band_window=40)
    taken.recall(json.loads(json.dumps(first.remember())))
    for y in series[learned:]:
        assert taken.forecast() == first.forecast()
        assert taken.candidate_forecasts() == first.candidate_forecasts()
        first.learn_one(y)
        taken.learn_one(y)
    assert taken.forecast() == first.forecast() and taken.n == first.n
    assert taken.remember() == first.remember()


def test_a_memory_of_other_settings_is_refused_not_misread() -> None:
    f = DemandForecaster(horizons=(1, 3), season=24)
    for y in _seasonal(80):
        f.learn_one(y)
    memory = f.remember()
    for other in (
        DemandForecaster(horizons=(1, 5), season=24),
        DemandForecaster(horizons=(1, 3), season=12),
        DemandForecaster(horizons=(1, 3), season=24, level_alphas=(0.2,)),
    ):
        with pytest.raises(ValueError):
            other.recall(memory)
    with pytest.raises(ValueError, match="not a forecaster's memory"):
        f.recall({"n": 3})


def test_on_a_seasonal_series_it_beats_both_naive_baselines() -> None:
    f = DemandForecaster(horizons=(1, 6), season=24)
    score = ForecastScore()
    pending: dict[int, list[tuple[str, int, float]]] = {}
    for t, y in enumerate(_seasonal(24 * 30)):
        for model, h, value in pending.pop(t, []):
            if t > 24 * 5:
                score.add(model, h, value, y)
        f.learn_one(y)
        candidates = f.candidate_forecasts()
        for h, band in f.forecast().items():
            pending.setdefault(t + h, []).append(("ours", h, band.point))
            for b in ("persistence", "seasonal_naive"):
                if b in candidates:
                    pending.setdefault(t + h, []).append((b, h, candidates[b][h]))
    assert score.mase("ours", 6) < 0.8  # a 20% margin over the better baseline
    assert f.best(6) in ("holt_winters", "seasonal_mean")


def _bands(high: float) -> dict[int, Band]:
    return {h: Band(high, high, high, "test") for h in (1, 5, 15)}


@pytest.mark.parametrize(
    ("high", "observed", "ready", "loading", "expected", "reason"),
    [
        (2500.0, 500.0, 1, 0, 4, WarmReason.FORECAST_RISE),  # 2500/600 -> 5 replicas ahead
        (500.0, 1900.0, 1, 0, 3, WarmReason.DEMAND_NOW),  # demand now needs 4
        (500.0, 500.0, 1, 0, 0, WarmReason.HOLD),  # enough
        (500.0, 500.0, 1, 3, 0, WarmReason.HOLD),  # loading replicas count
    ],
)
def test_warming_table(
    high: float, observed: float, ready: int, loading: int, expected: int, reason: WarmReason
) -> None:
    d = WarmingPolicy(WarmingConfig()).step(
        step=0, bands=_bands(high), ready=ready, loading=loading, capacity=600.0,
        load_steps=1, observed=observed,
    )  # fmt: skip
    assert (d.replicas, d.reason) == (expected, reason)


def test_cooling_waits_for_the_forecast_and_a_held_surplus() -> None:
    policy = WarmingPolicy(WarmingConfig(keep_steps=5, cool_after_steps=2))

    def step(index: int, bands: dict[int, Band]) -> int:
        return policy.step(step=index, bands=bands, ready=5, loading=0, capacity=600.0,
                           load_steps=1, observed=500.0).replicas  # fmt: skip

    rising_later = {1: Band(500, 400, 600, "m"), 5: Band(2500, 2000, 2900, "m"),
                    15: Band(100, 0, 200, "m")}  # fmt: skip
    assert step(0, rising_later) == 0  # the 5-step band still needs all five: keep them
    assert step(1, _bands(500.0)) == 0  # a surplus, held for one step only
    assert step(2, _bands(500.0)) == -4  # held for two: cool to what is needed


def test_budget_stops_prewarming_but_not_demand() -> None:
    policy = WarmingPolicy(WarmingConfig(budget_replica_steps=10))
    d = policy.step(step=0, bands=_bands(6000.0), ready=20, loading=0, capacity=600.0,
                    load_steps=1, observed=100.0)  # fmt: skip
    assert d.reason is not WarmReason.FORECAST_RISE
    d = policy.step(step=1, bands=_bands(6000.0), ready=0, loading=0, capacity=600.0,
                    load_steps=1, observed=1300.0)  # fmt: skip
    assert (d.replicas, d.reason) == (3, WarmReason.DEMAND_NOW)
    assert replicas_for(0.0, 600.0) == 0 and replicas_for(600.0, 600.0) == 1
    with pytest.raises(ValueError, match="capacity"):
        replicas_for(1.0, 0.0)


def test_the_smoothing_gain_is_chosen_by_error_not_fixed() -> None:
    rng = random.Random(4)
    noisy = DemandForecaster(horizons=(1,), season=1440)
    drifting = DemandForecaster(horizons=(1,), season=1440)
    level = 1000.0
    for _ in range(600):
        noisy.learn_one(float(poisson(rng, 400.0)))  # steady rate, counting noise only
        level = max(0.0, level + rng.gauss(0.0, 60.0))  # a random walk, little noise
        drifting.learn_one(level + rng.gauss(0.0, 2.0))
    assert noisy.best(1) == "level_0.1"
    assert drifting.best(1) in ("persistence", "level_0.6")
    with pytest.raises(ValueError, match="gains"):
        DemandForecaster(level_alphas=(1.5,))


@pytest.mark.parametrize("hours", [4, 1])  # one hour: too short for a seasonal baseline
def test_eval_forecast_on_an_azure_trace(
    hours: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(9)
    start = datetime(2023, 11, 16, 18, 0, 0)
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    t = 0.0
    while t < hours * 3600:  # a rate rising and falling every hour
        rate = 3.0 + 2.0 * math.sin(2 * math.pi * t / 3600)
        t += rng.expovariate(rate)
        rows.append(f"{start + timedelta(seconds=t):%Y-%m-%d %H:%M:%S.%f},{rng.randint(50, 900)},"
                    f"{rng.randint(10, 300)}")  # fmt: skip
    trace = tmp_path / "azure.csv"
    trace.write_text("\n".join(rows) + "\n")
    args = ["eval", "forecast", "--trace", str(trace), "--format", "azure-llm", "--json",
            "--replica-rps", "1"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("mase_5m", "smape_5m", "cold_start_fraction", "cold_start_fraction_keepalive",
                "idle_gpu_hours", "idle_gpu_hours_keepalive"):  # fmt: skip
        assert isinstance(out[key], float) and math.isfinite(out[key]), key
    assert 0.0 <= out["cold_start_fraction"] <= out["cold_start_fraction_reactive"]
    assert out["idle_gpu_hours_reactive"] <= out["idle_gpu_hours_keepalive"]
