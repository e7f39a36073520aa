"""Capacity, batch and power control: telemetry per period in, throttle commands out.

:class:`ControlPlanner` gathers, per pool and control period of event time,
from serving telemetry: for each model it serves and each second of the
period, the TPOT p95 that 95% of that second's requests were served within
(replica p95s weighted by requests), the period standing at its worst second
(the SLO is kept second by second, so the period is read as it is judged) and
the slowest model's standing for the pool; and each replica's batch and
queue. At the period's end the pool's
:class:`~controllers.capacity.CapacityController` sets its optional-work
budget (latency over the SLO, and load over the batch slots the TPOT guard
allows), spent on the two levers, and its
:class:`~controllers.tpot_guard.TpotGuard` its batch-size target. A slowdown's cut of
optional work is not left to the period's end: when most of a pool's replicas run
slower at a batch of one than the guard's noise allows, in two of their last three
reports, the budget goes down at that report to the room the baseline leaves at the
speed now, once a period. Racks, their
power caps and batch moves are the power side's
(:class:`~planning.racks.RackPlanner`), which it feeds and tells each
pool's headroom.

Every step that changes something (or starts refusing to, for a reason an SRE
would ask about: SLO breach, stale or invalid input, the global budget) is a
:class:`~schemas.verdicts.Decision` with its reason and, for the budget, the
P, I and D terms; with a signing key it is also a signed ``ThrottleCommand``
(:mod:`planning.throttle`).

Pools and racks do not cross regions (a pool is a region's accelerators of one kind; a
rack stands in one site), so a region's planning needs nothing from another's but the
fleet's optional-work limit: :class:`RegionalControl` runs one planner per region with
that limit shared, and is what the control role runs (``streams.control``, split over
processes by region) and what ``eval control`` drives.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from statistics import median
from typing import Any, NamedTuple

from controllers.capacity import (
    CapacityController,
    CapacityDecision,
    CapacityReason,
    GlobalBudget,
    split_levers,
)
from controllers.power import PowerReason
from controllers.power_routing import (
    STEP,
    PoolWeight,
    PowerRouter,
    ReplicaServing,
    ReplicaWeight,
)
from controllers.tpot_guard import BatchDecision, TpotGuard
from planning.racks import RackPlanner
from planning.registry import CAPACITY, POWER, POWER_ROUTING, TPOT_GUARD
from planning.throttle import ControlOutput, ControlWiring, ThrottleIssuer
from schemas.commands import RouteAction, Target, ThrottleAction
from schemas.envelopes import (
    AcceleratorSample,
    AcceleratorTick,
    AnyAcceleratorSample,
    ReplicaReading,
    ServingSample,
    ServingTick,
)
from schemas.events import AcceleratorTelemetry, PduReading, ServingMetrics

NOTEWORTHY = {
    CapacityReason.POWER_LIMIT,
    CapacityReason.SLO_BREACH,
    CapacityReason.STALE_INPUT,
    CapacityReason.INVALID_INPUT,
    CapacityReason.GLOBAL_BUDGET,
}


@dataclass(slots=True)
class ReplicaLoad:
    """One replica's serving reports in one period, summed. Batch and queue are gauges read
    once a report: a queue comes and goes within seconds, so one report (the last, say) is
    a noisy reading of what the period held; their mean over the period is not."""

    device_uuid: str | None = None  # the device it runs on (its rack, for routing)
    model: str = ""
    reports: int = 0
    work: float = 0.0  # sequences held, running or waiting, summed over the reports
    queue: float = 0.0  # of those, the ones waiting
    # running sequences times the share of requests served that was not optional. Not the
    # queue: the share served says nothing of what waits (a router that serves baseline
    # first leaves mostly optional work waiting), and counting optional work that queues
    # as baseline would cut the budget for the queue it made itself. What waits is the
    # load's business (work over slots, in the PID's trend)
    baseline_work: float = 0.0
    batch_peak: int = 0  # the largest running batch a report showed
    tpot_s: float = 0.0  # TPOT p95, summed over the reports that had one
    unit_tpot_s: float = 0.0  # TPOT at a batch of one, the same way
    tpot_reports: int = 0
    requests: int = 0
    # the last three reports' TPOT at a batch of one: their median is the speed now, which
    # one odd report (a sensor spike) does not move
    last_units_s: deque[float] = field(default_factory=lambda: deque(maxlen=3))

    def add(self, metrics: ReplicaReading, doubling_batch: float) -> None:
        baseline = 1.0
        if metrics.optional_requests is not None and metrics.requests > 0:
            baseline = 1.0 - metrics.optional_requests / metrics.requests
        work = metrics.batch_size + metrics.queue_depth
        self.reports += 1
        self.requests += metrics.requests
        self.work += work
        self.queue += metrics.queue_depth
        self.baseline_work += metrics.batch_size * baseline
        self.batch_peak = max(self.batch_peak, metrics.batch_size)
        if metrics.tpot_p95_s is not None and metrics.tpot_p95_s > 0:
            self.tpot_s += metrics.tpot_p95_s
            unit_s = metrics.tpot_p95_s / (1.0 + metrics.batch_size / doubling_batch)
            self.unit_tpot_s += unit_s
            self.tpot_reports += 1
            self.last_units_s.append(unit_s)

    def unit_now(self) -> float | None:
        """Its TPOT at a batch of one now: the median of its last three reports (None: none
        had a TPOT)."""
        return median(self.last_units_s) if self.last_units_s else None

    def unit(self, now: bool) -> float:
        """Its TPOT at a batch of one: over the period, or ``now`` (:meth:`unit_now`)."""
        return (now and self.unit_now()) or self.unit_tpot_s / self.tpot_reports

    def room(self, target: int, doubling_batch: float, allowed_s: float, *, now: bool) -> float:
        """The batch it can run with its TPOT p95 at ``allowed_s``: ``target``, or less where
        its TPOT (growing as ``1 + batch / doubling_batch``) would reach ``allowed_s`` first,
        at its speed over the period or ``now``."""
        if not self.tpot_reports:
            return float(target)
        unit_s = self.unit(now)
        return min(float(target), max(0.0, doubling_batch * (allowed_s / unit_s - 1.0)))

    def baseline_at(self, room: float, doubling_batch: float, *, now: bool) -> float:
        """The sequences its baseline work would hold with the replica full (a batch of
        ``room``). By Little's law a request holds its slot for as long as its tokens take,
        so the baseline's concurrency grows with TPOT: read at today's TPOT it rises when
        optional work slows the replica and falls when that work is taken off, and a
        budget sized on it chases its own shadow. At the TPOT of a full replica it is the
        baseline's demand on the slots alone (at its speed over the period, or ``now``)."""
        mean = self.baseline_work / self.reports
        if not self.tpot_reports or self.tpot_s <= 0:
            return mean
        full_s = self.unit(now) * (1.0 + room / doubling_batch)
        return mean * full_s / (self.tpot_s / self.tpot_reports)


class TpotSample(NamedTuple):
    """One replica's TPOT p95 for one model, weighted by the requests it served (a tuple:
    one is made for every serving report, and a frozen dataclass costs three times as
    much to build)."""

    tpot_p95_s: float
    requests: int


@dataclass(slots=True)
class _Pool:
    capacity: CapacityController
    guard: TpotGuard
    period: int = -1
    # per (model, second of event time), this period's replica reports
    tpot: dict[tuple[str, int], list[TpotSample]] = field(default_factory=dict)
    replicas: dict[str, ReplicaLoad] = field(default_factory=dict)  # per replica, this period
    said: CapacityReason | None = None  # the last reason a decision recorded
    room_replicas: float = 0.0  # headroom at the last close, in replicas' worth of slots
    # a replica's TPOT at a batch of one past this has slowed by more than the speed's
    # noise (the guard's :meth:`~TpotGuard.slow_mark_s`; None: unknown, or acted on already
    # this period), the replicas past it in this period, and the replicas read at the last
    # close: most of them past it is a slowdown, and the budget is cut before the period's
    # end
    slow_over_s: float | None = None
    slowed: set[str] = field(default_factory=set)
    free_at_close: int = 0
    slowed_within: bool = False  # a slowdown cut the budget within the period: room read at it


class ControlPlanner(ThrottleIssuer):
    """Serving, PDU and accelerator telemetry in; per pool and period the optional-work
    budget and batch target, per rack the caps and batch moves, as decisions and commands."""

    def __init__(
        self,
        wiring: ControlWiring,
        *,
        new_id: Callable[[], uuid.UUID] = uuid.uuid4,
        budget: GlobalBudget | None = None,
    ) -> None:
        super().__init__(wiring, new_id=new_id)
        self.pools: dict[str, _Pool] = {}
        self.global_budget = budget if budget is not None else fleet_budget(wiring)
        self.crowded: set[str] = set()  # pools whose last close found them crowded
        self.power = RackPlanner(
            wiring, new_id=new_id, rooms=self._rooms, crowded=lambda: self.crowded
        )
        self.routing = PowerRouter(wiring.power_routing)
        # each pool's replicas at its last close: where a pool every cap holds may send its
        # share of a model (the region's router spreads a model over all its pools)
        self.last_serving: dict[str, list[ReplicaServing]] = {}
        self.regions: dict[str, str] = {}  # pool -> its region
        self.shed_at: dict[str, datetime] = {}  # rack -> the reading it last shed load at
        self.shed_streak: dict[str, int] = {}  # rack -> readings in a row it was still over
        self.spent_at: dict[str, datetime] = {}  # rack -> since when every cap is at its floor
        # pool -> the share of its requests it admits, where under 1: the last lever on a rack
        # that neither caps nor routing can bring under its breaker
        self.admission: dict[str, float] = {}

    def held(self) -> dict[str, Any]:
        """What this planner's levers hold now (caps, low clocks, batch moves, routing
        weights under 1, admission under 1, each pool's batch cap and optional-work budget
        with its TPOT guard's and capacity controller's memory), as JSON-able
        values: what a planner taking its racks and pools over must :meth:`adopt` to give
        them back when it is time."""
        weights = [[pool, u, w] for (pool, u), w in sorted(self.routing.weights.items())
                   if w < 1.0]  # fmt: skip
        pool_weights = [[pool, m, w] for (pool, m), w in sorted(self.routing.pool_weights.items())
                        if w < 1.0]  # fmt: skip
        # each pool's batch cap, with what its guard knows of it (a cap a slowdown cut
        # comes back when the speed does)
        guards = {name: pool.guard.remember() for name, pool in sorted(self.pools.items())}
        # and its optional-work budget with what its controller knows (the PID, its windows)
        budgets = {name: pool.capacity.remember() for name, pool in sorted(self.pools.items())}
        return {
            "power": self.power.held(), "weights": weights, "pool_weights": pool_weights,
            "batch_guards": guards, "budgets": budgets,
            "admission": [[pool, a] for pool, a in sorted(self.admission.items())],
        }  # fmt: skip

    def adopt(self, held: dict[str, Any]) -> None:
        """Take over what another planner's levers held (:meth:`held`). Raises
        ``ValueError`` on a record of another shape."""
        try:
            self.power.adopt(held["power"])
            for pool, u, weight in held["weights"]:
                self.routing.weights[(str(pool), str(u))] = float(weight)
            for pool, model, weight in held.get("pool_weights", []):  # absent before them
                self.routing.pool_weights[(str(pool), str(model))] = float(weight)
            for name, guard in held.get("batch_guards", {}).items():
                self._pool(str(name)).guard.recall(guard)
            for name, budget in held.get("budgets", {}).items():
                self._pool(str(name)).capacity.recall(budget)
            for pool, admitted in held.get("admission", []):  # absent before it
                self.admission[str(pool)] = float(admitted)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a control planner's levers: {exc!r}") from exc

    def _rooms(self) -> dict[str, float]:
        return {name: pool.room_replicas for name, pool in self.pools.items()}

    # -- inputs ---------------------------------------------------------------------------

    def feed(self, value: Any) -> list[ControlOutput]:
        """One event of whichever kind: serving, PDU or accelerator telemetry (the rest is
        not the planner's and changes nothing)."""
        if isinstance(value, ServingMetrics | ServingSample):
            return self.serving(value)
        if isinstance(value, PduReading):
            return self.pdu(value)
        if isinstance(value, AcceleratorTelemetry | AcceleratorSample):
            self.accelerator(value)
        return []

    def tick(self, tick: AcceleratorTick | ServingTick) -> list[ControlOutput]:
        """One node's envelope, as agents publish them: its samples in order, its header
        read once (the decisions its flat views fed one by one would make, without
        building the views)."""
        if isinstance(tick, ServingTick):
            at, out = tick.observed_at, []
            period, second = self._period(at), int(at.timestamp())
            for replica in tick.samples:
                out += self._serve(replica, period, second, tick.region)
            return out
        for device in tick.samples:
            self.power.device(tick.node_id, tick.rack_id, device)
        return []

    def accelerator(self, telemetry: AnyAcceleratorSample) -> None:
        self.power.accelerator(telemetry)

    def pdu(self, reading: PduReading) -> list[ControlOutput]:
        out = self.power.pdu(reading)
        return out + self._route_caps(out) + self._route_short(reading)

    def serving(self, metrics: ServingMetrics | ServingSample) -> list[ControlOutput]:
        at = metrics.observed_at
        return self._serve(metrics, self._period(at), int(at.timestamp()), metrics.region)

    def _pool(self, name: str) -> _Pool:
        pool = self.pools.get(name)
        if pool is None:
            # the guard predicts TPOT at a higher cap with the planner's own model of it
            guard = replace(self.wiring.tpot_guard, doubling_batch=self.wiring.tpot_doubling_batch)
            pool = self.pools[name] = _Pool(
                CapacityController(self.wiring.capacity), TpotGuard(guard)
            )
        return pool

    def _serve(
        self, metrics: ReplicaReading, period: int, second: int, region: str
    ) -> list[ControlOutput]:
        """One replica's report of control period ``period`` and ``second`` (of its event
        time, in whole seconds since the epoch)."""
        pool = self._pool(metrics.pool)
        self.regions.setdefault(metrics.pool, region)
        out = []
        if period > pool.period >= 0:
            # the pool's period closes at its first report of a later one: at once, or, when
            # the pool fell silent (a tripped rack, a lost agent), minutes later
            out = self._close_pool(metrics.pool, pool, learned=self._end(period - 1))
        if period >= pool.period:
            pool.period = period
            if metrics.tpot_p95_s is not None:
                sample = TpotSample(metrics.tpot_p95_s, max(metrics.requests, 1))
                key = (metrics.model, second)
                samples = pool.tpot.get(key)
                if samples is None:
                    pool.tpot[key] = [sample]
                else:
                    samples.append(sample)
            self.power.serving(metrics)
            load = pool.replicas.get(metrics.replica_id)
            if load is None:  # not setdefault: a load built for every report costs a microsecond
                load = pool.replicas[metrics.replica_id] = ReplicaLoad(
                    metrics.device_uuid, metrics.model
                )
            load.add(metrics, self.wiring.tpot_doubling_batch)
            if pool.slow_over_s is not None and self._slowed(pool, metrics, load):
                out += self._slowdown_now(metrics.pool, pool, datetime.fromtimestamp(second, UTC))
        return out

    def _slowed(self, pool: _Pool, metrics: ReplicaReading, load: ReplicaLoad) -> bool:
        """Whether, with this report, most of the replicas the guard reads the pool's speed
        by have run slower than its noise allows in two of their last three reports this
        period (one odd report, a sensor's spike, is no slowdown)."""
        units = load.last_units_s
        slow = (
            len(units) >= 2
            and (pool.slow_over_s or 0.0) < sorted(units)[-2] < self._mark_s()
            and self._uncapped(load)
        )
        if slow:
            pool.slowed.add(metrics.replica_id)
        else:
            pool.slowed.discard(metrics.replica_id)
        return 2 * len(pool.slowed) > max(1, pool.free_at_close)

    def _slowdown_now(self, name: str, pool: _Pool, at: datetime) -> list[ControlOutput]:
        """Most of the pool's replicas slowed down within a period: the optional budget goes
        down at this report to the room the baseline leaves at the speed now (a slowdown
        that began late in a period showed in one report at its close, and was acted on a
        whole period later). The batch cap waits for the period's end, where the guard
        reads the speed as ever: cut at the report, the cap to the speed's ceiling (0.95 of
        the SLO, under the router's own mark) held back work the queue then carried (held-
        out seeds 0.296 to 0.330 points under the oracle; the budget alone, 0.299). Once a
        period; the PID and the windows step at its end."""
        replicas = list(pool.replicas.values())
        pool.slow_over_s = None
        unit, mark = self._speed_now(replicas), pool.guard.slow_mark_s()
        was = pool.guard.speed_unit_s
        if unit is None or mark is None or was is None or unit <= mark:
            return []
        pool.slowed_within = True
        _, base = self._load_and_base(replicas, pool.guard.target, now=True)
        before = pool.capacity.budget
        room = max(0.0, self.wiring.capacity.load_setpoint_ratio - base)
        if not pool.capacity.cut_to(room, now=at):
            return []
        d = CapacityDecision(
            room, room, CapacityReason.TOKEN_SPEED,
            f"the tokens slowed {unit / was - 1:+.0%} within the period: budget {before:.3f} "
            f"-> {room:.3f}, the room the baseline leaves at the speed now",
        )  # fmt: skip
        pool.said = d.reason
        return [self._budget_output(at, name, d, base, changed=True)]

    # -- period ends ----------------------------------------------------------------------

    def _close_pool(self, name: str, pool: _Pool, *, learned: datetime) -> list[ControlOutput]:
        """The pool's period, closed: its controllers step at the period's end (their
        dynamics are per period), and what they decide is decided and issued when the
        planner learns the period is over (``learned``: its end, unless the pool fell silent
        past it). A command stamped with an end minutes old would reach its executor already
        expired, and the planner would go on believing a budget, cap or weight that never
        applied."""
        wiring, end = self.wiring, self._end(pool.period)
        at = max(end, learned)
        # each model is held to the SLO on its own, and second by second: the pool answers
        # for its slowest model's worst second. A period's pooled p95 sits under most of
        # its seconds' spread: on capped devices, whose clocks fall as their load rises, a
        # period read at 0.9 of the SLO had single seconds past it
        per_second = [_pool_p95(samples) for samples in pool.tpot.values()]
        tpot = max((t for t in per_second if t is not None), default=None)
        replicas = list(pool.replicas.values())
        pool.tpot, pool.replicas = {}, {}
        before, target = pool.capacity.budget, pool.guard.target
        # work waiting on average over the period: behind anything (where the router's
        # token-time mark binds before the cap, the batch runs under the target and the
        # queue is still there), and on a replica whose batch target binds
        queues = [r for r in replicas if r.queue >= r.reports]
        waiting = any(r.batch_peak >= target for r in queues)
        b = self._guard(pool, tpot, replicas, mandatory=before == 0.0, waiting=waiting,
                        queued=bool(queues))  # fmt: skip
        pool.slow_over_s, pool.slowed = pool.guard.slow_mark_s(), set()
        pool.free_at_close = sum(1 for r in replicas if self._speed_reader(r))
        # what the pool can run: each replica's batch target, or less where its TPOT would
        # pass the latency setpoint first; and what it held, on average over the period. At
        # the speed over the period; at the speed now in a period the guard saw the tokens
        # slow down (feedforward: a slowdown that began late in the period shrinks the room
        # at this close, not the next; a speed coming back is read over the period, as
        # raising is the risky direction)
        moved = pool.guard.speed_moved
        now = (moved is not None and moved > 1.0) or pool.slowed_within
        pool.slowed_within = False
        if moved is not None and moved < 1.0:
            # the tokens sped up past their noise (a slowdown over, a throttle lifted): the
            # levels in the budget's windows were read in the slots of a slower pool, and a
            # budget sized for their peak would wait out the stabilisation window (then
            # climb back a step at a time) for room that is real now, as after a step down
            pool.capacity.restart_windows()
            self.power.expect_surge(name)
        load, base = self._load_and_base(replicas, target, now=now)
        d = pool.capacity.step(
            now=end,
            latency_ratio=None if tpot is None else tpot / wiring.tpot_slo_s,
            load_ratio=load,
            baseline_ratio=base if replicas else None,
        )
        pool.room_replicas = max(0.0, wiring.capacity.load_setpoint_ratio - base) * len(replicas)
        short = self.power.short_pools().get(name)
        if short is not None:
            # optional work never trips a breaker: the rack's caps are at their floors
            pool.capacity.limit(0.0)
            d = replace(
                d, applied=0.0, reason=CapacityReason.POWER_LIMIT,
                message=f"{d.message}; rack {short} is over its limit with every cap at its "
                "floor: no optional work",
            )  # fmt: skip
        granted = self.global_budget.grant(name, d.applied, float(len(replicas)), end)
        if pool.capacity.limit(granted):
            d = replace(
                d, applied=granted, reason=CapacityReason.GLOBAL_BUDGET,
                message=f"{d.message}; the fleet's optional-work limit leaves {granted:.3f}",
            )  # fmt: skip
        out = []
        # a change is always recorded; a noteworthy hold once, when it starts
        if d.applied != before or (d.reason in NOTEWORTHY and d.reason is not pool.said):
            pool.said = d.reason
            out.append(self._budget_output(at, name, d, base, changed=d.applied != before))
        if b.target != b.previous:
            out.append(self._batch_output(at, name, b))
        # mandatory work waits with no optional work left to give up: capacity is the SLO
        crowded = waiting and before == 0.0 and d.applied == 0.0
        if crowded:
            self.crowded.add(name)
        else:
            self.crowded.discard(name)
        out += self._admit_more(name, at)
        return out + self._route_replicas(name, at, replicas, crowded=crowded)

    def _load_and_base(
        self, replicas: list[ReplicaLoad], target: int, *, now: bool
    ) -> tuple[float, float]:
        """The pool's load and its baseline, as shares of what it can run: each replica's
        batch target, or less where its TPOT would pass the latency setpoint first (at its
        speed over the period, or ``now``)."""
        k = self.wiring.tpot_doubling_batch
        allowed_s = self.wiring.capacity.setpoint_ratio * self.wiring.tpot_slo_s
        rooms = [r.room(target, k, allowed_s, now=now) for r in replicas]
        slots = max(1e-9, sum(rooms))
        load = sum(r.work / r.reports for r in replicas) / slots
        # the work that is not optional: what the budget must leave room for (feedforward)
        base = (
            sum(r.baseline_at(room, k, now=now) for r, room in zip(replicas, rooms, strict=True))
            / slots
        )
        return load, base

    def _budget_output(
        self, at: datetime, name: str, decision: CapacityDecision, base: float, *, changed: bool
    ) -> ControlOutput:
        d, spend = decision, split_levers(decision.applied, base, self.wiring.levers)
        return self._output(
            at, name, CAPACITY, ThrottleAction.OPTIONAL_BUDGET, d.reason.value,
            f"{d.message}; spent as {spend.funnel_extra:.2f} extra candidates per request, "
            f"{spend.upgrade_ratio:.0%} of requests on the bigger model",
            Target(pool=name), changed=changed,
            extra={"desired": d.desired, "applied": d.applied, "p_term": d.p,
                   "i_term": d.i, "d_term": d.d},
            params={"optional_budget_ratio": round(d.applied, 4),
                    "funnel_extra_candidates": round(spend.funnel_extra, 3),
                    "upgrade_ratio": round(spend.upgrade_ratio, 4)},
        )  # fmt: skip

    def _batch_output(self, at: datetime, name: str, batch: BatchDecision) -> ControlOutput:
        return self._output(
            at, name, TPOT_GUARD, ThrottleAction.BATCH_SIZE, batch.reason.value, batch.message,
            Target(pool=name), changed=True,
            extra={"desired": float(batch.target), "applied": float(batch.target)},
            params={"batch_size_max": batch.target},
        )  # fmt: skip

    def _guard(
        self,
        pool: _Pool,
        tpot: float | None,
        replicas: list[ReplicaLoad],
        *,
        mandatory: bool,
        waiting: bool,
        queued: bool,
    ) -> BatchDecision:
        """The TPOT guard's step for the period: its batch target."""
        in_use = max((r.batch_peak for r in replicas), default=None)
        return pool.guard.step(
            tpot_p95_s=tpot, slo_s=self.wiring.tpot_slo_s, batch_in_use=in_use, waiting=waiting,
            mandatory=mandatory,  # no optional work admitted: what waits is mandatory
            unit_tpot_s=self._speed_now(replicas), queued=queued,
        )  # fmt: skip

    def _speed_now(self, replicas: list[ReplicaLoad]) -> float | None:
        """The pool's speed now: per model, the median replica's TPOT at a batch of one (by
        requests: what moves it is pool-wide), over the replicas no power cap holds (a
        capped rack's replicas are slower by the cap's doing, and the router's to weight
        down, not a reason to cap every replica's batch); the slowest model's. (A model
        slower at a batch of one than the mark is past what any cap can do: its replicas
        are the router's and the warmer's to answer for, and a pool-wide cap at the floor
        for it would only make the other models' work wait.)"""
        speeds: dict[str, list[TpotSample]] = {}
        for r in replicas:  # a pool every cap holds: the power side's, no speed reading
            if self._uncapped(r) and (unit_s := r.unit_now()) is not None:
                speeds.setdefault(r.model, []).append(TpotSample(unit_s, max(r.requests, 1)))
        mark_s = self._mark_s()
        units = (_by_requests(s, 0.5) for s in speeds.values())
        return max((u for u in units if u is not None and u < mark_s), default=None)

    def _speed_reader(self, replica: ReplicaLoad) -> bool:
        """Whether the pool's speed is read by this replica: no cap holds it, and its model
        is not past the mark at a batch of one."""
        unit_s = replica.unit_now()
        return unit_s is not None and unit_s < self._mark_s() and self._uncapped(replica)

    def _uncapped(self, replica: ReplicaLoad) -> bool:
        """Whether no power cap or low clock of ours holds the replica's device."""
        return replica.device_uuid is None or not self.power.holds(replica.device_uuid)

    def _mark_s(self) -> float:
        """The TPOT the guard's ceiling is set at: ``high_ratio`` of the SLO."""
        return self.wiring.tpot_guard.high_ratio * self.wiring.tpot_slo_s

    def _route_caps(self, outputs: list[ControlOutput]) -> list[ControlOutput]:
        """Each cap the power side just set under a device's draw: that replica's weight."""
        out = []
        at = outputs[-1].decision.decided_at if outputs else None
        for u, draw, cap in self.power.take_new_caps():
            device = self.power.devices[u]
            if device.pool is None or at is None:
                continue
            w = self.routing.capped(device.pool, u, device.rack_id,
                                    draw_watts=draw, cap_watts=cap)  # fmt: skip
            if w is not None:
                out.append(self._weight_output(at, device.pool, w))
        return out

    def _route_short(self, reading: PduReading) -> list[ControlOutput]:
        """A rack left over its limit with every lever spent sheds load: at once when its
        plan says so (once a period, ahead of the breaker), and again at each reading that
        still finds it over its breaker limit with every cap at its floor (a breaker trips
        in seconds). A device pinned at its cap's floor draws no less until its work falls
        under what the floor runs at full clock, so the draw over the limit understates
        the cut it takes: each reading in a row the rack stays over, the cut doubles (up to
        ``max_shed_ratio`` of a weight a reading)."""
        rack_id, at = reading.rack_id, reading.observed_at
        over_now = self._over_at_floors(rack_id, at)
        last = self.shed_at.get(rack_id)
        planned = rack_id in self.power.short and (
            last is None or self._period(last) != self._period(at)
        )
        if last == at or not (planned or over_now):
            return []
        self.shed_at[rack_id] = at
        streak = self.shed_streak[rack_id] = self.shed_streak.get(rack_id, -1) + over_now
        return self._shed(rack_id, at, over_now=over_now, gain=2.0 ** max(0, streak))

    def _over_at_floors(self, rack_id: str, at: datetime) -> bool:
        """Whether the rack reads over its breaker limit with every cap at its floor, on a
        reading taken with the floors in force (the reading that set them was drawn before
        they were)."""
        since = self.spent_at.get(rack_id)
        if not self.power.spent(rack_id):
            self.spent_at.pop(rack_id, None)
            since = None
        elif since is None:
            self.spent_at[rack_id] = at
        over = since is not None and since < at and self.power.over_limit_watts(rack_id) > 0
        if not over:
            self.shed_streak.pop(rack_id, None)
        return over

    def _shed(
        self, rack_id: str, at: datetime, *, over_now: bool, gain: float
    ) -> list[ControlOutput]:
        """The rack's held replicas shed ``gain`` times the share of their pools' draw the
        rack is over; a pool whose replicas of a model there are all at the least weight a
        replica may have, and none of them free elsewhere in the pool, sheds its share of
        the model among the region's pools (a free replica takes the share within it)."""
        out: list[ControlOutput] = []
        at_least: dict[tuple[str, str], bool] = {}  # (pool, model): every replica at the least
        models = {r.device_uuid: r.model for rs in self.last_serving.values() for r in rs}
        ratios: dict[str, float] = {}  # pool: the share of its draw there to shed
        for u in self.power.rack_devices.get(rack_id, ()):
            pool = self.power.devices[u].pool
            if pool is None or not self.power.holds(u):
                continue
            ratio = ratios.get(pool)
            if ratio is None:
                over = self.power.over_ratio(rack_id, pool, now_too=over_now)
                ratio = ratios[pool] = min(1.0, gain * over)
            change = self.routing.shed(pool, u, rack_id, over_ratio=ratio)
            if change is not None:
                out.append(self._weight_output(at, pool, change))
            if (model := models.get(u)) is not None:
                least = change is None and ratio > 0
                at_least[(pool, model)] = at_least.get((pool, model), True) and least
        stuck: dict[str, bool] = {}  # pool: no share of it could move (the last lever left)
        for (pool, model), least in sorted(at_least.items()):
            free = any(r.model == model and not r.held for r in self.last_serving.get(pool, ()))
            if not least or free:
                stuck[pool] = False
                continue
            moved = self.routing.shed_pool(pool, model, rack_id, over_ratio=ratios[pool])
            if moved is not None:
                out.append(self._pool_weight_output(at, moved))
            stuck[pool] = stuck.get(pool, True) and moved is None
        for pool, nothing_moved in sorted(stuck.items()):
            if nothing_moved and over_now:
                out += self._admit_less(pool, rack_id, at, ratios[pool])
        return out

    def _admit_less(
        self, pool: str, rack_id: str, at: datetime, ratio: float
    ) -> list[ControlOutput]:
        """The rack still over its breaker with every cap at its floor, its replicas at the
        least weight and their pool's share nowhere to go: the pool admits ``ratio`` less
        of its requests (at most ``max_shed_ratio``, never under ``min_weight``). A request
        refused at the door is one; a tripped breaker refuses every one of the rack's until
        its feed is back and its hosts are up."""
        now = self.admission.get(pool, 1.0)
        new = self.wiring.power_routing.shed(now, ratio)
        if now - new < STEP:  # as a weight: a smaller change is not sent
            return []
        self.admission[pool] = new
        message = (
            f"{rack_id} is over its breaker with every cap at its floor, its replicas at the "
            f"least weight and nowhere to move their share: {pool} admits {now:.2f} -> "
            f"{new:.2f} of its requests"
        )
        return [self._admission_output(at, pool, new, PowerReason.ADMISSION_SHED, message)]

    def _admit_more(self, pool: str, at: datetime) -> list[ControlOutput]:
        """Once a period: a pool admitting less, none of whose racks has every cap at its
        floor any more, admits more, at most ``max_rise_ratio`` a period, back to all."""
        now = self.admission.get(pool)
        if now is None:
            return []
        racks = {d.rack_id for d in self.power.devices.values() if d.pool == pool}
        if any(self.power.spent(r) for r in racks):
            return []
        new = min(1.0, now * self.wiring.power_routing.max_rise_ratio)
        if new >= 1.0:
            del self.admission[pool]
        else:
            self.admission[pool] = new
        message = f"no cap of {pool}'s racks is at its floor now: it admits {now:.2f} -> {new:.2f}"
        return [self._admission_output(at, pool, new, PowerReason.ADMISSION_BACK, message)]

    def _admission_output(
        self, at: datetime, pool: str, ratio: float, reason: PowerReason, message: str
    ) -> ControlOutput:
        return self._output(
            at, pool, POWER, ThrottleAction.ADMISSION, reason.value, message, Target(pool=pool),
            changed=True, extra={"desired": ratio, "applied": ratio},
            params={"admission_ratio": round(ratio, 4)},
        )  # fmt: skip

    def _weight_output(self, at: datetime, pool: str, change: ReplicaWeight) -> ControlOutput:
        rack = change.rack_id or None
        return self._output(
            at, change.device_uuid, POWER_ROUTING, RouteAction.DEWEIGHT, change.reason.value,
            change.message, Target(pool=pool, device_uuid=change.device_uuid, rack_id=rack),
            changed=True,
            extra={"rack_id": rack, "desired": change.desired, "applied": change.weight},
            params={"weight_ratio": round(change.weight, 4)},
        )  # fmt: skip

    def _route_replicas(
        self, name: str, at: datetime, replicas: list[ReplicaLoad], *, crowded: bool
    ) -> list[ControlOutput]:
        """The router's weight for each of the pool's replicas whose device our caps hold
        down (and back to 1 once none does); ``crowded``: the pool's mandatory work waits."""
        seen: dict[str, ReplicaServing] = {}
        for r in replicas:
            rack_id = self.power.rack_of(r.device_uuid)
            if r.device_uuid is None or rack_id is None:
                continue
            n = max(r.tpot_reports, 1)
            seen[r.device_uuid] = ReplicaServing(
                r.device_uuid, rack_id, unit_tpot_s=r.unit_tpot_s / n,
                batch=(r.work - r.queue) / r.reports, tpot_s=r.tpot_s / n,
                held=self.power.holds(r.device_uuid),
                at_floor=self.power.at_floor(r.device_uuid), model=r.model,
                batch_cap=self.pools[name].guard.target, waiting=r.queue / r.reports,
            )  # fmt: skip
        for u in self.routing.weighted(name):
            if u not in seen:  # weighted down, and silent this period
                rack_id = self.power.rack_of(u) or ""
                seen[u] = ReplicaServing(u, rack_id, 0.0, 0.0, 0.0, held=self.power.holds(u))
        k = self.wiring.tpot_doubling_batch
        serving = self.last_serving[name] = list(seen.values())
        target_s = self.wiring.capacity.setpoint_ratio * self.wiring.tpot_slo_s
        changes = self.routing.step(
            name, serving, doubling_batch=k, crowded=crowded, target_tpot_s=target_s
        )
        # the other pools' replicas matter only to a model every cap holds here
        region = self.regions.get(name)
        others = [r for pool, rs in self.last_serving.items()
                  if pool != name and self.regions.get(pool) == region for r in rs
                  ] if any(r.held for r in serving) else []  # fmt: skip
        moves = self.routing.step_pools(name, serving, others, doubling_batch=k,
                                        target_tpot_s=target_s, crowded=crowded)  # fmt: skip
        return [self._weight_output(at, name, w) for w in changes] + [
            self._pool_weight_output(at, w) for w in moves
        ]

    def _pool_weight_output(self, at: datetime, change: PoolWeight) -> ControlOutput:
        return self._output(
            at, change.model, POWER_ROUTING, RouteAction.DEWEIGHT, change.reason.value,
            change.message, Target(pool=change.pool), changed=True,
            extra={"desired": change.desired, "applied": change.weight},
            params={"weight_ratio": round(change.weight, 4), "model": change.model},
        )  # fmt: skip


CLAIM_LIFE_PERIODS = 3
"""Control periods a pool's claim on the fleet's optional-work limit counts for when no
newer one replaces it (:class:`~controllers.capacity.GlobalBudget`): a pool claims at
every period's end it is planned, so three missed ends mean nobody plans it now."""


def fleet_budget(wiring: ControlWiring) -> GlobalBudget:
    """The fleet's optional-work limit, as the settings give it."""
    return GlobalBudget(
        wiring.global_budget_devices, claim_life_s=CLAIM_LIFE_PERIODS * wiring.period_s
    )


class RegionalControl:
    """A :class:`ControlPlanner` per region, sharing the fleet's optional-work limit: what a
    control worker runs for the regions it owns. A region's planner is made with its first
    event and dropped when the region moves to another process (:meth:`release`), taking
    its pools' controllers with it: the next owner starts afresh but for what
    :meth:`ControlPlanner.held` hands on (levers, budgets, batch caps)."""

    def __init__(
        self, wiring: ControlWiring, *, new_id: Callable[[], uuid.UUID] = uuid.uuid4
    ) -> None:
        self.wiring = wiring
        self.new_id = new_id
        self.budget = fleet_budget(wiring)
        self.planners: dict[str, ControlPlanner] = {}
        self.pool_regions: dict[str, str] = {}  # pool -> the region it was first seen in
        self.crossing: set[str] = set()  # pools seen in two regions: planned apart, wrongly

    def planner(self, region: str) -> ControlPlanner:
        planner = self.planners.get(region)
        if planner is None:
            planner = self.planners[region] = ControlPlanner(
                self.wiring, new_id=self.new_id, budget=self.budget
            )
        return planner

    def feed(self, value: Any) -> list[ControlOutput]:
        """One event (see :meth:`ControlPlanner.feed`), to its region's planner."""
        region = getattr(value, "region", None)
        return [] if region is None else self._in(region, lambda p: p.feed(value))

    def tick(self, tick: AcceleratorTick | ServingTick) -> list[ControlOutput]:
        """One node's envelope (see :meth:`ControlPlanner.tick`), to its region's planner."""
        return self._in(tick.region, lambda p: p.tick(tick))

    def _in(
        self, region: str, call: Callable[[ControlPlanner], list[ControlOutput]]
    ) -> list[ControlOutput]:
        """``call`` on ``region``'s planner; a pool it made there that another region
        already has is noted in ``crossing``."""
        planner = self.planner(region)
        known = len(planner.pools)
        out = call(planner)
        if len(planner.pools) > known:
            for pool in planner.pools:
                if self.pool_regions.setdefault(pool, region) != region:
                    self.crossing.add(pool)
        return out

    def release(self, regions: Iterable[str]) -> None:
        """Drop ``regions``' planners: another process plans them now."""
        for region in regions:
            planner = self.planners.pop(region, None)
            if planner is not None:
                self.budget.release(planner.pools)
                for pool in planner.pools:
                    if self.pool_regions.get(pool) == region:
                        del self.pool_regions[pool]


def _pool_p95(samples: list[TpotSample]) -> float | None:
    """A model's TPOT p95 in a pool from its replicas' (p95, requests): the replica p95
    that 95% of the period's requests were served at or under. One slow replica that serves
    few (a device being drained, say) does not stop the pool's optional work; one that
    serves a twentieth of them does."""
    return _by_requests(samples, 0.95)


def _by_requests(samples: list[TpotSample], share: float) -> float | None:
    """The replica value that ``share`` of the requests were served at or under."""
    if not samples:
        return None
    total = sum(s.requests for s in samples)
    seen = 0
    for s in sorted(samples, key=lambda s: (s.tpot_p95_s, s.requests)):
        seen += s.requests
        if seen >= share * total:
            return s.tpot_p95_s
    return max(s.tpot_p95_s for s in samples)
