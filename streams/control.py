"""Capacity, batch and power control: telemetry per period in, throttle commands out.

:class:`ControlPlanner` gathers, per control period of event time:

- per pool, from serving telemetry: for each model it serves, the TPOT p95
  that 95% of the model's requests were served within (replica p95s weighted
  by requests), the slowest model's standing for the pool; and each
  replica's batch and queue; at the period's end the pool's
  :class:`~controllers.capacity.CapacityController` sets its optional-work
  budget (latency over the SLO, and load over the batch slots the TPOT guard
  allows) and its :class:`~controllers.tpot_guard.TpotGuard` its batch-size
  target;
- per rack, from PDU readings (the phases summed) and accelerator telemetry
  (each device's draw and power limit): its
  :class:`~controllers.power.PowerController` caps or lifts devices, those
  busiest with optional work first (criticality is the share of a device's
  recent requests that were baseline work).

Every step that changes something (or starts refusing to, for a reason an SRE
would ask about: SLO breach, stale or invalid input, the global budget) is a
:class:`~schemas.verdicts.Decision` with its reason and, for the budget, the
P, I and D terms; with a signing key it is also a signed
``ThrottleCommand`` (budget and batch size to the pool's router, caps and
clock mode to the device's node, batch moves to the router of the pool the
work is in). A rack whose caps hold, or that caps and clocks cannot bring
under, has its deferrable batch work (serving telemetry's ``batch_requests``)
moved to the pool with the most headroom, and back once the rack is calm.

``control.plan`` adapts it to faust. One instance sees every pool and rack
(serving telemetry is keyed by node, PDU readings by PDU).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import faust

from controllers.capacity import (
    CapacityConfig,
    CapacityController,
    CapacityReason,
    GlobalBudget,
    LeverConfig,
    split_levers,
)
from controllers.power import (
    DevicePower,
    PowerConfig,
    PowerController,
    PowerLever,
    PowerPlan,
    PowerReason,
)
from controllers.tpot_guard import BatchReason, TpotGuard, TpotGuardConfig
from schemas.codec import DecodeError, decode, encode
from schemas.commands import ClockMode, Target, ThrottleAction, ThrottleCommand
from schemas.events import AcceleratorTelemetry, PduReading, ServingMetrics
from schemas.topics import ACCELERATOR, DECISIONS, PDU, SERVING, THROTTLE_COMMANDS, TopicSpec
from schemas.verdicts import Decision, DecisionOutcome
from streams.controller_metrics import ControllerMetrics
from streams.issuing import IssuerWiring, issue

NOTEWORTHY = {
    CapacityReason.SLO_BREACH,
    CapacityReason.STALE_INPUT,
    CapacityReason.INVALID_INPUT,
    CapacityReason.GLOBAL_BUDGET,
}


@dataclass(frozen=True, slots=True)
class ControlWiring(IssuerWiring):
    issuer: str = "control"
    command_ttl_s: float = 30.0
    period_s: float = 10.0
    tpot_slo_s: float = 0.08
    global_budget_devices: float = math.inf  # optional work the whole fleet may run at once
    min_cap_ratio: float = 0.4  # lowest cap asked for, as a share of the device's default
    # decode time per token grows with the batch as (1 + batch / tpot_doubling_batch): what
    # turns a replica's TPOT and batch into the batch it can run within the SLO
    tpot_doubling_batch: float = 128.0
    capacity: CapacityConfig = field(default_factory=CapacityConfig)
    levers: LeverConfig = field(default_factory=LeverConfig)
    tpot_guard: TpotGuardConfig = field(default_factory=TpotGuardConfig)
    power: PowerConfig = field(default_factory=PowerConfig)


@dataclass(slots=True)
class _Pool:
    capacity: CapacityController
    guard: TpotGuard
    period: int = -1
    # per model: (replica TPOT p95, requests) this period
    tpot: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    # per replica: batch, queue, share of its requests that was baseline work, TPOT p95
    replicas: dict[str, tuple[int, int, float, float | None]] = field(default_factory=dict)
    said: CapacityReason | None = None  # the last reason a decision recorded
    room_replicas: float = 0.0  # headroom at the last close, in replicas' worth of slots


@dataclass(slots=True)
class _Rack:
    power: PowerController
    period: int = -1
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)  # watts, limit
    batch_moved: dict[str, str] = field(default_factory=dict)  # pool -> the pool taking it


@dataclass(slots=True)
class _Device:
    node_id: str
    rack_id: str
    draw_watts: float
    cap_watts: float
    default_watts: float
    low_clock: bool = False
    baseline_share: float = 1.0  # of what it served lately, the share that was not optional
    batch_share: float = 0.0  # of what it served lately, the share that was batch work
    pool: str | None = None


@dataclass(frozen=True, slots=True)
class Output:
    decision: Decision
    command: ThrottleCommand | None


class ControlPlanner:
    """See the module docstring."""

    def __init__(self, w: ControlWiring, *, new_id: Callable[[], uuid.UUID] = uuid.uuid4) -> None:
        self.w = w
        self.new_id = new_id
        self.pools: dict[str, _Pool] = {}
        self.racks: dict[str, _Rack] = {}
        self.devices: dict[str, _Device] = {}
        # rack -> its devices, in the order first seen (a rack's close reads its own)
        self.rack_devices: dict[str, list[str]] = {}
        self.global_budget = GlobalBudget(w.global_budget_devices)

    def _period(self, at: datetime) -> int:
        return int(at.timestamp() // self.w.period_s)

    def _end(self, period: int) -> datetime:
        return datetime.fromtimestamp((period + 1) * self.w.period_s, UTC)

    # -- inputs ---------------------------------------------------------------------------

    def serving(self, m: ServingMetrics) -> list[Output]:
        pool = self.pools.get(m.pool)
        if pool is None:
            pool = self.pools[m.pool] = _Pool(
                CapacityController(self.w.capacity), TpotGuard(self.w.tpot_guard)
            )
        period, out = self._period(m.observed_at), []
        if period > pool.period >= 0:
            out = self._close_pool(m.pool, pool)
        if period >= pool.period:
            pool.period = period
            if m.tpot_p95_s is not None:
                pool.tpot.setdefault(m.model, []).append((m.tpot_p95_s, max(m.requests, 1)))
            baseline = 1.0
            device = self.devices.get(m.device_uuid or "")
            if device is not None:
                device.pool = m.pool
                if m.batch_requests is not None and m.requests > 0:
                    batch = m.batch_requests / m.requests
                    device.batch_share += 0.2 * (batch - device.batch_share)
            if m.optional_requests is not None and m.requests > 0:
                baseline = 1.0 - m.optional_requests / m.requests
                if device is not None:  # a device busy with optional work is capped first
                    device.baseline_share += 0.2 * (baseline - device.baseline_share)
            pool.replicas[m.replica_id] = (m.batch_size, m.queue_depth, baseline, m.tpot_p95_s)
        return out

    def accelerator(self, t: AcceleratorTelemetry) -> None:
        if t.power_usage_watts is None or t.power_limit_watts is None:
            return
        d = self.devices.get(t.device_uuid)
        if d is None:
            self.rack_devices.setdefault(t.rack_id, []).append(t.device_uuid)
            d = self.devices[t.device_uuid] = _Device(
                t.node_id, t.rack_id, t.power_usage_watts, t.power_limit_watts,
                t.power_limit_watts,
            )  # fmt: skip
        d.draw_watts, d.cap_watts = t.power_usage_watts, t.power_limit_watts
        d.default_watts = max(d.default_watts, t.power_limit_watts)

    def pdu(self, r: PduReading) -> list[Output]:
        rack = self.racks.get(r.rack_id)
        if rack is None:
            rack = self.racks[r.rack_id] = _Rack(PowerController(self.w.power))
        period, out = self._period(r.observed_at), []
        if period > rack.period >= 0:
            out = self._close_rack(r.rack_id, rack)
        if period >= rack.period:
            rack.period = period
            rack.phases[r.phase.value] = (r.power_watts, r.breaker_limit_watts)
        return out

    # -- period ends ----------------------------------------------------------------------

    def _close_pool(self, name: str, pool: _Pool) -> list[Output]:
        w, end = self.w, self._end(pool.period)
        # each model is held to the SLO on its own: the pool answers for its slowest
        per_model = [_pool_p95(samples) for samples in pool.tpot.values()]
        tpot = max((t for t in per_model if t is not None), default=None)
        replicas = pool.replicas
        pool.tpot, pool.replicas = {}, {}
        # what the pool can run: each replica's batch target, or less where its TPOT would
        # pass the latency setpoint first
        slots = max(1e-9, sum(self._room(b, replica_tpot, pool.guard.target)
                              for b, _, _, replica_tpot in replicas.values()))  # fmt: skip
        load = sum(b + q for b, q, _, _ in replicas.values()) / slots
        # the work that is not optional: what the budget must leave room for (feedforward)
        base = sum((b + q) * share for b, q, share, _ in replicas.values()) / slots
        before = pool.capacity.budget
        d = pool.capacity.step(
            now=end.timestamp(),
            latency_ratio=None if tpot is None else tpot / w.tpot_slo_s,
            load_ratio=load,
            baseline_ratio=base if replicas else None,
        )
        pool.room_replicas = max(0.0, w.capacity.load_setpoint_ratio - base) * len(replicas)
        granted = self.global_budget.grant(name, d.applied, float(len(replicas)))
        if pool.capacity.limit(granted):
            d = replace(
                d, applied=granted, reason=CapacityReason.GLOBAL_BUDGET,
                message=f"{d.message}; the fleet's optional-work limit leaves {granted:.3f}",
            )  # fmt: skip
        out = []
        # a change is always recorded; a noteworthy hold once, when it starts
        if d.applied != before or (d.reason in NOTEWORTHY and d.reason is not pool.said):
            pool.said = d.reason
            spend = split_levers(d.applied, base, w.levers)
            out.append(self._output(
                end, name, "capacity", ThrottleAction.OPPORTUNISTIC_BUDGET, d.reason.value,
                f"{d.message}; spent as {spend.funnel_extra:.2f} extra candidates per request, "
                f"{spend.upgrade_ratio:.0%} of requests on the bigger model",
                Target(pool=name), changed=d.applied != before,
                extra={"desired": d.desired, "applied": d.applied, "p_term": d.p,
                       "i_term": d.i, "d_term": d.d},
                params={"opportunistic_budget_ratio": round(d.applied, 4),
                        "funnel_extra_candidates": round(spend.funnel_extra, 3),
                        "upgrade_ratio": round(spend.upgrade_ratio, 4)},
            ))  # fmt: skip
        in_use = max((b for b, _, _, _ in replicas.values()), default=None)
        b = pool.guard.step(tpot_p95_s=tpot, slo_s=w.tpot_slo_s, batch_in_use=in_use)
        if b.reason in (BatchReason.TPOT_HIGH, BatchReason.TPOT_LOW):
            out.append(self._output(
                end, name, "tpot_guard", ThrottleAction.BATCH_SIZE, b.reason.value, b.message,
                Target(pool=name), changed=True,
                extra={"desired": float(b.target), "applied": float(b.target)},
                params={"batch_size_max": b.target},
            ))  # fmt: skip
        return out

    def _room(self, batch: int, tpot_p95_s: float | None, target: int) -> float:
        """The batch a replica can run with its TPOT p95 at the latency setpoint."""
        if tpot_p95_s is None or tpot_p95_s <= 0:
            return float(target)
        k, w = self.w.tpot_doubling_batch, self.w
        base_s = tpot_p95_s / (1.0 + batch / k)  # its TPOT at a batch of one
        allowed_s = w.capacity.setpoint_ratio * w.tpot_slo_s
        return min(float(target), max(0.0, k * (allowed_s / base_s - 1.0)))

    def _close_rack(self, rack_id: str, rack: _Rack) -> list[Output]:
        w, end = self.w, self._end(rack.period)
        draw = sum(p for p, _ in rack.phases.values()) if rack.phases else None
        limit = sum(lim for _, lim in rack.phases.values())
        rack.phases = {}
        members = {u: self.devices[u] for u in self.rack_devices.get(rack_id, ())}
        plan = rack.power.step(
            now=end.timestamp(), draw_watts=draw, limit_watts=limit,
            devices=[
                DevicePower(u, round(10 * d.baseline_share), d.draw_watts, d.cap_watts,
                            w.min_cap_ratio * d.default_watts, d.default_watts, d.low_clock,
                            batch_watts=d.batch_share * d.draw_watts)
                for u, d in members.items()
            ],
        )  # fmt: skip
        if plan.reason in (PowerReason.HOLD, PowerReason.INVALID_INPUT) and not plan.actions:
            return []
        out = []
        for a in plan.actions:
            d = members[a.device_uuid]
            target = Target(node_id=d.node_id, device_uuid=a.device_uuid, rack_id=rack_id)
            if a.lever is PowerLever.CAP and a.watts is not None:
                d.cap_watts = a.watts
                params: dict[str, Any] = {"power_limit_watts": a.watts}
                action = ThrottleAction.POWER_CAP
            else:
                d.low_clock = a.lever is PowerLever.LOW_CLOCK
                params = {"clock_mode": ClockMode.LOW if d.low_clock else ClockMode.DEFAULT}
                action = ThrottleAction.CLOCK_MODE
            out.append(self._output(
                end, rack_id, "power", action, plan.reason.value, plan.message, target,
                changed=True, extra={"rack_id": rack_id, "applied": a.watts}, params=params,
            ))  # fmt: skip
        if plan.move_batch_watts > 0 or plan.return_batch_watts > 0:
            out += self._move_batch(end, rack_id, rack, members, plan)
        return out

    def _move_batch(
        self, end: datetime, rack_id: str, rack: _Rack, members: dict[str, _Device],
        plan: PowerPlan,
    ) -> list[Output]:  # fmt: skip
        """Batch work off the rack, to the pool with the most headroom (its own pool's
        other racks, if that is the one); or back, when the plan gives it back."""
        if plan.return_batch_watts > 0:
            moves = {src: 0.0 for src in rack.batch_moved}
            rack.batch_moved = {}
            if not moves:
                return []  # nothing of this rack's is away
        else:
            sources = {d.pool for d in members.values() if d.pool and d.batch_share > 0}
            moves = {src: 1.0 for src in sorted(sources) if src not in rack.batch_moved}
        if not moves:
            decision = Decision(
                decision_id=self.new_id(), decided_at=end, controller="power", target=rack_id,
                rack_id=rack_id, action="move_batch", outcome=DecisionOutcome.ADVISORY,
                reason=plan.reason.value, desired=plan.move_batch_watts,
                message=f"{plan.message}; no batch work on the rack to move",
            )  # fmt: skip
            return [Output(decision, None)]
        out: list[Output] = []
        room = {p: pool.room_replicas for p, pool in self.pools.items()}
        for src, ratio in moves.items():
            # what it takes where it goes: each device's batch share, in replicas' worth
            need = sum(d.batch_share for d in members.values() if d.pool == src)
            to = rack.batch_moved.get(src) or max(
                room, key=lambda p: (room[p], p == src), default=src
            )
            if ratio > 0 and room.get(to, 0.0) < need:
                continue  # no pool has the headroom for it: it stays, and the caps hold
            if ratio > 0:
                rack.batch_moved[src] = to
                room[to] -= need
            where = "its other racks" if to == src else to
            out.append(self._output(
                end, rack_id, "power", ThrottleAction.MOVE_BATCH, plan.reason.value,
                f"{plan.message}: {src}'s batch work on {rack_id} "
                + (f"to {where}" if ratio > 0 else "back"),
                Target(pool=src, rack_id=rack_id), changed=True,
                extra={"rack_id": rack_id, "desired": plan.move_batch_watts or None,
                       "applied": ratio},
                params={"batch_move_ratio": ratio, "to_pool": to if ratio > 0 else None},
            ))  # fmt: skip
        return out

    def _output(
        self, at: datetime, target_name: str, controller: str, action: ThrottleAction,
        reason: str, message: str, target: Target, *, changed: bool, extra: dict[str, Any],
        params: dict[str, Any],
    ) -> Output:  # fmt: skip
        decision_id = self.new_id()
        command = None
        if changed:
            command = issue(
                ThrottleCommand, self.w, at=at, decision_id=decision_id, new_id=self.new_id,
                target=target, reason=reason, message=message[:1024], action=action, **params,
            )  # fmt: skip
        outcome = DecisionOutcome.ISSUED if command is not None else DecisionOutcome.ADVISORY
        decision = Decision(
            decision_id=decision_id, decided_at=at, controller=controller, target=target_name,
            pool=target.pool, action=action.value, outcome=outcome, reason=reason,
            message=message[:1024], command_id=None if command is None else command.command_id,
            **extra,
        )  # fmt: skip
        return Output(decision, command)


def _pool_p95(samples: list[tuple[float, int]]) -> float | None:
    """A model's TPOT p95 in a pool from its replicas' (p95, requests): the replica p95
    that 95% of the period's requests were served at or under. One slow replica that serves
    few (a device being drained, say) does not stop the pool's optional work; one that
    serves a twentieth of them does."""
    if not samples:
        return None
    total = sum(n for _, n in samples)
    seen = 0
    for tpot, n in sorted(samples):
        seen += n
        if seen >= 0.95 * total:
            return tpot
    return max(t for t, _ in samples)


def add_control(app: faust.App, w: ControlWiring, shared: ControllerMetrics) -> list[TopicSpec]:
    """Register ``control.plan`` on ``app``; returns the topics it reads."""
    planner = ControlPlanner(w)
    specs = {w.topic_prefix + s.name: s for s in (SERVING, PDU, ACCELERATOR)}
    source = app.topic(*specs, value_type=bytes, key_type=bytes)
    commands = app.topic(w.topic_prefix + THROTTLE_COMMANDS.name, value_type=bytes, key_type=bytes)
    decisions = app.topic(w.topic_prefix + DECISIONS.name, value_type=bytes, key_type=bytes)
    reasons = [*CapacityReason, *BatchReason, *PowerReason]
    for controller in ("capacity", "tpot_guard", "power"):
        shared.declare(controller, [r.value for r in reasons])

    async def plan(stream: Any) -> None:
        async for events in stream.take_events(5_000, within=0.5):
            for e in events:
                spec = specs[e.message.topic]
                try:
                    if spec is ACCELERATOR:
                        planner.accelerator(decode(e.message.value, AcceleratorTelemetry))
                        continue
                    if spec is PDU:
                        made = planner.pdu(decode(e.message.value, PduReading))
                    else:
                        made = planner.serving(decode(e.message.value, ServingMetrics))
                except DecodeError:
                    continue  # ingest dead-letters it
                for o in made:
                    if o.command is not None:
                        await commands.send(
                            key=THROTTLE_COMMANDS.key_for(o.command), value=encode(o.command)
                        )
                        shared.commands.labels("ThrottleCommand", o.command.action.value).inc()
                    await decisions.send(
                        key=DECISIONS.key_for(o.decision), value=encode(o.decision)
                    )
                    shared.decisions.labels(
                        o.decision.controller, o.decision.outcome.value, o.decision.reason
                    ).inc()

    plan.__name__ = plan.__qualname__ = "control.plan"
    app.agent(source, name="control.plan", concurrency=1)(plan)
    return [SERVING, PDU, ACCELERATOR]
