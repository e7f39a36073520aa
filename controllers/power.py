"""Power-aware throttling: keep each rack under its breaker limit, least critical work first.

Per rack, once per period, from its PDU draw (all phases), its breaker limit
and its devices (draw, cap, cap range, criticality):

- **guard**: the largest rise of the draw in one period over the last
  ``rise_window`` periods; the draw plus that guard is what the next period
  may bring (a step of load shows in it before the breaker does);
- **shed** when the draw plus guard exceeds ``target_ratio`` of the limit: caps
  go down on the least critical devices first (most drawing first among
  equals), each no lower than its minimum; what caps cannot take, low-clock
  mode takes; what neither can, deferrable batch work moved to a pool with
  headroom (:data:`PowerReason.MOVE_BATCH`, sized in watts);
- **lift** when the draw plus guard stays under ``release_ratio`` of the limit
  for ``hold_periods``: undo in reverse (clocks back first, then caps, most
  critical first), never beyond what keeps the projected draw under the target.

A reading that is missing or not finite changes nothing (no lift without
knowing the draw). Pure: readings in, actions out.

Example::

    ctl = PowerController(PowerConfig())
    plan = ctl.step(draw_watts=9_800, limit_watts=10_000, devices=devices)
    for a in plan.actions: ...   # PowerAction(device, CAP, watts=...)
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class PowerReason(StrEnum):
    OVER_TARGET = "over_target"  # caps or clocks lowered
    MOVE_BATCH = "move_batch"  # caps and clocks were not enough: move deferrable work
    HEADROOM = "headroom"  # caps lifted
    HOLD = "hold"
    INVALID_INPUT = "invalid_input"


class PowerLever(StrEnum):
    CAP = "cap"
    LOW_CLOCK = "low_clock"
    DEFAULT_CLOCK = "default_clock"


@dataclass(frozen=True, slots=True)
class DevicePower:
    uuid: str
    criticality: int  # 0 = least critical (opportunistic), higher = more (baseline)
    draw_watts: float
    cap_watts: float
    min_cap_watts: float
    max_cap_watts: float
    low_clock: bool = False


@dataclass(frozen=True, slots=True)
class PowerAction:
    device_uuid: str
    lever: PowerLever
    watts: float | None = None  # the new cap, for CAP


@dataclass(frozen=True, slots=True)
class PowerPlan:
    actions: tuple[PowerAction, ...]
    reason: PowerReason
    message: str
    move_batch_watts: float = 0.0
    projected_watts: float = math.nan


@dataclass(frozen=True, slots=True)
class PowerConfig:
    target_ratio: float = 0.92
    release_ratio: float = 0.8
    hold_periods: int = 3
    rise_window: int = 10
    low_clock_saving_ratio: float = 0.15  # what low-clock mode takes off a device's draw
    lift_step_ratio: float = 0.1  # of a device's cap range per period

    def __post_init__(self) -> None:
        if not 0 < self.release_ratio < self.target_ratio <= 1:
            raise ValueError("0 < release_ratio < target_ratio <= 1")


class PowerController:
    """One rack's caps; see the module docstring."""

    def __init__(self, config: PowerConfig) -> None:
        self.config = config
        self.rises: deque[float] = deque(maxlen=config.rise_window)
        self.last_draw: float | None = None
        self.calm = 0

    def step(
        self, *, draw_watts: float | None, limit_watts: float, devices: Sequence[DevicePower]
    ) -> PowerPlan:
        c = self.config
        if draw_watts is None or not math.isfinite(draw_watts) or not limit_watts > 0:
            self.calm = 0
            return PowerPlan((), PowerReason.INVALID_INPUT, "no valid PDU reading: held")
        if self.last_draw is not None:
            self.rises.append(max(0.0, draw_watts - self.last_draw))
        self.last_draw = draw_watts
        projected = draw_watts + max(self.rises, default=0.0)
        target = c.target_ratio * limit_watts
        if projected > target:
            self.calm = 0
            return self._shed(projected - target, projected, limit_watts, devices)
        if projected < c.release_ratio * limit_watts:
            self.calm += 1
            if self.calm >= c.hold_periods:
                return self._lift(target - projected, projected, devices)
        else:
            self.calm = 0
        return PowerPlan((), PowerReason.HOLD, f"{projected:.0f} W of {limit_watts:.0f} W",
                         projected_watts=projected)  # fmt: skip

    def _shed(
        self, need: float, projected: float, limit: float, devices: Sequence[DevicePower]
    ) -> PowerPlan:
        actions: list[PowerAction] = []
        left = need
        order = sorted(devices, key=lambda d: (d.criticality, -d.draw_watts))
        for d in order:
            if left <= 0:
                break
            now_cap = min(d.cap_watts, d.draw_watts)
            new_cap = max(d.min_cap_watts, now_cap - left)
            if new_cap < d.cap_watts - 0.5:
                left -= max(0.0, d.draw_watts - new_cap)
                actions.append(PowerAction(d.uuid, PowerLever.CAP, round(new_cap, 1)))
        for d in order:
            if left <= 0:
                break
            if not d.low_clock:
                left -= self.config.low_clock_saving_ratio * min(d.draw_watts, d.min_cap_watts)
                actions.append(PowerAction(d.uuid, PowerLever.LOW_CLOCK))
        moved = max(0.0, left)
        reason = PowerReason.MOVE_BATCH if moved > 0 else PowerReason.OVER_TARGET
        return PowerPlan(
            tuple(actions), reason,
            f"projected {projected:.0f} W over {self.config.target_ratio:g} of {limit:.0f} W: "
            f"{len(actions)} device action(s)"
            + (f", move {moved:.0f} W of batch" if moved else ""),
            move_batch_watts=moved, projected_watts=projected,
        )  # fmt: skip

    def _lift(self, room: float, projected: float, devices: Sequence[DevicePower]) -> PowerPlan:
        actions: list[PowerAction] = []
        order = sorted(devices, key=lambda d: (-d.criticality, -d.draw_watts))
        for d in order:
            if d.low_clock and room > 0:
                room -= self.config.low_clock_saving_ratio * d.draw_watts
                actions.append(PowerAction(d.uuid, PowerLever.DEFAULT_CLOCK))
        for d in order:
            if room <= 0:
                break
            if d.cap_watts < d.max_cap_watts - 0.5:
                step = self.config.lift_step_ratio * (d.max_cap_watts - d.min_cap_watts)
                new_cap = min(d.max_cap_watts, d.cap_watts + min(step, room))
                room -= new_cap - d.cap_watts
                actions.append(PowerAction(d.uuid, PowerLever.CAP, round(new_cap, 1)))
        if not actions:
            return PowerPlan((), PowerReason.HOLD, "headroom, nothing capped",
                             projected_watts=projected)  # fmt: skip
        return PowerPlan(tuple(actions), PowerReason.HEADROOM,
                         f"projected {projected:.0f} W: {len(actions)} device(s) lifted",
                         projected_watts=projected)  # fmt: skip
