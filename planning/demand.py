"""Demand forecasting and predictive warming: the planner.

:class:`DemandPlanner` sums the demand events of each (model, region) into steps
of ``step_s`` (event time). When a step ends it learns the step's request rate
into that key's :class:`~models.forecast.DemandForecaster`, forecasts every
horizon with its band, counts the replicas that served in the step (and those
it asked for that are still loading), and asks the key's
:class:`~controllers.warming.WarmingPolicy` what to do. A warm goes to the
pool that already serves the model in that region (most replicas), else to
``default_pool``; a cool to the pool with most replicas.

Every warm and cool passes the shared guardrail (:meth:`Guardrail.check_scaling`:
fail-static on stale demand; cools rate-limited per model and pool, and none
during a lockout); a refusal is a decision with the guardrail's reason.

``demand.plan`` (:mod:`streams.demand`) adapts it: demand and serving telemetry
in; forecasts on ``forecasts.v1``; a decision per warm or cool on
``decisions.v1``, with a signed ``WarmCommand`` for the warmer when a signing
key is configured.

One replica's capacity is the highest rate per replica the key's replicas
have carried so far (``replica_rps`` until they have carried any): a
conservative estimate that grows with the load the fleet has seen. A
replica's load time is per accelerator type (``load_s_by_accelerator``, the
pool name's last part; ``load_s`` for the rest): a warm for a pool is judged
on the forecast one of that pool's load times ahead, and every load time is
one of the horizons forecast.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter as Tally
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from controllers.guardrail import GuardDecision, Guardrail, GuardrailConfig
from controllers.warming import WarmDecision, WarmingConfig, WarmingPolicy
from models.forecast import DemandForecaster
from planning.issuing import IssuerWiring, Output, issue
from planning.registry import WARMING
from schemas.commands import Target, WarmAction, WarmCommand
from schemas.envelopes import AnyServingSample
from schemas.events import Demand
from schemas.verdicts import Decision, DecisionOutcome, Forecast

MAX_GAP_STEPS = 1440  # a day of one-minute steps: longer silences restart from where they end


@dataclass(frozen=True)
class DemandTuning:
    """The demand role's settings (``FLEETLOOP_DEMAND__*``, ``--demand.*``)."""

    step_s: float = 60.0
    horizons_s: tuple[float, ...] = (60.0, 300.0, 900.0)
    season_s: float = 86_400.0
    replica_rps: float = 10.0
    load_s: float = 60.0
    load_s_by_accelerator: Mapping[str, float] = field(default_factory=dict)
    pool_suffix: str = "h100"  # default pool of a region for a model served nowhere there
    warming: WarmingConfig = field(default_factory=WarmingConfig)

    def __post_init__(self) -> None:
        bad = {a: s for a, s in self.load_s_by_accelerator.items() if not s > 0}
        if bad or not self.load_s > 0:
            raise ValueError(f"load times are positive seconds: {bad or self.load_s!r}")

    def load_s_for(self, pool: str) -> float:
        """How long a replica takes to load in ``pool`` (``us-east-h100`` -> ``h100``'s)."""
        return self.load_s_by_accelerator.get(pool.rsplit("-", 1)[-1], self.load_s)


@dataclass(frozen=True)
class DemandWiring(DemandTuning, IssuerWiring):
    """The demand processor's wiring: its tuning and how it issues commands."""


@dataclass(slots=True)
class _Key:
    forecaster: DemandForecaster
    policy: WarmingPolicy
    step: int = -1
    requests: float = 0.0
    replicas: dict[str, set[str]] = field(default_factory=dict)  # pool -> replicas this step
    served: float = 0.0  # requests the replicas served this step
    capacity_rps: float = 0.0  # highest rate per replica seen so far: what one can carry
    loading: list[tuple[str, datetime]] = field(default_factory=list)  # (pool, ready by)


@dataclass(frozen=True, slots=True)
class WarmStep:
    model: str
    region: str
    pool: str
    at: datetime
    decision: WarmDecision
    guard: GuardDecision


class DemandPlanner:
    """Demand events into steps per (model, region); each closed step forecast, and the
    warms and cools it calls for, past the guardrail."""

    def __init__(
        self, wiring: DemandWiring, *, guard: Guardrail | None = None, new_id: Any = uuid.uuid4
    ) -> None:
        self.wiring = wiring
        self.guard = guard or Guardrail(GuardrailConfig(), devices={})
        self.new_id = new_id
        loads = (wiring.load_s, *wiring.load_s_by_accelerator.values())
        self.horizon_steps = tuple(
            sorted(
                {max(1, round(h / wiring.step_s)) for h in wiring.horizons_s}
                | {self._steps(s) for s in loads}
            )
        )
        self.keys: dict[tuple[str, str], _Key] = {}

    def _steps(self, seconds: float) -> int:
        return max(1, math.ceil(seconds / self.wiring.step_s))

    def _key(self, model: str, region: str) -> _Key:
        k = self.keys.get((model, region))
        if k is None:
            season = max(2, round(self.wiring.season_s / self.wiring.step_s))
            k = self.keys[(model, region)] = _Key(
                DemandForecaster(horizons=self.horizon_steps, season=season),
                WarmingPolicy(self.wiring.warming),
            )
        return k

    def serving(self, metrics: AnyServingSample) -> None:
        if metrics.requests > 0:
            k = self._key(metrics.model, metrics.region)
            k.replicas.setdefault(metrics.pool, set()).add(metrics.replica_id)
            k.served += metrics.requests

    def demand(
        self, demand: Demand, *, now: datetime | None = None
    ) -> tuple[list[Forecast], list[WarmStep]]:
        """One demand event; returns what closing a step produced (if one closed). ``now``
        (event time) judges how stale the step is; the step's end when not given."""
        k = self._key(demand.model, demand.region)
        step = int(demand.observed_at.timestamp() // self.wiring.step_s)
        forecasts: list[Forecast] = []
        steps: list[WarmStep] = []
        if k.step >= 0 and step > k.step:
            forecasts, steps = self._close(demand.model, demand.region, k, now)
            # steps without a single demand event had none: the series learns their zeros
            for gap in range(k.step + 1, min(step, k.step + 1 + MAX_GAP_STEPS)):
                k.step, k.requests = gap, 0.0
                more, more_steps = self._close(demand.model, demand.region, k, now)
                forecasts += more
                steps += more_steps
        if step >= k.step:
            if step > k.step:
                k.step, k.requests = step, 0.0
            k.requests += demand.requests
        return forecasts, steps

    def _close(
        self, model: str, region: str, key: _Key, now: datetime | None
    ) -> tuple[list[Forecast], list[WarmStep]]:
        wiring = self.wiring
        end = datetime.fromtimestamp((key.step + 1) * wiring.step_s, UTC)
        rps = key.requests / wiring.step_s
        key.forecaster.learn_one(rps)
        bands = key.forecaster.forecast()
        forecasts = [
            Forecast(
                forecast_id=self.new_id(),
                made_at=end,
                target_at=end + timedelta(seconds=h * wiring.step_s),
                model=model,
                region=region,
                horizon_s=h * wiring.step_s,
                step_s=wiring.step_s,
                observed_rps=rps,
                point_rps=b.point,
                low_rps=b.low,
                high_rps=b.high,
                chosen=b.model,
            )
            for h, b in bands.items()
        ]
        key.loading = [(p, ready) for p, ready in key.loading if ready > end]
        ready = sum(len(r) for r in key.replicas.values())
        by_pool = Tally({p: len(r) for p, r in key.replicas.items()})
        if ready:
            key.capacity_rps = max(key.capacity_rps, key.served / wiring.step_s / ready)
        key.replicas, key.served = {}, 0.0
        busiest = by_pool.most_common(1)[0][0] if by_pool else f"{region}-{wiring.pool_suffix}"
        load_s = wiring.load_s_for(busiest)
        d = key.policy.step(
            step=key.step, bands=bands, ready=ready, loading=len(key.loading),
            capacity=key.capacity_rps or wiring.replica_rps, load_steps=self._steps(load_s),
            observed=rps,
        )  # fmt: skip
        if d.replicas == 0:
            return forecasts, []
        guard = self.guard.check_scaling(
            f"{model}@{busiest}", remove=d.replicas < 0, now=now or end, telemetry_at=end
        )
        if d.replicas > 0 and guard.allowed:
            ready_by = end + timedelta(seconds=load_s * 2)
            key.loading += [(busiest, ready_by)] * d.replicas
        return forecasts, [WarmStep(model, region, busiest, end, d, guard)]


def decide_warm(
    step: WarmStep, wiring: DemandWiring, *, new_id: Any = uuid.uuid4
) -> Output[WarmCommand]:
    """One warm or cool -> its decision and, with a signing key, its command."""
    d = step.decision
    action = WarmAction.WARM if d.replicas > 0 else WarmAction.COOL
    decision_id = new_id()
    command = None
    if step.guard.allowed:
        deadline = step.at + timedelta(seconds=wiring.load_s_for(step.pool))
        command = issue(
            WarmCommand, wiring, by=WARMING, at=step.at, decision_id=decision_id, new_id=new_id,
            target=Target(pool=step.pool), reason=d.reason.value, message=d.message[:1024],
            action=action, model=step.model, replicas=abs(d.replicas),
            deadline_at=deadline if d.replicas > 0 else None,
        )  # fmt: skip
    decision = Decision(
        decision_id=decision_id,
        decided_at=step.at,
        controller=WARMING.name,
        target=f"{step.model}@{step.region}",
        pool=step.pool,
        action=action.value,
        outcome=(
            DecisionOutcome.REFUSED
            if not step.guard.allowed
            else DecisionOutcome.ADVISORY
            if command is None
            else DecisionOutcome.ISSUED
        ),
        reason=d.reason.value if step.guard.allowed else step.guard.reason.value,
        message=d.message if step.guard.allowed else f"{d.message}; {step.guard.message}",
        command_id=None if command is None else command.command_id,
        desired=float(d.desired),
        applied=float(d.replicas),
    )
    return Output(decision, command)
