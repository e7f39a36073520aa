"""`fleetloop eval control`: one pool through a control scenario under three policies.

The pool is :class:`evaluations.pool_plant.PoolPlant`, stepped each second; the
policies act once per ``period_s`` (power as PDU readings come), all on the
same scenario and the same random draws:

- **ours**: the control role exactly as a worker runs it
  (:class:`Production`): the real :class:`~planning.pools.RegionalControl`,
  built from worker settings by the worker's own wiring, with its batch-slot
  model, global budget, lever split, TPOT guard, rack planner and power-aware
  routing, fed the pool's telemetry as events each second (each device its own
  TPOT and batch), its signed throttle and route commands applied to the plant
  as the executors apply them; and the router's value-aware
  :class:`~controllers.shedding.LoadShedder`;
- **static**: the scenario's fixed budget, no power control, one FIFO queue;
- **hpa**: a threshold rule on the budget as Kubernetes' HPA scales replicas
  (tolerance 0.1 around the target; what frees capacity for optional work, its
  "scale-down", waits 300 s of recommendations), the same rule on each rack's
  caps, one FIFO queue.

Measured per policy: baseline SLO attainment (periods whose every second kept
baseline TPOT and wait within SLO) beside the oracle's (the periods whose
every second's baseline the pool could have carried within the SLO and the
racks' limits at the best clock, knowing the slowdown and deferring batch
work: :meth:`PoolPlant.oracle_load`, with what it could not carry waiting
within the wait SLO until it drains), optional work served against the same
oracle's (what that load leaves once the second's baseline, the baseline it let wait
and the batch work it deferred are served: deferred work is owed, not dropped), both
again for the same oracle held to the router's own admission mark (ours: the plant's
router admits no further whatever the levers do; the oracle above runs at the SLO
itself), breaker
trips (a rack over its limit for ``trip_after_s``: it goes dark, devices and hosts,
until its feed is back and for at least ``DARK_S``), the share of the seconds a
cap or low-clock mode held a device down that its own TPOT was over the SLO
(what power-aware routing is for: the pool's p95 hides a few slow devices), actions (each
second, each controller that changed something on a rack or a pool: the caps or weights
it sets on one rack's devices together are one action, as HPA's rack rule is one),
actions per 300 s in oscillating segments (not
while an event is on, nor for a stabilisation window after it), and
after each step segment (each budget counted at the time it was decided: the
planner's, as it closes a period at the next period's first event): periods to
the first action, to settle within 5% of
the budget it ends at, and the overshoot past it; after each slowdown: periods
until optional work and the batch cap were cut (the TPOT guard cuts the cap
only past 0.95 of the SLO: "never" where TPOT stayed under it), and periods
out of the SLO after it ended, ours and the oracle's.
"""

from __future__ import annotations

import itertools
import math
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from controllers.stages import Stabiliser
from evaluations.control_scenario import ControlScenario
from evaluations.pool_plant import SLOT_SHARE, PoolPlant, PoolShape, Second
from fleetloop.settings import WorkerSettings
from fleetloop.wiring import control_wiring
from planning.pools import RegionalControl
from schemas.base import AcceleratorType
from schemas.commands import ClockMode, RouteAction, RouteCommand, ThrottleAction, ThrottleCommand
from schemas.events import AcceleratorTelemetry, PduPhase, PduReading, ServingMetrics

POLICIES = ("ours", "static", "hpa")
SUFFIXES = ("", "_static", "_hpa")
"""Each policy's suffix on a result's keys, in :data:`POLICIES`' order (ours has none)."""


@dataclass(frozen=True, slots=True)
class Reading:
    """What reaches a controller at the end of a period (None: nothing arrived)."""

    tpot_ratio: float | None
    load_ratio: float | None
    baseline_ratio: float | None = None
    noise: float = 1.0  # the sensor noise factor drawn for this period


class Policy(Protocol):
    budget: float

    def period(self, now: float, reading: Reading, plant: PoolPlant) -> int: ...

    def power(self, now: float, sec: Second, limits: list[float], plant: PoolPlant) -> int: ...


EPOCH = datetime(2026, 1, 1, tzinfo=UTC)  # the plant's t = 0 (a whole number of periods)
EVAL_KEY = "eval=eval-control-signing-key-0123"  # signed, as a worker with keys signs


def production_settings(scn: ControlScenario) -> WorkerSettings:
    """The worker settings an operator would give this pool: the defaults, with the pool's
    SLO, period and batch ceiling from the scenario, and a signing key."""
    p = scn.pool
    control = {"period_s": scn.period_s, "tpot_slo_s": p.tpot_slo_s,
               "tpot_guard": {"max_batch": p.max_batch}}  # fmt: skip
    return WorkerSettings(command_keys=EVAL_KEY, control=control)


class Production:
    """The control role as a worker runs it: :class:`~planning.pools.RegionalControl` built
    from :func:`production_settings` by the worker's own wiring, fed the pool's telemetry
    each second (a serving report and an accelerator sample per device, a PDU reading per
    rack), its signed commands applied to the plant as the executors apply them.

    Each device is one replica on its own node. A second with a ``stale`` event sends no
    serving reports; a ``nan`` second sends none either (NaN is a dead letter at ingest);
    a ``spike`` multiplies the TPOT reported. Sensor noise is one draw per period, as
    for the other policies, applied to the next period's reports.
    """

    def __init__(self, scn: ControlScenario) -> None:
        self.scn = scn
        self.planner = RegionalControl(control_wiring(production_settings(scn)))
        self.budget = 0.0
        self.moved_racks: set[str] = set()
        self.noise = 1.0
        self.ids = itertools.count()
        self.decisions: Counter[str] = Counter()  # "controller/reason" -> decisions

    @property
    def moved(self) -> float:
        """Batch work moved off the pool, in units of its load (the racks that moved it)."""
        return self.scn.batch_level * len(self.moved_racks) / self.scn.pool.racks

    def _id(self) -> uuid.UUID:
        return uuid.UUID(int=next(self.ids))

    def period(self, now: float, reading: Reading, plant: PoolPlant) -> int:
        """The period's sensor noise for the next period's reports (the planner keeps its
        own periods of event time)."""
        if reading.tpot_ratio is not None and math.isfinite(reading.tpot_ratio):
            self.noise = reading.noise
        return 0

    def power(self, now: float, sec: Second, limits: list[float], plant: PoolPlant) -> int:
        """One second of telemetry into the planner; its commands onto the plant."""
        t = int(now)
        outputs = []
        for event in self._telemetry(t, EPOCH + timedelta(seconds=t), sec, limits, plant):
            outputs += self.planner.feed(event)
        # one action: a controller's change to one rack or pool in one second (the caps or
        # weights it sets on a rack's devices together are one step, as HPA's rack rule is)
        acted = {
            (o.decision.controller, o.command.target.rack_id or o.command.target.pool)
            for o in outputs
            if o.command
        }
        for o in outputs:
            self.decisions[f"{o.decision.controller}/{o.decision.reason}"] += 1
            if o.command is not None:
                self._apply(o.command, plant)
        return len(acted)

    def _telemetry(
        self, second: int, at: datetime, sec: Second, limits: list[float], plant: PoolPlant
    ) -> list[AcceleratorTelemetry | PduReading | ServingMetrics]:
        s, scn = plant.shape, self.scn
        events: list[AcceleratorTelemetry | PduReading | ServingMetrics] = []
        dark = [plant.rack_of(i) in plant.tripped for i in range(s.devices)]
        for i in range(s.devices):
            if dark[i]:
                continue
            rack = f"rack-{plant.rack_of(i)}"
            events.append(AcceleratorTelemetry(
                event_id=self._id(), observed_at=at, node_id=f"node-{i}", device_uuid=f"gpu-{i}",
                device_index=0, accelerator_type=AcceleratorType.H100, region="eval",
                pod_id="pod-0", rack_id=rack, pdu_id=f"pdu-{rack}",
                power_usage_watts=plant.device_watts[i], power_limit_watts=plant.caps[i],
                power_limit_min_watts=s.min_watts, power_limit_max_watts=s.max_watts,
            ))  # fmt: skip
        for r in range(s.racks):
            events.append(PduReading(
                event_id=self._id(), observed_at=at, pdu_id=f"pdu-rack-{r}", rack_id=f"rack-{r}",
                pod_id="pod-0", region="eval", phase=PduPhase.L1, power_watts=sec.rack_watts[r],
                capacity_watts=limits[r], breaker_limit_watts=limits[r],
            ))  # fmt: skip
        if scn.events_at(second, "stale") or scn.events_at(second, "nan"):
            return events
        spike = scn.events_at(second, "spike")
        factor = self.noise * (spike[0].factor if spike else 1.0)
        served = max(sec.x_served, 1e-9)
        waiting = sum(plant.queues.values()) / served  # the queue, per sequence running
        shares = plant.shares()
        for i in range(s.devices):
            if dark[i]:
                continue
            # a device's requests follow its share of the load; only the shares of optional
            # and batch work among them matter to the planner, and the replicas' weights
            requests = max(1, round(100 * shares[i]))
            optional = round(requests * min(1.0, sec.optional_served / served))
            batch_work = round(requests * min(1.0, sec.batch_served / served))
            batch = round(plant.device_batch[i])
            tpot = plant.device_tpot_s[i] * factor
            queue = round(batch * waiting)
            events.append(ServingMetrics(
                event_id=self._id(), observed_at=at, replica_id=f"replica-{i}",
                node_id=f"node-{i}", device_uuid=f"gpu-{i}", model="eval-model",
                pool="eval-pool", region="eval", accelerator_type=AcceleratorType.H100,
                interval_s=1.0, tpot_p95_s=tpot, queue_depth=queue, batch_size=batch,
                tokens_per_s=0.0, requests=requests, errors=0, optional_requests=optional,
                batch_requests=batch_work,
            ))  # fmt: skip
        return events

    def _apply(self, command: ThrottleCommand | RouteCommand, plant: PoolPlant) -> None:
        """What the executors do with a command, on the plant."""
        if isinstance(command, RouteCommand):
            # a replica's weight in the router of the plant's one pool
            if command.action is RouteAction.DEWEIGHT and command.weight_ratio is not None:
                plant.weights[_device(command)] = command.weight_ratio
            return
        if command.action is ThrottleAction.OPTIONAL_BUDGET:
            self.budget = command.optional_budget_ratio or 0.0
        elif command.action is ThrottleAction.BATCH_SIZE and command.batch_size_max is not None:
            plant.batch_target = command.batch_size_max
        elif command.action is ThrottleAction.POWER_CAP and command.power_limit_watts is not None:
            plant.caps[_device(command)] = command.power_limit_watts
        elif command.action is ThrottleAction.CLOCK_MODE:
            plant.low_clock[_device(command)] = command.clock_mode is ClockMode.LOW
        elif command.action is ThrottleAction.MOVE_BATCH and command.target.rack_id is not None:
            # the plant does not place work on racks: a move to the pool's other racks
            # leaves its load as it was; only a move to another pool takes it away
            if command.batch_move_ratio and command.to_pool != command.target.pool:
                self.moved_racks.add(command.target.rack_id)
            else:
                self.moved_racks.discard(command.target.rack_id)


def _device(command: ThrottleCommand | RouteCommand) -> int:
    return int((command.target.device_uuid or "gpu-0").removeprefix("gpu-"))


class Static:
    def __init__(self, budget: float) -> None:
        self.budget = budget

    def period(self, now: float, reading: Reading, plant: PoolPlant) -> int:
        return 0

    def power(self, now: float, sec: Second, limits: list[float], plant: PoolPlant) -> int:
        return 0


@dataclass
class Hpa:
    """Threshold rules with HPA's tolerance and its stabilisation of the risky direction."""

    racks: int
    target_ratio: float = 0.9
    tolerance: float = 0.1
    window_s: float = 300.0
    budget: float = 0.0
    up: Stabiliser = field(init=False)
    lifts: list[Stabiliser] = field(init=False)

    def __post_init__(self) -> None:
        self.up = Stabiliser(self.window_s, cautious="up")
        self.lifts = [Stabiliser(self.window_s, cautious="up") for _ in range(self.racks)]

    def period(self, now: float, reading: Reading, plant: PoolPlant) -> int:
        if reading.tpot_ratio is None or reading.load_ratio is None:
            return 0
        r = max(reading.tpot_ratio / self.target_ratio, reading.load_ratio / 0.97)
        if not math.isfinite(r) or abs(r - 1) <= self.tolerance:
            return 0
        desired = min(1.0, max(self.budget, 0.01) / r)
        new, _ = self.up(desired, current=self.budget, now=EPOCH + timedelta(seconds=now))
        changed = new != self.budget
        self.budget = new
        return int(changed)

    def power(self, now: float, sec: Second, limits: list[float], plant: PoolPlant) -> int:
        actions, racks = 0, sec.rack_watts
        s = plant.shape
        for rack in range(self.racks):
            if rack in plant.tripped or racks[rack] <= 0:
                continue  # dark (or was, this second): nothing to cap
            r = racks[rack] / (0.92 * limits[rack])
            if abs(r - 1) <= self.tolerance:
                continue
            members = [i for i in range(s.devices) if plant.rack_of(i) == rack]
            cap = sum(plant.caps[i] for i in members) / len(members)
            desired = min(s.max_watts, max(s.min_watts, cap / r))
            at = EPOCH + timedelta(seconds=now)
            new, _ = self.lifts[rack](desired, current=cap, now=at)
            if new != cap:
                for i in members:
                    plant.caps[i] = new
                actions += 1
        return actions


@dataclass(slots=True)
class Tally:
    periods: int = 0
    periods_in_slo: int = 0
    periods_attainable: int = 0  # periods the oracle could have kept in the SLO
    # ... and the same oracle held to the router's own admission mark
    periods_attainable_at_mark: int = 0
    harvested: float = 0.0
    oracle: float = 0.0
    oracle_at_mark: float = 0.0
    trips: int = 0
    over_limit_s: int = 0
    actions: int = 0
    oscillation_actions: int = 0
    oscillation_s: float = 0.0
    budgets: list[tuple[float, float]] = field(default_factory=list)  # (t, budget)
    # per period: (end, within the SLO, attainable by the oracle, batch cap at its end)
    record: list[tuple[float, bool, bool, int]] = field(default_factory=list)
    # per period, what put it out of the SLO: "" (nothing), "tpot", "wait" or "both"
    out_causes: list[str] = field(default_factory=list)
    last_ok: bool = True  # the last period's: within the SLO
    weighted_at_end: int = 0  # replicas the router still weights under 1 at the end
    held_device_s: int = 0  # device-seconds a cap or low-clock mode held a device down
    held_over_slo_s: int = 0  # of those, the ones its TPOT was over the SLO
    decisions: dict[str, int] = field(default_factory=dict)  # ours: "controller/reason" -> n
    # (second, budget, batch cap) each time either changed, in order: when a lever moved,
    # to the second (the planner may act within a period: a slowdown it sees at once)
    changes: list[tuple[float, float, int]] = field(default_factory=list)


def run_policy(scn: ControlScenario, name: str) -> Tally:
    p = scn.pool
    shape = PoolShape(
        p.devices, p.racks, p.tpot_base_s, p.spread_ratio, p.tpot_slo_s, p.wait_slo_s,
        p.idle_watts, p.max_watts, p.min_watts, p.host_watts_per_rack,
    )  # fmt: skip
    plant = PoolPlant(shape, priority=name == "ours", seed=scn.seed, max_batch=p.max_batch)
    policy: Policy = (
        Production(scn) if name == "ours"
        else Static(scn.static_budget) if name == "static"
        else Hpa(p.racks)
    )  # fmt: skip
    plant.settle(scn.baseline_at(0) + scn.batch_level)
    tally = Tally()
    over_since: list[float | None] = [None] * p.racks
    seconds: list[Second] = []
    attainable = True  # this period, so far: the oracle's baseline within the SLO
    ledger = OracleLedger()
    attainable_at_mark, ledger_at_mark = True, OracleLedger()
    steps = int(scn.duration_s)
    nominal = [p.breaker_ratio * p.nameplate_watts] * p.racks  # the limits with every feed up
    tripped_at = [0] * p.racks
    period = max(1, round(scn.period_s))
    for t in range(steps):
        slow = scn.events_at(t, "slowdown")
        plant.slowdown = max((e.ratio for e in slow), default=1.0)
        baseline = plant.noisy(scn.baseline_at(t), scn.noise_ratio)
        moved = policy.moved if isinstance(policy, Production) else 0.0
        batch = max(0.0, scn.batch_level - moved)
        sec = plant.step(baseline=baseline, batch=batch, optional_share=policy.budget)
        limits = scn.limits_at(t)
        best = plant.oracle_load(limits)
        tally.oracle += ledger.second(best, baseline, scn.batch_level)
        attainable = attainable and ledger.backlog <= p.wait_slo_s * best
        if plant.priority:  # only a priority router admits to a mark (the FIFO one: no mark)
            best = plant.oracle_load(limits, at_mark=True)
            tally.oracle_at_mark += ledger_at_mark.second(best, baseline, scn.batch_level)
            attainable_at_mark &= ledger_at_mark.backlog <= p.wait_slo_s * best
        tally.harvested += sec.optional_served
        for i, tpot in enumerate(plant.device_tpot_s):
            if plant.low_clock[i] or plant.caps[i] < p.max_watts - 0.5:  # held down
                tally.held_device_s += 1
                tally.held_over_slo_s += tpot > p.tpot_slo_s
        for r, watts in enumerate(sec.rack_watts):
            if watts > limits[r]:
                tally.over_limit_s += 1
                since = over_since[r]
                if since is None:
                    since = over_since[r] = float(t)
                if t - since + 1 >= p.trip_after_s:
                    tally.trips += 1
                    plant.trip(r)  # dark until the feed is back and its hosts are up
                    tripped_at[r] = t
                    over_since[r] = None
            else:
                over_since[r] = None
            if r in plant.tripped and limits[r] >= nominal[r] and t - tripped_at[r] >= DARK_S:
                plant.reset(r)
        acted = policy.power(t, sec, limits, plant)
        _changed(tally, float(t), policy.budget, plant.batch_target)
        seconds.append(sec)
        if (t + 1) % period == 0:
            acted += _end_period(scn, policy, plant, seconds, t + 1, tally)
            _changed(tally, float(t + 1), policy.budget, plant.batch_target)
            tally.periods_attainable += attainable
            tally.periods_attainable_at_mark += attainable_at_mark
            tally.record.append((float(t + 1), tally.last_ok, attainable, plant.batch_target))
            seconds, attainable, attainable_at_mark = [], True, True
        tally.actions += acted
        if scn.segment_at(t).kind == "oscillate" and not _disturbed(scn, t):
            tally.oscillation_actions += acted
            tally.oscillation_s += 1
    tally.weighted_at_end = sum(1 for w in plant.weights if w < 1.0)
    if isinstance(policy, Production):
        tally.decisions = dict(sorted(policy.decisions.items()))
    return tally


def _changed(tally: Tally, at: float, budget: float, cap: int) -> None:
    """Note the levers at second ``at`` if either moved since the last note."""
    if not tally.changes or tally.changes[-1][1:] != (budget, cap):
        tally.changes.append((at, budget, cap))


@dataclass(slots=True)
class OracleLedger:
    """What the oracle carries, second by second, in load units: the baseline first (what
    it cannot carry waits, and drains only as fast as what it can carry leaves spare: a
    slowdown's queue outlasts it), then the batch work it deferred (owed, not dropped),
    and what is left is room for optional work."""

    backlog: float = 0.0  # baseline it could not carry yet, in load-seconds
    batch_owed: float = 0.0  # batch work it deferred and has not served yet, the same

    def second(self, best: float, baseline: float, batch: float) -> float:
        """One second carrying at most ``best``: the optional work there was room for."""
        carried = min(best, self.backlog + baseline)
        self.backlog += baseline - carried
        self.batch_owed += batch
        paid = min(self.batch_owed, best - carried)
        self.batch_owed -= paid
        return best - carried - paid


DARK_S = 300  # a tripped rack's least time dark: a breaker reset, hosts booted, models loaded
SETTLE_AFTER_EVENT_S = 120.0  # the capacity controller's stabilisation window


def _disturbed(scn: ControlScenario, at_s: float) -> bool:
    """Whether an event (a breaker, a slowdown, bad readings) is on at ``at_s``, or ended
    less than a stabilisation window before: what the controllers do then answers the
    event, not the oscillation it falls in."""
    return any(
        e.at_s <= at_s < e.at_s + max(e.duration_s, 1.0) + SETTLE_AFTER_EVENT_S for e in scn.events
    )


def _end_period(
    scn: ControlScenario, policy: Policy, plant: PoolPlant, seconds: list[Second], now: int,
    tally: Tally,
) -> int:  # fmt: skip
    p = scn.pool
    tally.periods += 1
    ok = all(s.baseline_tpot_s <= p.tpot_slo_s and s.baseline_wait_s <= p.wait_slo_s
             for s in seconds)  # fmt: skip
    tally.periods_in_slo += ok
    tally.last_ok = ok
    slow = any(s.baseline_tpot_s > p.tpot_slo_s for s in seconds)
    queued = any(s.baseline_wait_s > p.wait_slo_s for s in seconds)
    cause = "both" if slow and queued else "tpot" if slow else "wait" if queued else ""
    tally.out_causes.append(cause)
    noise = 1 + plant.rng.gauss(0.0, scn.sensor_noise_ratio)
    tpot = max(s.baseline_tpot_s for s in seconds) / p.tpot_slo_s * noise
    load = sum(s.load_ratio for s in seconds) / len(seconds)
    base = sum(s.baseline_ratio for s in seconds) / len(seconds)
    reading = Reading(tpot, load, base, noise)
    if scn.events_at(now, "stale"):
        reading = Reading(None, None)
    elif scn.events_at(now, "nan"):
        reading = Reading(math.nan, math.nan)
    elif spikes := scn.events_at(now, "spike"):
        reading = Reading(tpot * spikes[0].factor, load, base, noise)
    acted = policy.period(now, reading, plant)
    # each budget at the time it was decided: the static and HPA policies decide as the
    # period ends; the planner closes a period at the first event of the next, and what it
    # decided at the start of this period is what ran through it (until a cut for a slowdown
    # it saw within the period: that is the next period's entry, as a cut at this period's
    # end would be; the slowdown's own figures are timed to the second, from ``changes``)
    if isinstance(policy, Production):
        began = now - max(1, round(scn.period_s))
        tally.budgets.append((began, next(b for t, b, _ in reversed(tally.changes) if t <= began)))
    else:
        tally.budgets.append((now, policy.budget))
    return acted


def _step_response(scn: ControlScenario, tally: Tally) -> dict[str, float | None]:
    """After each step of 20% or more: periods to the first budget change, to settling
    within 5% of the budget it ends at (and staying), and the overshoot past that budget,
    up to the next event (a step taken while an event is on is not scored: its budget
    answers the event). Steps up in load (where optional work must give way) and down are
    kept apart; the worst of each kind is reported."""
    worst: dict[str, float | None] = {}
    segments = scn.baseline
    for k, seg in enumerate(segments):
        if seg.kind != "step" or k == 0:
            continue
        before = segments[k - 1]  # where it stood: a ramp's end, an oscillation's middle
        was = before.to if before.kind == "ramp" and before.to is not None else before.level
        if abs(seg.level - was) < 0.2 * max(was, 1e-9):
            continue
        if any(e.active(seg.at_s) for e in scn.events):
            continue  # in a slowdown, a breaker event or a silence: not a step's response
        end = segments[k + 1].at_s if k + 1 < len(segments) else scn.duration_s
        # up to the next event too: a breaker or a slowdown is not the step's settling
        end = min([end, *(e.at_s for e in scn.events if seg.at_s < e.at_s < end)])
        run = [b for t, b in tally.budgets if seg.at_s < t <= end]
        prior = [b for t, b in tally.budgets if t <= seg.at_s]
        if not run or not prior:
            continue
        tail = run[-max(1, len(run) // 4) :]
        final = sum(tail) / len(tail)
        band = max(0.05 * final, 0.005)
        reaction = next((i + 1 for i, b in enumerate(run) if b != prior[-1]), None)
        settle = len(run)
        for i in range(len(run) - 1, -1, -1):
            if abs(run[i] - final) > band:
                break
            settle = i + 1
        load_up = seg.level > was  # the budget must fall to its new level
        past = max((final - b) if load_up else (b - final) for b in run)
        overshoot = max(0.0, past) / final if final > 0 else 0.0
        suffix = "_after_step" if load_up else "_after_step_down"
        values: dict[str, float | None] = {
            "reaction_periods": reaction,
            "settling_periods": settle,
            "overshoot_ratio": overshoot,
        }  # a step never reacted to is None: worse than any number of periods
        for key, value in values.items():
            old = worst.get(key + suffix, 0.0)
            worst[key + suffix] = None if value is None or old is None else max(old, value)
    return worst


SHORTFALL_CAUSES = ("tpot", "wait", "both", "drain")


def _shortfall_by_cause(tally: Tally) -> dict[str, int]:
    """The periods out of the SLO that the oracle kept within it, by what put them out: a
    second's TPOT over the SLO (``tpot``), baseline work queued past the wait SLO
    (``wait``), both, or ``drain``: a queue still draining from a stretch the oracle could
    not hold either (the oracle serves at exactly the SLO's token time, so its queue drains
    sooner, and the stretch is out for both until it has). Every cause is listed, 0 too."""
    out = dict.fromkeys(SHORTFALL_CAUSES, 0)
    draining = False  # in a run of periods out of the SLO that began unattainable
    for (_, ok, attainable, _), cause in zip(tally.record, tally.out_causes, strict=True):
        draining = not ok and (draining or not attainable)
        if not ok and attainable:
            out["drain" if draining else cause] += 1
    return out


def _slowdown_response(scn: ControlScenario, tally: Tally) -> dict[str, Any]:
    """After each slowdown (TPOT up, load unchanged), worst over them: periods until the
    optional budget and the batch cap were cut (the seconds from its start to the cut, in
    periods rounded up, so a cut 3 s on is within one wherever in a period the slowdown
    began; 0: no need, as nothing was admitted, the
    budget was never cut and the SLO held throughout, or the cap was already under what
    the slowed speed allows; None: never, though it was needed),
    and how many periods the baseline stayed out of its SLO after the slowdown ended, ours
    and the oracle's (whose backlog drains too).

    Slowdowns that overlap are one slowdown while they do: the plant runs at the strongest
    one on. One that begins inside a stronger one slows nothing as it begins (nothing to
    cut for it), and a slowdown has ended only when no other is still on (the breach after
    it is counted from there, not from the end of one while another still slows the pool)."""
    period = max(1.0, scn.period_s)
    p = scn.pool
    out: dict[str, Any] = {}
    slowdowns = [e for e in scn.events if e.kind == "slowdown"]

    def in_force(lever: int, at: float) -> float | None:
        """The budget (``lever`` 1) or batch cap (2) in force at second ``at``."""
        known = [c[lever] for c in tally.changes if c[0] <= at]
        return known[-1] if known else None

    def cut_after(lever: int, start: float, stop: float) -> int | None:
        """Periods from ``start`` to the first cut of ``lever`` by ``stop``: the seconds
        to it in periods, rounded up (a cut 3 s after a slowdown began is within one
        period, wherever in a period it began); None if there was none."""
        was = in_force(lever, start)
        for change in tally.changes:
            if was is not None and start < change[0] <= stop and change[lever] < was:
                return max(1, math.ceil((change[0] - start) / period - 1e-9))
        return None

    for e in slowdowns:
        start, end = e.at_s, e.at_s + max(e.duration_s, 1.0)
        others = [x for x in slowdowns if x is not e]
        slows = e.ratio > max((x.ratio for x in others if x.active(start)), default=1.0)
        while over := [x for x in others if x.active(end)]:  # another still slows the pool
            end = max(x.at_s + max(x.duration_s, 1.0) for x in over)
        cut = cut_after(1, start, end + period)
        if in_force(1, start) == 0.0:
            cut = 0  # nothing to cut
        elif cut is None and all(ok for t, ok, _, _ in tally.record if start < t <= end + period):
            cut = 0  # never cut, and the SLO held throughout: there was no need to
        batch = cut_after(2, start, end + period)
        # the largest batch within the SLO at full clocks once it began (a slowdown inside a
        # stronger one slows nothing); a cap already under it had nothing to cut
        # (a slowdown of a second or less is over by then: its own ratio)
        ratio = max([e.ratio, *(x.ratio for x in slowdowns if x.active(start + 1))])
        unit_s = p.tpot_base_s * ratio * (1 + p.spread_ratio)
        cap = in_force(2, start)
        if cap is not None and cap <= SLOT_SHARE * (p.tpot_slo_s / unit_s - 1.0):
            batch = 0
        if not slows:  # it began inside a stronger one: nothing slowed more, nothing to cut
            cut = batch = 0
        after = [r for r in tally.record if r[0] > end]
        ours = next((k for k, r in enumerate(after) if r[1]), len(after))
        oracle = next((k for k, r in enumerate(after) if r[2]), len(after))
        for key, value in (("slowdown_budget_cut_periods", cut),
                           ("slowdown_batch_cut_periods", batch),
                           ("breach_after_slowdown_periods", ours),
                           ("breach_after_slowdown_periods_oracle", oracle)):  # fmt: skip
            old = out.get(key, 0)
            out[key] = None if value is None or old is None else max(old, value)
    return out


def run_eval_control(scn: ControlScenario) -> dict[str, Any]:
    out: dict[str, Any] = {"scenario": scn.name, "period_s": scn.period_s,
                           "duration_s": scn.duration_s}  # fmt: skip
    for name in POLICIES:
        t = run_policy(scn, name)
        suffix = "" if name == "ours" else f"_{name}"
        out[f"slo_attainment{suffix}"] = round(t.periods_in_slo / max(1, t.periods), 5)
        if name == "ours":  # the oracle's: the same draws for every policy
            out["slo_attainment_oracle"] = round(t.periods_attainable / max(1, t.periods), 5)
            # the same oracle held to the router's admission mark: what this plant's router
            # admits whatever the levers do (ours only: the others' FIFO router has no mark)
            out["slo_attainment_oracle_at_mark"] = round(
                t.periods_attainable_at_mark / max(1, t.periods), 5
            )
            out["harvest_vs_oracle_at_mark"] = (
                round(t.harvested / t.oracle_at_mark, 4) if t.oracle_at_mark else 0.0
            )
        out[f"harvest_vs_oracle{suffix}"] = round(t.harvested / t.oracle, 4) if t.oracle else 0.0
        out[f"breaker_violations{suffix}"] = t.trips
        # what a capped device's own requests see (the pool's p95 hides a few of them)
        out[f"held_device_seconds{suffix}"] = t.held_device_s
        if t.held_device_s:
            out[f"held_device_over_slo_ratio{suffix}"] = round(
                t.held_over_slo_s / t.held_device_s, 4
            )
        out[f"over_limit_rack_seconds{suffix}"] = t.over_limit_s
        out[f"actions{suffix}"] = t.actions
        # a scenario with no undisturbed oscillation has no such rate (not a rate of 0: a
        # family's mean would count it as a calm one); what the rate is taken of is kept, and
        # a family pools it (a rate over a 79-s window is one action away from 3.8 per 300 s)
        if t.oscillation_s:
            out[f"actions_per_300s_oscillation{suffix}"] = round(
                t.oscillation_actions * 300 / t.oscillation_s, 3
            )
        out[f"oscillation_actions{suffix}"] = t.oscillation_actions
        out[f"oscillation_seconds{suffix}"] = int(t.oscillation_s)
        for key, value in _step_response(scn, t).items():
            out[f"{key}{suffix}"] = None if value is None else round(value, 3)
        if name == "ours":
            out.update(_slowdown_response(scn, t))
            out["shortfall_periods_by_cause"] = _shortfall_by_cause(t)
            # power-aware routing: what it decided, and whether every weight came back
            out["decisions"] = t.decisions
            out["replicas_weighted_at_end"] = t.weighted_at_end
    return out


def format_control(result: dict[str, Any]) -> str:
    rows = [
        ("baseline periods within SLO", "slo_attainment", "{:.4%}"),
        ("... the oracle's (the SLO attainable)", "slo_attainment_oracle", "{:.4%}"),
        ("optional work vs oracle", "harvest_vs_oracle", "{:.1%}"),
        ("... oracle at the router's mark", "slo_attainment_oracle_at_mark", "{:.4%}"),
        ("optional work vs that oracle", "harvest_vs_oracle_at_mark", "{:.1%}"),
        ("breaker trips", "breaker_violations", "{}"),
        ("rack-seconds over the limit", "over_limit_rack_seconds", "{}"),
        ("capped device-seconds", "held_device_seconds", "{}"),
        ("... with TPOT over the SLO", "held_device_over_slo_ratio", "{:.1%}"),
        ("control actions", "actions", "{}"),
        ("actions per 300 s, +-5% oscillation", "actions_per_300s_oscillation", "{}"),
        ("periods to react, load step up", "reaction_periods_after_step", "{:g}"),
        ("periods to settle, load step up", "settling_periods_after_step", "{:g}"),
        ("overshoot, load step up", "overshoot_ratio_after_step", "{:.1%}"),
        ("periods to react, load step down", "reaction_periods_after_step_down", "{:g}"),
        ("periods to settle, load step down", "settling_periods_after_step_down", "{:g}"),
        ("periods to cut optional work, slowdown", "slowdown_budget_cut_periods", "{:g}"),
        ("periods to cut the batch cap, slowdown", "slowdown_batch_cut_periods", "{:g}"),
        ("periods out of SLO after a slowdown", "breach_after_slowdown_periods", "{:g}"),
        ("... the oracle's", "breach_after_slowdown_periods_oracle", "{:g}"),
    ]
    lines = [
        f"control on {result['scenario']} ({result['duration_s']:g} s, "
        f"period {result['period_s']:g} s)",
        "",
    ]
    lines.append(f"{'':<38}{'ours':>12}{'static':>12}{'HPA-style':>12}")
    for label, key, fmt in rows:
        cells = [
            "-"
            if key + s not in result
            else "never"
            if result[key + s] is None
            else fmt.format(result[key + s])
            for s in SUFFIXES
        ]
        lines.append(f"{label:<38}" + "".join(f"{c:>12}" for c in cells))
    if causes := result.get("shortfall_periods_by_cause"):
        lines += ["", "periods out of SLO that the oracle kept (ours), by cause: "
                      + causes_line(causes)]  # fmt: skip
    routed = {k: v for k, v in result.get("decisions", {}).items() if k.startswith("power_routing")}
    if routed:
        said = ", ".join(f"{k.split('/', 1)[1]} {v}" for k, v in routed.items())
        left = result.get("replicas_weighted_at_end", 0)
        lines += ["", f"power-aware routing (ours): {said}; replicas still weighted down at the "
                      f"end: {left}"]  # fmt: skip
    return "\n".join(lines)


def causes_line(causes: dict[str, int]) -> str:
    """The shortfall's causes in words, for the text reports."""
    names = {"tpot": "a second's TPOT", "wait": "queued work", "both": "both",
             "drain": "draining a queue the oracle had too"}  # fmt: skip
    return ", ".join(f"{names[k]} {causes.get(k, 0)}" for k in SHORTFALL_CAUSES)
