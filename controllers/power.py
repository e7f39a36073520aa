"""Power-aware throttling: keep each rack under its breaker limit, least critical work first.

Per rack, once per period, from its PDU draw (all phases), its breaker limit
and its devices (draw, cap, cap range, criticality):

- **guard**: the largest rise of the draw in one period over the last
  ``rise_window`` periods; the draw plus that guard is what the next period
  may bring (a step of load shows in it before the breaker does);
- **target**: ``target_ratio`` of the limit; while baseline work waits on a
  pool the rack serves (``waiting``), ``waiting_target_ratio``: half the
  margin goes to the work that waits, and stays spent until the draw falls
  under ``target_ratio`` by itself (taking it back at once would shed, and
  queue the work again);
- **shed** when the draw plus guard exceeds the target (at
  once when the draw itself does; otherwise on the second rise in a row while
  it does, so one rise, noisy or a step that has come and stopped, is not
  taken for a trend: a draw that does go over is caught by the reading that
  shows it, and a rack's readings close its period early), for what the
  draw and its latest rise put over the target (a step that has come and
  stopped is over by what the draw shows, not by its size again): caps go
  down on the least critical devices first (most drawing first among equals), each
  no lower than its minimum; what caps cannot take, low-clock mode takes
  (for a need of at least ``MIN_ACTION_WATTS``, as a cap is moved);
  what neither can, the rack's deferrable batch work moved to a pool with
  headroom (:data:`PowerReason.MOVE_BATCH`); and where the rack would still
  stay over its limit (a tripped breaker takes every device down), caps go
  on to the drivers' own floors (``floor_watts``), and what is left over the
  limit is the plan's ``short_watts``: load that must come off the rack (the
  planner stops the pool's optional work). Against the limit only what caps
  take is counted, and a cap takes only what it puts under a device's draw:
  low clocks on a device its cap already slows may save nothing, batch work
  may have nowhere to go, and an estimate's error is no reason to trip a
  breaker;
- **move batch** when caps or low clocks have held ``move_after_periods``
  and the rack runs batch work (each device says how many of its watts are
  batch work's): caps act in milliseconds but slow everything the device
  serves, baseline included; deferrable work can run elsewhere, and then the
  caps can come off. It comes back once nothing on the rack is held and the
  room under the target (below) covers what it drew;
- **lift** after ``hold_periods`` calm periods: undo in reverse (clocks back
  first, then caps, most critical first). A lift is sized for the busiest draw
  ``B`` of the last ``lift_window_s`` (an oscillation's trough is not
  headroom; while baseline work waits on a pool the rack serves, ``waiting``,
  the draw now: that peak was drawn by the work now waiting) and the guard
  ``G``: it gives back the room ``R = target - B - G``, less what an earlier
  lift gave and the draw does not show yet. The rise a lift causes in the next
  two periods is known for ours and kept out of the guard (a trend of the load
  it is not). A period is calm when the projection is under ``release_ratio`` of the limit,
  or when ``R`` covers twice the smallest lift worth an action (a rack held at
  its old target after its feed is repaired must not wait for load to fall).

A reading that is missing or not finite changes nothing (no lift without
knowing the draw). Pure: readings in, actions out.

Example::

    ctl = PowerController(PowerConfig())
    plan = ctl.step(now=period_end, draw_watts=9_800, limit_watts=10_000, devices=devices)
    for a in plan.actions: ...   # PowerAction(device, CAP, watts=...)
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from controllers.clock import instant

MIN_ACTION_WATTS = 0.5
"""The least a lever is pulled for: a cap moved by less, or low-clock mode for a need of
less (a reading a hair over the target after caps sized to it exactly: caps are set to
0.1 W), is no action."""


class PowerReason(StrEnum):
    OVER_TARGET = "over_target"  # caps or clocks lowered
    MOVE_BATCH = "move_batch"  # deferrable work to move off the rack
    HEADROOM = "headroom"  # caps lifted, or batch work brought back
    HOLD = "hold"
    INVALID_INPUT = "invalid_input"
    # a rack over its breaker that neither caps nor routing can bring under (every cap at
    # its floor, its replicas at the least weight, nowhere to move their pool's share): the
    # pool admits less (the planner's, not this controller's), and more once the rack has room
    ADMISSION_SHED = "admission_shed"
    ADMISSION_BACK = "admission_back"


class PowerLever(StrEnum):
    CAP = "cap"
    LOW_CLOCK = "low_clock"
    DEFAULT_CLOCK = "default_clock"


@dataclass(frozen=True, slots=True)
class DevicePower:
    uuid: str
    criticality: int  # 0 = least critical (optional work), higher = more (baseline)
    draw_watts: float
    cap_watts: float
    min_cap_watts: float
    max_cap_watts: float
    low_clock: bool = False
    batch_watts: float = 0.0  # of its draw, deferrable batch work's
    # the lowest cap its driver accepts, where that is under policy's floor
    # (``min_cap_watts``): asked for only when a rack would otherwise stay over its limit
    floor_watts: float | None = None

    @property
    def capped(self) -> bool:
        return self.cap_watts < self.max_cap_watts - MIN_ACTION_WATTS

    @property
    def held(self) -> bool:
        """A cap or low clock is in force."""
        return self.low_clock or self.capped


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
    move_batch_watts: float = 0.0  # batch work to move off the rack (all of it, if any)
    return_batch_watts: float = 0.0  # batch work moved off earlier that may come back
    # over the limit still with every lever spent (caps at the drivers' floors, clocks low,
    # batch work moved): the load itself must come off the rack
    short_watts: float = 0.0
    projected_watts: float = math.nan


@dataclass(frozen=True, slots=True)
class PowerConfig:
    # the guard already holds what the next period may bring (the largest recent rise);
    # the margin under the target is for what a reading does not show: the draw's swing
    # from second to second with its load. A breaker trips on a draw held over its limit
    # for seconds (five in the evaluation), and a rack's reading over the target closes its
    # period at once, so the margin is for swings that come together second after second:
    # 2.5% of the limit is 1.7 standard deviations of a 3% second-to-second load noise on
    # devices whose dynamic power is half the limit (five independent seconds each that
    # far over: about one chance in four million). 5% (three deviations, as if one
    # second's swing tripped) held caps on racks with room; 1% tripped breakers
    target_ratio: float = 0.975
    # while baseline work waits on a pool the rack serves: half the margin under the limit
    # is spent on it (the other half is what a swing within a reading may bring)
    waiting_target_ratio: float = 0.9875
    release_ratio: float = 0.8
    hold_periods: int = 3
    rise_window: int = 10
    low_clock_saving_ratio: float = 0.15  # what low-clock mode takes off a device's draw
    lift_step_ratio: float = 0.1  # of a device's cap range: the least lift worth an action
    # a lift is sized for the busiest draw of this window: long enough to hold the peak of
    # an oscillation up to five minutes long (HPA waits as long before it scales down)
    lift_window_s: float = 300.0
    move_after_periods: int = 3  # caps held this long on a rack with batch work: move it

    def __post_init__(self) -> None:
        if not 0 < self.release_ratio < self.target_ratio <= self.waiting_target_ratio <= 1:
            raise ValueError("0 < release_ratio < target_ratio <= waiting_target_ratio <= 1")


class PowerController:
    """One rack's power caps: shed ahead of a projected overdraw, move batch work off
    a rack held capped, lift the caps when the room has held."""

    def __init__(self, config: PowerConfig) -> None:
        self.config = config
        self.last_draw: float | None = None
        # (when, draw, rise since the reading before): the guard reads the last rise_window
        # rises, a lift the whole lift window
        self.history: deque[tuple[datetime, float, float]] = deque()
        self.calm = 0
        self.warned = 0  # periods in a row projected over the target
        self.held = 0  # periods in a row with a cap or low clock in force
        self.batch_off_watts = 0.0  # batch work moved off the rack, as it drew then
        self.pending_watts = 0.0  # given back by a lift and not yet seen in the draw
        self.pending_periods = 0
        self.raised = False  # the target is waiting_target_ratio's (baseline work waited)

    def remember(self) -> dict[str, Any]:
        """Its state as JSON-able values (the draws of the lift window that can still matter,
        with their rises, the periods calm, warned and held, what it moved and gave back),
        so another process's controller of the rack goes on from exactly here."""
        # the guard reads the last rise_window entries; a lift, the busiest draw of the
        # window: an older entry that a later one draws as much as can never be that (it
        # leaves the window first), so the record keeps a handful, not the whole window
        history = list(self.history)
        split = max(0, len(history) - self.config.rise_window)
        kept = history[split:]
        busiest = max((draw for _, draw, _ in kept), default=-math.inf)
        for entry in reversed(history[:split]):
            if entry[1] > busiest:
                kept.insert(0, entry)
                busiest = entry[1]
        return {
            "last_draw": self.last_draw,
            "history": [[at.isoformat(), draw, rise] for at, draw, rise in kept],
            "calm": self.calm, "warned": self.warned, "held": self.held,
            "batch_off_watts": self.batch_off_watts, "pending_watts": self.pending_watts,
            "pending_periods": self.pending_periods, "raised": self.raised,
        }  # fmt: skip

    def recall(self, memory: dict[str, Any]) -> None:
        """Go on from what :meth:`remember` wrote. Raises ``ValueError`` on another shape
        (the controller is then left as it was)."""
        try:
            last = memory["last_draw"]
            history = [
                (instant(at), float(draw), float(rise)) for at, draw, rise in memory["history"]
            ]
            counts = [int(memory[k]) for k in ("calm", "warned", "held", "pending_periods")]
            watts = [float(memory[k]) for k in ("batch_off_watts", "pending_watts")]
            raised = memory.get("raised", False)  # a memory from before it: not raised
            if not isinstance(raised, bool):
                raise TypeError(f"raised is {raised!r}, not a bool")
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a power controller's memory: {exc!r}") from exc
        if not all(math.isfinite(w) and w >= 0 for w in (*watts, *(d for _, d, _ in history))):
            raise ValueError(f"watts that are not a draw: {memory}")
        self.last_draw = None if last is None else float(last)
        self.history = deque(history)
        self.calm, self.warned, self.held, self.pending_periods = counts
        self.batch_off_watts, self.pending_watts = watts
        self.raised = raised

    def step(
        self,
        *,
        now: datetime,
        draw_watts: float | None,
        limit_watts: float,
        devices: Sequence[DevicePower],
        waiting: bool = False,
    ) -> PowerPlan:
        c = self.config
        if draw_watts is None or not math.isfinite(draw_watts) or not limit_watts > 0:
            self.calm = 0
            return PowerPlan((), PowerReason.INVALID_INPUT, "no valid PDU reading: held")
        rise = 0.0 if self.last_draw is None else max(0.0, draw_watts - self.last_draw)
        # a rise our own lift (or batch brought back) caused is no trend of the load
        absorbed = min(rise, self.pending_watts)
        rise, self.pending_watts = rise - absorbed, self.pending_watts - absorbed
        self.pending_periods -= 1
        if self.pending_periods <= 0:
            self.pending_watts = 0.0  # what has not shown by now may never: guard it again
        self.last_draw = draw_watts
        self.history.append((now, draw_watts, rise))
        lift_since = now - timedelta(seconds=c.lift_window_s)
        while self.history[0][0] < lift_since and len(self.history) > c.rise_window:
            self.history.popleft()
        recent = list(self.history)[-c.rise_window :]
        projected = draw_watts + max(r for _, _, r in recent)
        # while baseline work waits, half the margin is the work's; it is taken back once
        # the draw is under the usual target by itself (taken back at once, the shed
        # queues the work again: a rack cycled between the two)
        if waiting:
            self.raised = True
        elif draw_watts < c.target_ratio * limit_watts:
            self.raised = False
        target = self._target_ratio() * limit_watts
        if projected > target:
            self.calm = 0
            # a draw over the target sheds at once; a projection over it sheds on the
            # second rise in a row, however far over (one rise, a noisy one or a step that
            # has come and stopped, is no trend; a draw that does go over is caught by the
            # reading that shows it)
            self.warned = self.warned + 1 if rise > 0 or not self.warned else self.warned
            # a trend is shed for what it shows: the draw plus its latest rise (a step that
            # has come and stopped is over by what the draw shows, not by its size again)
            trend = draw_watts + rise
            if draw_watts > target or (self.warned >= 2 and trend > target):
                return self._shed(trend - target, trend, limit_watts, devices)
            return PowerPlan((), PowerReason.HOLD,
                             f"projected {projected:.0f} W over the target: watched",
                             projected_watts=projected)  # fmt: skip
        self.warned = 0
        held = any(d.held for d in devices)
        self.held = self.held + 1 if held else 0
        batch = sum(d.batch_watts for d in devices)
        if self.held >= c.move_after_periods and batch > 0 and not self.batch_off_watts:
            # caps slow what the rack serves, baseline included; deferrable work can run
            # where there is headroom instead, so the caps can come off (once: what is
            # moved stays away until it is brought back)
            self.held, self.batch_off_watts = 0, batch
            return PowerPlan((), PowerReason.MOVE_BATCH,
                             f"caps held {c.move_after_periods} periods: move {batch:.0f} W "
                             "of batch work off the rack so they can come off",
                             move_batch_watts=batch, projected_watts=projected)  # fmt: skip
        # the busiest draw of the lift window, and the same guard the projection adds (the
        # largest rise of the last rise_window periods: a step long past is no trend);
        # what an earlier lift gave back and the draw does not show yet is spoken for. While
        # baseline work waits on a pool the rack serves, the draw now: the window's peak was
        # drawn by work that now waits behind the caps (a slowdown's queue surging through
        # as it ends), and holding them for the window is the wait's growth
        busiest = draw_watts if waiting else max(w for at, w, _ in self.history if at >= lift_since)
        guard = max(r for _, _, r in recent)
        room = target - busiest - guard - self.pending_watts
        if projected < c.release_ratio * limit_watts or self._lift_fits(room, devices):
            self.calm += 1
            if self.calm >= c.hold_periods and not held and 0 < self.batch_off_watts <= room:
                back, self.batch_off_watts, self.calm = self.batch_off_watts, 0.0, 0
                self.expect(back)
                return PowerPlan((), PowerReason.HEADROOM,
                                 f"{room:.0f} W of room: {back:.0f} W of batch work back",
                                 return_batch_watts=back, projected_watts=projected)  # fmt: skip
            if self.calm >= c.hold_periods:
                return self._lift(room, projected, devices, waiting=waiting)
        else:
            self.calm = 0
        return PowerPlan((), PowerReason.HOLD, f"{projected:.0f} W of {limit_watts:.0f} W",
                         projected_watts=projected)  # fmt: skip

    def batch_stayed(self) -> None:
        """The batch work a plan asked to move had nowhere to go: it is still on the rack,
        and the next time the caps have held ``move_after_periods`` the move is asked for
        again."""
        self.batch_off_watts, self.held = 0.0, 0

    def _lift_fits(self, room: float, devices: Sequence[DevicePower]) -> bool:
        """Whether ``room`` covers twice the smallest lift worth an action."""
        steps = [
            self.config.lift_step_ratio * (d.max_cap_watts - d.min_cap_watts)
            for d in devices
            if d.held
        ]
        return bool(steps) and room >= 2 * max(steps)

    def _target_ratio(self) -> float:
        """The target in force: raised while baseline work waits (and until the draw falls
        under the usual one by itself)."""
        c = self.config
        return c.waiting_target_ratio if self.raised else c.target_ratio

    def _shed(
        self, need: float, projected: float, limit: float, devices: Sequence[DevicePower]
    ) -> PowerPlan:
        ratio = self._target_ratio()
        actions: list[PowerAction] = []
        left = need
        order = sorted(devices, key=lambda d: (d.criticality, -d.draw_watts))
        for d in order:
            if left <= 0:
                break
            now_cap = min(d.cap_watts, d.draw_watts)
            new_cap = max(d.min_cap_watts, now_cap - left)
            if new_cap < d.cap_watts - MIN_ACTION_WATTS:
                left -= max(0.0, d.draw_watts - new_cap)
                actions.append(PowerAction(d.uuid, PowerLever.CAP, round(new_cap, 1)))
        after_caps = left  # low clocks' saving below is an estimate, not a cap's
        for d in order:
            if left < MIN_ACTION_WATTS:
                break
            if not d.low_clock:
                left -= self.config.low_clock_saving_ratio * min(d.draw_watts, d.min_cap_watts)
                actions.append(PowerAction(d.uuid, PowerLever.LOW_CLOCK))
        batch = sum(d.batch_watts for d in devices)
        # past policy's floors, clocks and the batch work there is to move, the rack would
        # stay over: a tripped breaker takes every device down, so caps go to the drivers'
        # own floors before that (the draw over the limit, not the target, is what trips).
        # Against the limit only what caps take counts: a device its cap already slows may
        # draw no less at low clocks, batch work may have nowhere to go (or be less than its
        # share of the requests says), and a breaker is not tripped by an estimate's error
        over_limit = after_caps - (1.0 - ratio) * limit
        for d in order:
            if over_limit <= 0:
                break
            if d.floor_watts is not None and d.floor_watts < d.min_cap_watts - MIN_ACTION_WATTS:
                # a cap saves only what it takes off the draw: one drawing under its cap (low
                # clocks, light load) must go under what it draws
                base = min(d.cap_watts, d.min_cap_watts, d.draw_watts)
                deeper = max(d.floor_watts, base - over_limit)
                saved = base - deeper
                if saved > MIN_ACTION_WATTS:
                    over_limit -= saved
                    left -= saved
                    actions = [a for a in actions if a.device_uuid != d.uuid or
                               a.lever is not PowerLever.CAP]  # fmt: skip
                    actions.append(PowerAction(d.uuid, PowerLever.CAP, round(deeper, 1)))
        moved = max(0.0, left)
        if moved > 0:
            self.batch_off_watts = max(self.batch_off_watts, batch)
        reason = PowerReason.MOVE_BATCH if moved > 0 else PowerReason.OVER_TARGET
        short = max(0.0, over_limit)
        return PowerPlan(
            tuple(actions), reason,
            f"projected {projected:.0f} W over {ratio:g} of {limit:.0f} W: "
            f"{len(actions)} device action(s)"
            + (f", move {moved:.0f} W of batch" if moved else "")
            + (f"; {short:.0f} W over the limit with every lever spent" if short else ""),
            move_batch_watts=moved, projected_watts=projected, short_watts=short,
        )  # fmt: skip

    def expect(self, watts: float) -> None:
        """A rise of up to ``watts`` in the next two periods is known, not a trend of the
        load: ours (a lift, batch work brought back), or the planner's to foresee (the
        tokens of a pool the rack serves sped up, and its queue surges through)."""
        self.pending_watts, self.pending_periods = self.pending_watts + max(0.0, watts), 2

    def _lift(
        self, room: float, projected: float, devices: Sequence[DevicePower], *, waiting: bool
    ) -> PowerPlan:
        actions: list[PowerAction] = []
        start = room
        order = sorted(devices, key=lambda d: (-d.criticality, -d.draw_watts))
        for d in order:
            if d.low_clock and room > 0:
                room -= self.config.low_clock_saving_ratio * d.draw_watts
                actions.append(PowerAction(d.uuid, PowerLever.DEFAULT_CLOCK))
        for d in order:
            if room <= 0:
                break
            if d.capped:
                new_cap = min(d.max_cap_watts, d.cap_watts + room)
                room -= new_cap - d.cap_watts
                actions.append(PowerAction(d.uuid, PowerLever.CAP, round(new_cap, 1)))
        if not actions:
            why = (
                "the lift window's peak leaves no room yet"
                if any(d.held for d in devices)
                else "nothing capped"
            )
            return PowerPlan((), PowerReason.HOLD, f"headroom, {why}",
                             projected_watts=projected)  # fmt: skip
        self.expect(start - max(room, 0.0))
        sized = ", sized for the draw now: baseline work waits" if waiting else ""
        return PowerPlan(tuple(actions), PowerReason.HEADROOM,
                         f"projected {projected:.0f} W: {len(actions)} device(s) lifted{sized}",
                         projected_watts=projected)  # fmt: skip
