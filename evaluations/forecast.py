"""`fleetloop eval forecast`: a request trace through the forecaster and three warming
policies, on a simulated clock.

The trace becomes requests per step per model (one-minute steps by default):
an Azure LLM trace is counted; a ServeGen rate file (10-minute windows) is
sampled as Poisson arrivals at each window's rate (seeded). Each series then
goes through the demand planner a worker runs (:class:`~planning.demand.DemandPlanner`,
built from worker settings); every forecast (ours, persistence, seasonal-naive)
is scored when its step arrives (:mod:`evaluations.forecast_scoring`). The same
series drives three policies over the same replica model (a replica serves
``replica_rps``, loads in ``load_s``): ours (the planner's warms and cools, past
its guardrail), a fixed 10-minute keep-alive, and a purely reactive one.
A request that finds no ready capacity is a cold start and waits for a load.
"""

from __future__ import annotations

import itertools
import math
import random
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from agents.sim.demand import AzureTraceDemand, RateCsvDemand
from agents.sim.fleet import poisson
from controllers.warming import replicas_for
from evaluations.forecast_scoring import ForecastScore
from fleetloop.settings import WorkerSettings
from fleetloop.wiring import demand_wiring
from planning.demand import DemandPlanner
from schemas.base import AcceleratorType
from schemas.events import Demand, ServingMetrics

BASELINES = ("persistence", "seasonal_naive")


def trace_counts(path: Path, fmt: str, *, step_s: float, seed: int = 7) -> dict[str, list[float]]:
    """Requests per step for each model in the trace."""
    if fmt == "azure-llm":
        demand = AzureTraceDemand(path, model="trace", region_shares={"all": 1.0}, step_s=step_s)
        # the last step ends at the last request, not at the step's end: it is partial
        counts = [rps * step_s for rps in demand.series["trace"].rps][:-1]
        if len(counts) < 2:
            raise ValueError(f"{path}: the trace spans less than two {step_s:g} s steps")
        return {"trace": counts}
    if fmt == "rate-csv":
        rates = RateCsvDemand(path, models=(), region_shares={"all": 1.0}, model_map=None)
        rng = random.Random(seed)
        out: dict[str, list[float]] = {}
        for model, series in sorted(rates.series.items()):
            # the file says only each window's mean rate: hold it through the window
            per_window = max(1, round(series.step_s / step_s))
            out[model] = [
                float(poisson(rng, rps * step_s)) for rps in series.rps for _ in range(per_window)
            ]
        return out
    raise ValueError(f"unknown trace format {fmt!r}: azure-llm or rate-csv")


@dataclass(slots=True)
class Replicas:
    """The replicas of one model: when each is (or will be) ready, and when it last served."""

    load_steps: int
    ready_at: list[int] = field(default_factory=list)
    last_used: list[int] = field(default_factory=list)

    def counts(self, now: int) -> tuple[int, int]:
        ready = sum(1 for r in self.ready_at if r <= now)
        return ready, len(self.ready_at) - ready

    def warm(self, replicas: int, now: int) -> None:
        for _ in range(replicas):
            self.ready_at.append(now + self.load_steps)
            self.last_used.append(now)

    def cool(self, replicas: int, now: int) -> None:
        """Let ``replicas`` go: loading ones first, then the longest idle."""
        order = sorted(
            range(len(self.ready_at)),
            key=lambda i: (self.ready_at[i] <= now, self.last_used[i]),
        )
        drop = set(order[:replicas])
        self.ready_at = [r for i, r in enumerate(self.ready_at) if i not in drop]
        self.last_used = [u for i, u in enumerate(self.last_used) if i not in drop]

    def serve(self, now: int, busy: int) -> None:
        ready = [i for i, r in enumerate(self.ready_at) if r <= now]
        for i in sorted(ready, key=lambda i: -self.last_used[i])[:busy]:
            self.last_used[i] = now


@dataclass(slots=True)
class PolicyResult:
    requests: float = 0.0
    cold: float = 0.0
    replica_steps: float = 0.0
    busy_steps: float = 0.0
    added_latency: list[tuple[float, float]] = field(default_factory=list)  # (seconds, count)
    actions: int = 0

    def merge(self, other: PolicyResult) -> None:
        self.requests += other.requests
        self.cold += other.cold
        self.replica_steps += other.replica_steps
        self.busy_steps += other.busy_steps
        self.added_latency += other.added_latency
        self.actions += other.actions

    def p99_added_latency_s(self) -> float:
        total = sum(n for _, n in self.added_latency) + (self.requests - self.cold)
        if total <= 0:
            return 0.0
        rank, seen = 0.99 * total, self.requests - self.cold  # warm requests add nothing
        if seen >= rank:
            return 0.0
        for seconds, n in sorted(self.added_latency):
            seen += n
            if seen >= rank:
                return seconds
        return max(s for s, _ in self.added_latency)


def _serve_step(
    replicas: Replicas, res: PolicyResult, step: int, demand: float, capacity: float, step_s: float
) -> None:
    ready, loading = replicas.counts(step)
    res.requests += demand
    cold = max(0.0, demand - ready * capacity)
    if cold > 0:
        pending = [x for x in replicas.ready_at if x > step]
        wait_steps = (min(pending) - step) if pending else replicas.load_steps
        res.cold += cold
        res.added_latency.append((wait_steps * step_s, cold))
    busy = min(ready, replicas_for(demand, capacity))
    replicas.serve(step, busy)
    res.replica_steps += ready + loading
    res.busy_steps += busy


EPOCH = datetime(2026, 1, 1, tzinfo=UTC)  # the trace's step 0 (a whole number of steps)


def production_settings(*, step_s: float, replica_rps: float, load_s: float) -> WorkerSettings:
    """The worker settings an operator would give this trace's models: the defaults, with
    the step, what one replica serves and how long it loads."""
    demand = {"step_s": step_s, "replica_rps": replica_rps, "load_s": load_s}
    return WorkerSettings(demand=demand)


def replay(
    series: list[float],
    *,
    step_s: float,
    replica_rps: float,
    load_s: float,
    keepalive_s: float,
    horizons: tuple[int, ...],
    season: int,
) -> tuple[ForecastScore, dict[str, PolicyResult]]:
    """One series through the demand planner a worker runs (ours) and two baselines.

    Ours is :class:`~planning.demand.DemandPlanner` built from worker settings by the
    worker's own wiring: each step it gets the step's demand as a ``Demand`` event and a
    serving report from each ready replica (the router spreads requests over all of
    them), closes the step, forecasts, and asks for warms and cools, which pass its
    guardrail and are applied to the replicas.
    """
    capacity = replica_rps * step_s
    load_steps = max(1, math.ceil(load_s / step_s))
    keep_steps = max(1, round(keepalive_s / step_s))
    planner = DemandPlanner(
        demand_wiring(production_settings(step_s=step_s, replica_rps=replica_rps, load_s=load_s))
    )
    model, region, pool = "trace-model", "trace", "trace-h100"
    score = ForecastScore()
    fleets = {name: Replicas(load_steps) for name in ("ours", "keepalive", "reactive")}
    results = {name: PolicyResult() for name in fleets}
    pending: dict[int, list[tuple[str, int, float]]] = {}
    # scored once the seasonal baseline exists; a trace too short for that is scored
    # after a warm-up of a quarter of it (at most an hour of one-minute steps)
    scored_from = (
        season + 1 if len(series) > 2 * season + max(horizons) else min(60, len(series) // 4)
    )
    ids = itertools.count()
    for t, demand in enumerate(series):
        for name_h, h, value in pending.pop(t, []):
            if t >= scored_from:
                score.add(name_h, h, value, demand)
        for name, r in fleets.items():
            _serve_step(r, results[name], t, demand, capacity, step_s)
        at = EPOCH + timedelta(seconds=t * step_s)
        ready = fleets["ours"].counts(t)[0]
        # the router spreads the step's requests over every ready replica; each serves
        # what it can (the rest are the cold starts counted above)
        served = round(min(demand / ready, capacity)) if ready else 0
        for j in range(ready):
            planner.serving(ServingMetrics(
                event_id=uuid.UUID(int=next(ids)), observed_at=at, replica_id=f"replica-{j}",
                node_id=f"node-{j}", model=model, pool=pool, region=region,
                accelerator_type=AcceleratorType.H100, interval_s=step_s, queue_depth=0,
                batch_size=1, tokens_per_s=0.0, requests=served, errors=0,
            ))  # fmt: skip
        planner.demand(_demand(next(ids), at, model, region, round(demand), step_s))
        # the next step's first event closes this one: forecasts, warms and cools
        nxt = at + timedelta(seconds=step_s)
        forecasts, steps = planner.demand(_demand(next(ids), nxt, model, region, 0, step_s))
        for f in forecasts:
            h = round(f.horizon_s / step_s)
            if h in horizons:
                pending.setdefault(t + h, []).append(("ours", h, f.point_rps * step_s))
        candidates = planner.keys[(model, region)].forecaster.candidate_forecasts()
        for h in horizons:
            for baseline in BASELINES:
                if baseline in candidates:
                    value = candidates[baseline][h] * step_s  # rps, as the planner learns
                    pending.setdefault(t + h, []).append((baseline, h, value))
        for step in steps:
            if step.guard.allowed:
                _apply(fleets["ours"], results["ours"], step.decision.replicas, t)
        need = replicas_for(demand, capacity)
        # fixed keep-alive: warm on demand, cool what has been idle for keepalive_s
        r = fleets["keepalive"]
        ready, loading = r.counts(t)
        _apply(r, results["keepalive"], max(0, need - ready - loading), t)
        idle = sum(
            1 for i, at_ in enumerate(r.ready_at) if at_ <= t and t - r.last_used[i] >= keep_steps
        )
        _apply(r, results["keepalive"], -idle, t)
        # reactive: exactly what demand needs now
        r = fleets["reactive"]
        ready, loading = r.counts(t)
        _apply(r, results["reactive"], need - ready - loading, t)
    return score, results


def _demand(
    number: int, at: datetime, model: str, region: str, requests: int, step_s: float
) -> Demand:
    return Demand(
        event_id=uuid.UUID(int=number), observed_at=at, model=model, region=region,
        interval_s=step_s, requests=requests, prompt_tokens=0, generated_tokens=0,
    )  # fmt: skip


def _apply(replicas: Replicas, res: PolicyResult, delta: int, step: int) -> None:
    if delta > 0:
        replicas.warm(delta, step)
        res.actions += 1
    elif delta < 0:
        replicas.cool(-delta, step)
        res.actions += 1


def run_eval_forecast(
    path: Path,
    fmt: str,
    *,
    step_s: float = 60.0,
    replica_rps: float = 10.0,
    load_s: float = 60.0,
    keepalive_s: float = 600.0,
    seed: int = 7,
) -> dict[str, Any]:
    """The whole evaluation as one JSON-able object: the forecasters' errors and each
    warming policy's cold starts and idle replica time on the trace."""
    horizons = tuple(max(1, round(m * 60 / step_s)) for m in (1, 5, 15))
    season = max(2, round(86_400 / step_s))
    total = ForecastScore()
    sums = {name: PolicyResult() for name in ("ours", "keepalive", "reactive")}
    per_model: dict[str, Any] = {}
    for model, series in trace_counts(path, fmt, step_s=step_s, seed=seed).items():
        score, results = replay(
            series, step_s=step_s, replica_rps=replica_rps, load_s=load_s,
            keepalive_s=keepalive_s, horizons=horizons, season=season,
        )  # fmt: skip
        total.merge(score)
        per_model[model] = {"steps": len(series), "forecast": score.table(horizons)}
        for name, res in results.items():
            sums[name].merge(res)
    step_h = step_s / 3600.0
    h1, h5, h15 = horizons
    out: dict[str, Any] = {
        "trace": str(path),
        "format": fmt,
        "step_s": step_s,
        "horizon_steps": {"1m": h1, "5m": h5, "15m": h15},
        "replica_rps": replica_rps,
        "load_s": load_s,
        "per_model": per_model,
    }
    for label, h in (("1m", h1), ("5m", h5), ("15m", h15)):
        out[f"mase_{label}"] = round(total.mase("ours", h), 4)
        out[f"smape_{label}"] = round(total.errors[("ours", h)].smape, 3)
        for b in BASELINES:
            if (b, h) in total.errors:
                out[f"smape_{label}_{b}"] = round(total.errors[(b, h)].smape, 3)
                out[f"mae_{label}_{b}"] = round(total.errors[(b, h)].mae, 4)
        out[f"mae_{label}"] = round(total.errors[("ours", h)].mae, 4)
    for name, suffix in (("ours", ""), ("keepalive", "_keepalive"), ("reactive", "_reactive")):
        s = sums[name]
        out[f"cold_start_fraction{suffix}"] = round(s.cold / s.requests, 6) if s.requests else 0.0
        out[f"idle_gpu_hours{suffix}"] = round((s.replica_steps - s.busy_steps) * step_h, 3)
        out[f"cold_start_p99_added_s{suffix}"] = s.p99_added_latency_s()
        out[f"warm_actions{suffix}"] = s.actions
    return out


def format_forecast(result: dict[str, Any]) -> str:
    lines = [f"forecast and warming on {result['trace']} ({result['format']})", ""]
    lines.append(f"{'horizon':<9}{'MASE':>8}{'sMAPE':>9}{'sMAPE persistence':>19}"
                 f"{'sMAPE seasonal':>16}")  # fmt: skip
    for label in ("1m", "5m", "15m"):
        lines.append(
            f"{label:<9}{result[f'mase_{label}']!s:>8}{result[f'smape_{label}']!s:>9}"
            f"{result.get(f'smape_{label}_persistence', '-')!s:>19}"
            f"{result.get(f'smape_{label}_seasonal_naive', '-')!s:>16}"
        )
    lines += ["", f"{'policy':<22}{'cold starts':>12}{'p99 added s':>12}{'idle GPU-h':>12}"]
    for name, suffix in (("ours (forecast)", ""), ("fixed 10-min keep-alive", "_keepalive"),
                         ("reactive", "_reactive")):  # fmt: skip
        lines.append(
            f"{name:<22}{result[f'cold_start_fraction{suffix}']:>12.4%}"
            f"{result[f'cold_start_p99_added_s{suffix}']:>12.0f}"
            f"{result[f'idle_gpu_hours{suffix}']:>12.1f}"
        )
    lines.append("MASE: our MAE over the better naive baseline's at that horizon (< 1 beats both)")
    return "\n".join(lines)
