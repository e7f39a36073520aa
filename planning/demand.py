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

What served in a step comes as :class:`~schemas.derived.ServingStep` records: per
(model, region, pool) and per source (a partition of the serving telemetry), the
replicas that served requests in the step and the requests they served, so far.
:class:`ServingSteps` makes them from serving samples. In the worker they are a
repartition: ``demand.serving`` reads the serving telemetry (keyed by node, split
over every process that runs the role) and sends them keyed by model and region,
and ``demand.plan`` reads them with the demand (the same key, the same
partitions), so each (model, region) is planned by one process that hears every
partition's part. Within a step a source's later record counts at least as much
as an earlier one, and the planner keeps the largest: a copy or a replay changes
nothing. In one process, :meth:`DemandPlanner.serving` runs the same two steps.

``demand.plan`` (:mod:`streams.demand`) adapts it: demand and serving steps in;
forecasts on ``forecasts.v1``; a decision per warm or cool on
``decisions.v1``, with a signed ``WarmCommand`` for the warmer when a signing
key is configured.

One replica's capacity is the highest rate per replica the key's replicas
have carried in a step so far (``replica_rps`` until they have carried any): a
conservative estimate that grows with the load the fleet has seen. A close
reads the step it closes as far as its counts have come (in the worker, at
most one report interval short) and the step before, whole by then. A
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

from controllers.clock import instant
from controllers.guardrail import GuardDecision, Guardrail, GuardrailConfig
from controllers.warming import WarmDecision, WarmingConfig, WarmingPolicy
from models.forecast import DemandForecaster
from planning.issuing import IssuerWiring, Output, issue
from planning.registry import WARMING
from schemas.commands import Target, WarmAction, WarmCommand
from schemas.derived import ServingStep
from schemas.envelopes import AnyServingSample, ReplicaSample, ServingTick
from schemas.events import Demand
from schemas.verdicts import Decision, DecisionOutcome, Forecast

MAX_GAP_STEPS = 1440  # a day of one-minute steps: longer silences restart from where they end
LOCAL = "local"  # the source of serving samples fed in one process (DemandPlanner.serving)


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
    memory_every_s: float = 60.0  # how often each key's planner state is kept (state.demand.v1)
    # how long past a step's end its close waits for a serving source that served the key
    # in it or the step before and has not yet reported a later step: the lag at which a
    # serving partition is taken as gone rather than behind (a warm waits at most this)
    close_wait_s: float = 10.0
    warming: WarmingConfig = field(default_factory=WarmingConfig)

    def __post_init__(self) -> None:
        bad = {a: s for a, s in self.load_s_by_accelerator.items() if not s > 0}
        if bad or not self.load_s > 0:
            raise ValueError(f"load times are positive seconds: {bad or self.load_s!r}")
        if not 0 <= self.close_wait_s < math.inf:
            raise ValueError(f"close_wait_s is finite seconds >= 0: {self.close_wait_s!r}")

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
    step: int = -1  # the oldest step not closed yet
    requests: float = 0.0  # its demand
    ahead: dict[int, float] = field(default_factory=dict)  # later steps' demand, while it waits
    latest_s: float = -math.inf  # event time of the newest demand heard
    # step -> (source, pool) -> (replicas that served, requests served): the largest heard
    served: dict[int, dict[tuple[str, str], tuple[int, int]]] = field(default_factory=dict)
    capacity_rps: float = 0.0  # highest rate per replica seen so far: what one can carry
    closed: tuple[int, dict[str, int]] = (-1, {})  # the last step closed, its replicas by pool
    loading: list[tuple[str, datetime]] = field(default_factory=list)  # (pool, ready by)
    scopes: set[str] = field(default_factory=set)  # the guardrail scopes it was scaled in


@dataclass(frozen=True, slots=True)
class WarmStep:
    model: str
    region: str
    pool: str
    at: datetime
    decision: WarmDecision
    guard: GuardDecision


@dataclass(slots=True)
class _Open:
    """What one source has seen of one (model, region, pool) in its current step."""

    step: int
    observed_s: float  # event time of the newest sample counted
    observed_at: datetime  # the same, as it came
    replicas: set[str] = field(default_factory=set)
    requests: int = 0
    sent: tuple[int, int] = (-1, -1)  # (replicas, requests) last sent
    sent_s: float = -math.inf  # event time of the last sent


def _count(
    entry: _Open, replica: AnyServingSample | ReplicaSample, at_s: float, at: datetime
) -> None:
    """One replica's report into ``entry``: it served if it served a request."""
    if replica.requests > 0:
        entry.replicas.add(replica.replica_id)
        entry.requests += replica.requests
    if at_s > entry.observed_s:
        entry.observed_s, entry.observed_at = at_s, at


class ServingSteps:
    """Serving samples into :class:`ServingStep` records: per source (a partition of the
    serving telemetry), per (model, region, pool), per demand step of ``step_s``.

    :meth:`tick` (a node-tick envelope, whole) and :meth:`add` (one sample) count into
    the step the samples' own event time says (a sample older than its entry's step is
    late and counted nowhere: ``late`` counts them). :meth:`flush` returns the records
    that changed: at once when a replica count moved or a step ended; when only requests
    grew, at most once per ``report_every_s`` of event time (by default a twelfth of a
    step: a planner closing a step before its last record has come reads its requests at
    most that share short, never a replica; a dozen records a step, not one a batch)."""

    def __init__(self, step_s: float, *, report_every_s: float | None = None) -> None:
        self.step_s = step_s
        self.report_every_s = step_s / 12 if report_every_s is None else report_every_s
        self.open: dict[tuple[str, str, str, str], _Open] = {}  # (source, model, region, pool)
        self.closed: list[ServingStep] = []  # ended steps' last records, not yet flushed
        self.late = 0

    def tick(self, tick: ServingTick, source: str) -> None:
        """Every replica of one node-tick envelope (its header read once)."""
        at, region = tick.observed_at, tick.region
        at_s = at.timestamp()
        step = int(at_s // self.step_s)
        for replica in tick.samples:
            entry = self._entry((source, replica.model, region, replica.pool), step, at_s, at)
            if entry is not None:
                _count(entry, replica, at_s, at)

    def add(self, sample: AnyServingSample, source: str) -> None:
        """One replica's sample (a v1 message, or a view of an envelope's)."""
        at = sample.observed_at
        at_s = at.timestamp()
        slot = (source, sample.model, sample.region, sample.pool)
        entry = self._entry(slot, int(at_s // self.step_s), at_s, at)
        if entry is not None:
            _count(entry, sample, at_s, at)

    def _entry(
        self, slot: tuple[str, str, str, str], step: int, at_s: float, at: datetime
    ) -> _Open | None:
        """``slot``'s entry for ``step`` (a sample of ``at`` comes): a later step ends the
        one open (its last record goes out with the next flush); None for an earlier one
        (late)."""
        entry = self.open.get(slot)
        if entry is None or step > entry.step:
            if entry is not None and entry.sent != (len(entry.replicas), entry.requests):
                self.closed.append(self._record(slot, entry))
            entry = self.open[slot] = _Open(step, at_s, at)
        elif step < entry.step:
            self.late += 1
            return None
        return entry

    def flush(self, *, force: bool = False) -> list[ServingStep]:
        """The records due: every ended step's last, and each open entry that changed (its
        replica count at once; its requests once ``report_every_s`` has passed, or with
        ``force``)."""
        out, self.closed = self.closed, []
        every = self.report_every_s
        for slot, entry in self.open.items():
            replicas = len(entry.replicas)
            if replicas == entry.sent[0] and entry.requests == entry.sent[1]:
                continue
            if force or replicas != entry.sent[0] or entry.observed_s - entry.sent_s >= every:
                out.append(self._record(slot, entry))
        return out

    def release(self, sources: set[str]) -> None:
        """Forget what ``sources`` were counting (their partitions moved elsewhere)."""
        self.open = {k: v for k, v in self.open.items() if k[0] not in sources}

    def _record(self, slot: tuple[str, str, str, str], entry: _Open) -> ServingStep:
        source, model, region, pool = slot
        entry.sent = (len(entry.replicas), entry.requests)
        entry.sent_s = entry.observed_s
        return ServingStep(
            model=model, region=region, pool=pool,
            step_at=datetime.fromtimestamp(entry.step * self.step_s, UTC), step_s=self.step_s,
            source=source, replicas=entry.sent[0], requests=entry.sent[1],
            observed_at=entry.observed_at,
        )  # fmt: skip


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
        # serving samples fed here, in one process: every change reported as it comes
        self.local = ServingSteps(wiring.step_s, report_every_s=0.0)
        self.closed_short = 0  # steps closed at close_wait_s without a source that served

    def _steps(self, seconds: float) -> int:
        return max(1, math.ceil(seconds / self.wiring.step_s))

    def _key(self, model: str, region: str) -> _Key:
        k = self.keys.get((model, region))
        if k is None:
            k = self.keys[(model, region)] = self._new_key()
        return k

    def _new_key(self) -> _Key:
        season = max(2, round(self.wiring.season_s / self.wiring.step_s))
        return _Key(
            DemandForecaster(horizons=self.horizon_steps, season=season),
            WarmingPolicy(self.wiring.warming),
        )

    def serving(self, metrics: AnyServingSample) -> None:
        """One replica's serving report, in one process: through :class:`ServingSteps` into
        :meth:`serving_step`, as the worker's two stages do."""
        self.local.add(metrics, LOCAL)
        for record in self.local.flush():
            self.serving_step(record)

    def release(self, keys: set[tuple[str, str]]) -> None:
        """Forget ``keys`` (model, region): another process plans them now."""
        for k in keys:
            self.keys.pop(k, None)

    def remember(self, model: str, region: str) -> dict[str, Any]:
        """What the planner holds of ``(model, region)`` as JSON-able values: its forecaster's
        memory, the warming policy's, the step open and what it has counted of it, the
        demand of later steps while it waits, the serving counts held, the capacity learned
        and the replicas still loading."""
        k = self.keys[(model, region)]
        return {
            "forecaster": k.forecaster.remember(),
            "policy": {"surplus_since": k.policy.surplus_since,
                       "spent_replica_steps": k.policy.spent_replica_steps},
            "step": k.step, "requests": k.requests, "capacity_rps": k.capacity_rps,
            "ahead": [[step, requests] for step, requests in k.ahead.items()],
            "latest_s": k.latest_s if math.isfinite(k.latest_s) else None,
            "served": [[step, source, pool, replicas, requests]
                       for step, parts in k.served.items()
                       for (source, pool), (replicas, requests) in parts.items()],
            "closed": [k.closed[0], k.closed[1]],
            "loading": [[pool, ready.isoformat()] for pool, ready in k.loading],
            "cools": {scope: [at.isoformat() for at in self.guard.cools(scope)]
                      for scope in sorted(k.scopes)},
        }  # fmt: skip

    def recall(self, model: str, region: str, memory: dict[str, Any]) -> None:
        """Plan ``(model, region)`` from what :meth:`remember` wrote (a process that held it
        before): going on from there gives what that process would have. Raises
        ``ValueError`` on a memory this planner cannot read (other settings); the key is
        then left as it was."""
        fresh = self._new_key()
        try:
            fresh.forecaster.recall(memory["forecaster"])
            policy = memory["policy"]
            since = policy["surplus_since"]
            fresh.policy.surplus_since = None if since is None else int(since)
            fresh.policy.spent_replica_steps = float(policy["spent_replica_steps"])
            fresh.step, fresh.requests = int(memory["step"]), float(memory["requests"])
            fresh.capacity_rps = float(memory["capacity_rps"])
            fresh.ahead = {int(step): float(n) for step, n in memory.get("ahead", [])}
            latest = memory.get("latest_s")
            fresh.latest_s = -math.inf if latest is None else float(latest)
            for step, source, pool, replicas, requests in memory["served"]:
                parts = fresh.served.setdefault(int(step), {})
                parts[(str(source), str(pool))] = (int(replicas), int(requests))
            closed, by_pool = memory["closed"]
            fresh.closed = (int(closed), {str(p): int(n) for p, n in by_pool.items()})
            fresh.loading = [(str(p), datetime.fromisoformat(at)) for p, at in memory["loading"]]
            cools = {
                str(scope): [instant(at) for at in times]
                for scope, times in memory.get("cools", {}).items()
            }
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a demand key's memory: {exc!r}") from exc
        for scope, times in cools.items():  # the cools its last planner's guardrail allowed
            fresh.scopes.add(scope)
            self.guard.add_cools(scope, times)
        self.keys[(model, region)] = fresh

    def serving_step(self, record: ServingStep) -> bool:
        """What a source saw a (model, region, pool) serve in a step so far: kept, per
        source and pool, as the largest heard (a copy or a replay changes nothing).
        False for a record of another step length (a stage with other settings): not
        counted."""
        if record.step_s != self.wiring.step_s:
            return False
        k = self._key(record.model, record.region)
        step = int(record.step_at.timestamp() // self.wiring.step_s)
        if step < k.step - 1:
            return True  # nothing reads a step closed before the last any more
        parts = k.served.setdefault(step, {})
        slot = (record.source, record.pool)
        replicas, requests = parts.get(slot, (0, 0))
        parts[slot] = (max(replicas, record.replicas), max(requests, record.requests))
        # a model served with no demand closes no step: keep the steps a close may still
        # read (the one closing, the one before, and those heard while it waits)
        span = 3 + math.ceil(self.wiring.close_wait_s / self.wiring.step_s)
        if len(k.served) > span:
            newest = max(k.served)
            k.served = {s: p for s, p in k.served.items() if s > newest - span}
        return True

    def demand(
        self, demand: Demand, *, now: datetime | None = None
    ) -> tuple[list[Forecast], list[WarmStep]]:
        """One demand event; returns what closing steps produced (if any closed). ``now``
        (event time) judges how stale a step is; its end when not given.

        A step closes once demand of a later step has come and every serving source that
        served the key in it or the step before has reported a later step (so its count
        of this one is whole), or once the demand's event time is ``close_wait_s`` past
        the step's end without them (a partition that far behind is taken as gone). In
        one process (:meth:`serving`) samples come in order with the demand: nothing is
        waited for. Demand of a step already closed is not counted."""
        k = self._key(demand.model, demand.region)
        at_s = demand.observed_at.timestamp()
        step = int(at_s // self.wiring.step_s)
        if k.step < 0:
            k.step = step
        if step == k.step:
            k.requests += demand.requests
        elif step > k.step:
            k.ahead[step] = k.ahead.get(step, 0.0) + demand.requests
        k.latest_s = max(k.latest_s, at_s)
        forecasts: list[Forecast] = []
        steps: list[WarmStep] = []
        gaps = 0  # steps without a single demand event had none: the series learns zeros
        while k.ahead and self._may_close(k):
            more, more_steps = self._close(demand.model, demand.region, k, now)
            forecasts += more
            steps += more_steps
            following = k.step + 1
            gaps = 0 if following in k.ahead else gaps + 1
            if gaps > MAX_GAP_STEPS:  # a longer silence restarts from where it ends
                following, gaps = min(k.ahead), 0
            k.step, k.requests = following, k.ahead.pop(following, 0.0)
        return forecasts, steps

    def behind(self, model: str, region: str) -> set[str]:
        """The serving sources the open step of ``(model, region)`` waits for: those that
        served it in that step or the one before and have not reported a later step."""
        return _behind(self.keys[(model, region)])

    def _may_close(self, key: _Key) -> bool:
        end_s = (key.step + 1) * self.wiring.step_s
        if key.latest_s < end_s:
            return False
        missing = _behind(key)
        if missing and key.latest_s >= end_s + self.wiring.close_wait_s:
            self.closed_short += 1  # closed without them: their part is not counted
            return True
        return not missing

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
        by_pool, _ = served_in(key.served.get(key.step, {}))
        ready = by_pool.total()
        key.closed = (key.step, dict(by_pool))
        # what one replica carried: in the step closing, as far as its counts have come (at
        # most one report interval short: low, never high), and in the step before, whole
        # now (each partition sent its last count when this step began there)
        for step in (key.step - 1, key.step):
            replicas, served = served_in(key.served.get(step, {}))
            if replicas.total():
                carried = served / wiring.step_s / replicas.total()
                key.capacity_rps = max(key.capacity_rps, carried)
        key.served = {s: parts for s, parts in key.served.items() if s >= key.step}
        busiest = by_pool.most_common(1)[0][0] if by_pool else f"{region}-{wiring.pool_suffix}"
        load_s = wiring.load_s_for(busiest)
        d = key.policy.step(
            step=key.step, bands=bands, ready=ready, loading=len(key.loading),
            capacity=key.capacity_rps or wiring.replica_rps, load_steps=self._steps(load_s),
            observed=rps,
        )  # fmt: skip
        if d.replicas == 0:
            return forecasts, []
        scope = f"{model}@{busiest}"
        key.scopes.add(scope)
        guard = self.guard.check_scaling(
            scope, remove=d.replicas < 0, now=now or end, telemetry_at=end
        )
        if d.replicas > 0 and guard.allowed:
            ready_by = end + timedelta(seconds=load_s * 2)
            key.loading += [(busiest, ready_by)] * d.replicas
        return forecasts, [WarmStep(model, region, busiest, end, d, guard)]


def _behind(key: _Key) -> set[str]:
    expected = {
        source
        for step in (key.step - 1, key.step)
        for (source, _), (replicas, _) in key.served.get(step, {}).items()
        if replicas and source != LOCAL
    }
    later = {source for step, parts in key.served.items() if step > key.step for source, _ in parts}
    return expected - later


def served_in(parts: Mapping[tuple[str, str], tuple[int, int]]) -> tuple[Tally[str], int]:
    """A step's replicas that served, by pool, and the requests they served, summed over
    the sources heard."""
    by_pool: Tally[str] = Tally()
    served = 0
    for (_, pool), (replicas, requests) in parts.items():
        if replicas:
            by_pool[pool] += replicas
            served += requests
    return by_pool, served


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
