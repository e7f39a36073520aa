"""The control role's power side: each rack's power controller and its batch moves.

Per rack, once per control period of event time (or at once when a reading puts
the rack over its target: a breaker's trip clock runs in seconds, a period is
ten), from PDU readings (the phases summed) and accelerator telemetry (each
device's draw and power limit), its
:class:`~controllers.power.PowerController` caps or lifts devices, those
busiest with optional work first (criticality is the share of a device's
recent requests that were baseline work, from serving telemetry). A rack whose
caps hold, or that caps and clocks cannot bring under, has its deferrable batch
work (serving telemetry's ``batch_requests``) moved to the pool with the most
headroom, and back once the rack is calm: a ``move_batch`` command to the
router of the pool the work is in.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from controllers.power import (
    MIN_ACTION_WATTS,
    DevicePower,
    PowerController,
    PowerLever,
    PowerPlan,
    PowerReason,
)
from planning.registry import POWER
from planning.throttle import ControlOutput, ControlWiring, ThrottleIssuer
from schemas.commands import ClockMode, Target, ThrottleAction
from schemas.envelopes import AnyAcceleratorSample, DeviceReading, ReplicaReading
from schemas.events import PduPhase, PduReading


@dataclass(slots=True)
class _Rack:
    power: PowerController
    period: int = -1
    phases: dict[PduPhase, PduReading] = field(default_factory=dict)  # this period's last
    latest: dict[PduPhase, PduReading] = field(default_factory=dict)  # each phase's last
    closed_early: int = -1  # the period a reading over the target closed before its end
    closed_limit: float = float("inf")  # the breaker limit that early close acted on
    closed_draw: float = float("inf")  # the draw it acted on
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
    min_watts: float | None = None  # the driver's range, from telemetry; None: not reported
    max_watts: float | None = None

    def cap_range(self, min_cap_ratio: float) -> tuple[float, float]:
        """The caps this device may be asked for: never outside what its driver accepts.

        ``min_cap_ratio`` of its default is the deepest cap policy allows; a device that
        does not report its range is never capped (its clocks may still be lowered).
        """
        if self.min_watts is None or self.max_watts is None:
            return self.cap_watts, self.cap_watts
        top = min(self.default_watts, self.max_watts)
        return min(top, max(self.min_watts, min_cap_ratio * self.default_watts)), top


class RackPlanner(ThrottleIssuer):
    """Each rack's power controller on its PDU readings and devices: caps, clocks and
    batch moves, as decisions and commands. ``rooms`` says each pool's headroom, in replicas' worth,
    at its last close (where batch work may go); ``crowded``, the pools whose last close
    found baseline work waiting with no optional work left to give up (a rack serving one
    sizes its lifts for its draw now, not its lift window's peak)."""

    def __init__(
        self,
        wiring: ControlWiring,
        *,
        rooms: Callable[[], dict[str, float]],
        crowded: Callable[[], set[str]] = set,
        new_id: Callable[[], uuid.UUID] = uuid.uuid4,
    ) -> None:
        super().__init__(wiring, new_id=new_id)
        self.rooms = rooms
        self.crowded = crowded
        self.racks: dict[str, _Rack] = {}
        self.devices: dict[str, _Device] = {}
        # rack -> its devices, in the order first seen (a rack's close reads its own)
        self.rack_devices: dict[str, list[str]] = {}
        # racks their last plan left over the limit with every lever spent (watts over):
        # kept apart so a pool's close asks only about these, not every rack
        self.short: dict[str, float] = {}
        # caps just set under a device's draw (device, draw, cap), for the router's weights;
        # whoever routes takes them (:meth:`take_new_caps`)
        self.new_caps: list[tuple[str, float, float]] = []
        # what a previous planner of these racks held (:meth:`adopt`), for devices and racks
        # not seen here yet: their default watts and low-clock mode, their batch moves
        self.adopted: dict[str, tuple[float, bool]] = {}
        self.adopted_moves: dict[str, dict[str, str]] = {}
        self.adopted_controllers: dict[str, dict[str, Any]] = {}  # rack -> its memory

    def held(self) -> dict[str, Any]:
        """What our levers hold now, as JSON-able values: each device our cap or low clock
        holds down (its default watts, whether its clocks are low), each rack's batch
        work moved (pool -> the pool taking it) and the power controller of each rack that
        holds something. A planner that takes the racks over
        :meth:`adopt`-s it, so it lifts what this one set; without it, a cap set here looks
        like the device's default there and is never lifted."""
        devices = {u: [d.default_watts, d.low_clock] for u, d in self.devices.items()
                   if self.holds(u)}  # fmt: skip
        devices.update({u: [w, low] for u, (w, low) in self.adopted.items()})
        moves = {r: dict(rack.batch_moved) for r, rack in self.racks.items() if rack.batch_moved}
        moves.update({r: dict(m) for r, m in self.adopted_moves.items()})
        # the power controller of each rack that holds something: what it knows of the
        # rack's draw sizes the lift that gives it back (a window of troughs would lift
        # too much); a rack holding nothing needs none of it
        holding = {self.devices[u].rack_id for u in devices if u in self.devices} | set(moves)
        controllers = {r: rack.power.remember() for r, rack in sorted(self.racks.items())
                       if r in holding or rack.power.held}  # fmt: skip
        controllers.update(self.adopted_controllers)
        return {"devices": devices, "batch_moved": moves, "controllers": controllers}

    def adopt(self, held: dict[str, Any]) -> None:
        """Take over what :meth:`held` said another planner's levers hold."""
        for u, (default_watts, low_clock) in held["devices"].items():
            d = self.devices.get(u)
            if d is None:
                self.adopted[u] = (float(default_watts), bool(low_clock))
            else:
                d.default_watts = max(d.default_watts, float(default_watts))
                d.low_clock = d.low_clock or bool(low_clock)
        for rack_id, moves in held["batch_moved"].items():
            rack = self.racks.get(rack_id)
            if rack is None:
                self.adopted_moves[rack_id] = {str(src): str(to) for src, to in moves.items()}
            else:
                rack.batch_moved.update(moves)
        for rack_id, memory in held.get("controllers", {}).items():
            PowerController(self.wiring.power).recall(memory)  # refused here if unreadable
            rack = self.racks.get(rack_id)
            if rack is None:
                self.adopted_controllers[str(rack_id)] = memory
            else:
                rack.power.recall(memory)

    def take_new_caps(self) -> list[tuple[str, float, float]]:
        out, self.new_caps = self.new_caps, []
        return out

    def short_pools(self) -> dict[str, str]:
        """Pools with a device on a rack that its last plan left over its limit with every
        lever spent, each with the first such rack: their optional work must stop."""
        out: dict[str, str] = {}
        for rack_id in sorted(self.short):
            for u in self.rack_devices.get(rack_id, ()):
                pool = self.devices[u].pool
                if pool is not None:
                    out.setdefault(pool, rack_id)
        return out

    def expect_surge(self, pool: str) -> None:
        """The pool's tokens sped up: each rack serving it may draw up to its devices'
        room under their caps more, and that rise is known, not a trend."""
        for rack_id, rack in self.racks.items():
            room = sum(
                max(0.0, d.cap_watts - d.draw_watts)
                for d in (self.devices[u] for u in self.rack_devices.get(rack_id, ()))
                if d.pool == pool
            )
            if room > 0:
                rack.power.expect(room)

    def rack_of(self, device_uuid: str | None) -> str | None:
        d = self.devices.get(device_uuid or "")
        return None if d is None else d.rack_id

    def holds(self, device_uuid: str) -> bool:
        """Whether our cap or low-clock mode holds the device down."""
        d = self.devices.get(device_uuid)
        return d is not None and (d.low_clock or d.cap_watts < d.default_watts - 0.5)

    def at_floor(self, device_uuid: str) -> bool:
        """Whether the device's cap is at its driver's floor: no power lever left on it."""
        d = self.devices.get(device_uuid)
        return d is not None and d.min_watts is not None and d.cap_watts <= d.min_watts + 0.5

    def over_limit_watts(self, rack_id: str) -> float:
        """How far the rack's latest readings (each phase's last) draw over its breaker
        limit (0: within it): while over, the breaker's clock is running."""
        rack = self.racks.get(rack_id)
        if rack is None:
            return 0.0
        draw, limit = _summed(rack.latest)
        return 0.0 if draw is None else max(0.0, draw - limit)

    def spent(self, rack_id: str) -> bool:
        """Whether every device on the rack that our caps can reach is capped at its
        driver's floor: no power lever is left there."""
        reach = [u for u in self.rack_devices.get(rack_id, ()) if self.devices[u].max_watts]
        return bool(reach) and all(self.at_floor(u) for u in reach)

    def over_ratio(self, rack_id: str, pool: str, *, now_too: bool = False) -> float:
        """How far the rack is over its limit with every lever spent, as a share of what
        ``pool``'s devices on it draw (0: not over, or none of them there): what its last
        plan left over or (``now_too``: its caps at their floors were in force when it was
        read) what its readings draw over the breaker limit now, whichever is more."""
        over = self.short.get(rack_id, 0.0)
        if now_too:
            over = max(over, self.over_limit_watts(rack_id))
        if over <= 0:
            return 0.0
        draw = sum(
            d.draw_watts
            for d in (self.devices[u] for u in self.rack_devices.get(rack_id, ()))
            if d.pool == pool
        )
        return min(1.0, over / draw) if draw > 0 else 0.0

    def serving(self, metrics: ReplicaReading) -> None:
        """What a device served: its pool, and its shares of batch and baseline work."""
        device = self.devices.get(metrics.device_uuid or "")
        if device is None:
            return
        device.pool = metrics.pool
        if metrics.requests <= 0:
            return
        if metrics.batch_requests is not None:
            device.batch_share += 0.2 * (
                metrics.batch_requests / metrics.requests - device.batch_share
            )
        if (
            metrics.optional_requests is not None
        ):  # a device busy with optional work is capped first
            baseline = 1.0 - metrics.optional_requests / metrics.requests
            device.baseline_share += 0.2 * (baseline - device.baseline_share)

    def accelerator(self, telemetry: AnyAcceleratorSample) -> None:
        self.device(telemetry.node_id, telemetry.rack_id, telemetry)

    def device(self, node_id: str, rack_id: str, telemetry: DeviceReading) -> None:
        """One device's draw and power limit, on node ``node_id`` in rack ``rack_id``."""
        if telemetry.power_usage_watts is None or telemetry.power_limit_watts is None:
            return
        d = self.devices.get(telemetry.device_uuid)
        if d is None:
            self.rack_devices.setdefault(rack_id, []).append(telemetry.device_uuid)
            d = self.devices[telemetry.device_uuid] = _Device(
                node_id, rack_id, telemetry.power_usage_watts, telemetry.power_limit_watts,
                telemetry.power_limit_watts,
            )  # fmt: skip
            adopted = self.adopted.pop(telemetry.device_uuid, None)
            if adopted is not None:
                d.default_watts, d.low_clock = max(adopted[0], d.default_watts), adopted[1]
        d.draw_watts, d.cap_watts = telemetry.power_usage_watts, telemetry.power_limit_watts
        d.default_watts = max(d.default_watts, telemetry.power_limit_watts)
        d.min_watts, d.max_watts = telemetry.power_limit_min_watts, telemetry.power_limit_max_watts

    def pdu(self, reading: PduReading) -> list[ControlOutput]:
        rack = self.racks.get(reading.rack_id)
        if rack is None:
            rack = self.racks[reading.rack_id] = _Rack(PowerController(self.wiring.power))
            rack.batch_moved = self.adopted_moves.pop(reading.rack_id, {})
            memory = self.adopted_controllers.pop(reading.rack_id, None)
            if memory is not None:
                rack.power.recall(memory)
        period, out = self._period(reading.observed_at), []
        if period > rack.period >= 0:
            if rack.closed_early != rack.period:
                out = self._close_rack(reading.rack_id, rack, rack.phases, self._end(rack.period))
            rack.phases = {}
        if period >= rack.period:
            rack.period = period
            rack.phases[reading.phase] = rack.latest[reading.phase] = reading
            draw, limit = _summed(rack.latest)
            over = draw is not None and draw > self.wiring.power.target_ratio * limit
            # news to the rack's controller: the first reading over the target in its
            # period; one over a lower limit than the period's early close acted on (a
            # second feed lost: its trip clock may be shorter than what is left of the
            # period); or one over the limit itself that draws more than the close acted on
            # (the load rose past what it planned for, and the breaker's clock, shorter than
            # the period, has started). A draw still over after a close, and no higher, is
            # the caps in flight, judged at the period's end
            risen = draw is not None and draw > limit and draw > rack.closed_draw + MIN_ACTION_WATTS
            if over and (rack.closed_early != period or limit < rack.closed_limit or risen):
                # the breaker's clock is running: act on this reading, not at the period's end
                rack.closed_early, rack.closed_limit = period, limit
                rack.closed_draw = draw if draw is not None else float("inf")
                out += self._close_rack(reading.rack_id, rack, rack.latest, reading.observed_at)
        return out

    def _close_rack(
        self, rack_id: str, rack: _Rack, phases: dict[PduPhase, PduReading], end: datetime
    ) -> list[ControlOutput]:
        """One step of the rack's controller on ``phases`` (each phase's last reading)."""
        wiring = self.wiring
        draw, limit = _summed(phases)
        members = {u: self.devices[u] for u in self.rack_devices.get(rack_id, ())}
        crowded = self.crowded()
        plan = rack.power.step(
            now=end, draw_watts=draw, limit_watts=limit,
            waiting=any(d.pool in crowded for d in members.values()),
            devices=[
                DevicePower(u, round(10 * d.baseline_share), d.draw_watts, d.cap_watts,
                            *d.cap_range(wiring.min_cap_ratio), d.low_clock,
                            batch_watts=d.batch_share * d.draw_watts,
                            floor_watts=d.min_watts if d.max_watts is not None else None)
                for u, d in members.items()
            ],
        )  # fmt: skip
        if plan.short_watts > 0:
            self.short[rack_id] = plan.short_watts
        else:
            self.short.pop(rack_id, None)
        if plan.reason in (PowerReason.HOLD, PowerReason.INVALID_INPUT) and not plan.actions:
            return []
        out = []
        # each decision says why its own lever moved: a shed that also asks for batch work
        # to move lowered its caps and clocks because the rack was over its target
        lever_reason = (
            PowerReason.OVER_TARGET if plan.reason is PowerReason.MOVE_BATCH else plan.reason
        )
        for a in plan.actions:
            d = members[a.device_uuid]
            target = Target(node_id=d.node_id, device_uuid=a.device_uuid, rack_id=rack_id)
            if a.lever is PowerLever.CAP and a.watts is not None:
                if a.watts < d.draw_watts:
                    self.new_caps.append((a.device_uuid, d.draw_watts, a.watts))
                d.cap_watts = a.watts
                params: dict[str, Any] = {"power_limit_watts": a.watts}
                action = ThrottleAction.POWER_CAP
            else:
                d.low_clock = a.lever is PowerLever.LOW_CLOCK
                params = {"clock_mode": ClockMode.LOW if d.low_clock else ClockMode.DEFAULT}
                action = ThrottleAction.CLOCK_MODE
            out.append(self._output(
                end, rack_id, POWER, action, lever_reason.value, plan.message, target,
                changed=True, extra={"rack_id": rack_id, "applied": a.watts}, params=params,
            ))  # fmt: skip
        if plan.move_batch_watts > 0 or plan.return_batch_watts > 0:
            out += self._move_batch(end, rack_id, rack, members, plan)
        return out

    def _move_batch(
        self, end: datetime, rack_id: str, rack: _Rack, members: dict[str, _Device],
        plan: PowerPlan,
    ) -> list[ControlOutput]:  # fmt: skip
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
        out: list[ControlOutput] = []
        if not moves:
            out.append(self._stays(end, rack_id, None, plan, plan.move_batch_watts,
                                   "no batch work on the rack to move"))  # fmt: skip
        room = dict(self.rooms())
        for src, ratio in moves.items():
            # what it takes where it goes: each device's batch share, in replicas' worth
            need = sum(d.batch_share for d in members.values() if d.pool == src)
            to = rack.batch_moved.get(src) or max(
                room, key=lambda p: (room[p], p == src), default=src
            )
            if ratio > 0 and room.get(to, 0.0) < need:
                # no pool has the headroom for it: it stays, the caps hold, and the
                # controller asks again once they have held long enough
                out.append(self._stays(
                    end, rack_id, src, plan, need,
                    f"{src}'s batch work ({need:.1f} replicas' worth) stays: the most room "
                    f"any pool has is {room.get(to, 0.0):.1f}",
                ))  # fmt: skip
                continue
            if ratio > 0:
                rack.batch_moved[src] = to
                room[to] -= need
            where = "its other racks" if to == src else to
            out.append(self._output(
                end, rack_id, POWER, ThrottleAction.MOVE_BATCH, plan.reason.value,
                f"{plan.message}: {src}'s batch work on {rack_id} "
                + (f"to {where}" if ratio > 0 else "back"),
                Target(pool=src, rack_id=rack_id), changed=True,
                extra={"rack_id": rack_id, "desired": plan.move_batch_watts or None,
                       "applied": ratio},
                params={"batch_move_ratio": ratio, "to_pool": to if ratio > 0 else None},
            ))  # fmt: skip
        if plan.move_batch_watts > 0 and not rack.batch_moved:
            rack.power.batch_stayed()
        return out

    def _stays(
        self, end: datetime, rack_id: str, pool: str | None, plan: PowerPlan, desired: float,
        why: str,
    ) -> ControlOutput:  # fmt: skip
        """An advisory decision: batch work the plan asked to move stays on the rack."""
        applied = None if pool is None else 0.0  # nothing to apply when no pool was named
        return self._output(
            end, rack_id, POWER, ThrottleAction.MOVE_BATCH, plan.reason.value,
            f"{plan.message}; {why}", Target(pool=pool, rack_id=rack_id), changed=False,
            extra={"rack_id": rack_id, "desired": desired, "applied": applied}, params={},
        )  # fmt: skip


def _summed(phases: dict[PduPhase, PduReading]) -> tuple[float | None, float]:
    """A rack's draw (None without readings) and breaker limit, its phases summed."""
    draw = sum(r.power_watts for r in phases.values()) if phases else None
    return draw, sum(r.breaker_limit_watts for r in phases.values())
