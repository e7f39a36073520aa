"""Capacity control: how much optional work a pool may take without hurting its baseline.

Per pool, once per control period, from the ratio of the pool's latency to its
SLO (TPOT or TTFT p95 over its SLO, or the worse of the two) and, optionally,
its load ratio (work in service and waiting over what its batch slots hold:
above 1 a queue builds) and its baseline ratio (the same for the work that is
not optional):

1. **trend**: each ratio's median over the last ``trend_window`` periods (a
   one-period sensor spike never moves it; a step does by the second period);
   the PID follows whichever is further past its setpoint (``setpoint_ratio``
   for latency, ``load_setpoint_ratio`` for load);
2. **breach**: a latency trend above 1 sets the budget to zero at once, with
   the integral unwound: baseline work never waits for optional work (load
   alone only steers the PID: the router sheds in the meantime);
3. **stale**: after ``stale_after_s`` without a fresh measurement the budget
   goes back to ``stale_budget_ratio``, linearly over ``stale_decay_s`` (a blip
   costs little, an outage gives it all back), keeping what the PID learned; a
   not-finite measurement holds it;
4. otherwise the budget proposed is a feedforward plus a PID trim:
   ``load_setpoint_ratio`` less the busiest baseline ratio of the last
   ``stabilise_up_s`` (a dip that may come back is not room; a rise shows at
   once; a step down, a reading ``step_down_ratio`` under the window's busiest
   and ``step_down_sigmas`` standard deviations under its mean, is taken at
   once and restarts the window, as :meth:`CapacityController.restart_windows`
   does when the planner sees the pool's tokens speed up; the readings after a
   restart settle it: while each falls under the one before by more than twice the
   noise of a reading's change before the restart (robust: the median absolute
   change), the one before was a blend of the levels, or a queue draining, and
   leaves the windows too; a ramp down, where a
   falling line explains ``ramp_fit`` of the window's variance, is sized for
   that line now plus twice its residual spread, and restarts the window
   too), plus a PID (:mod:`controllers.pid`) on ``setpoint_ratio - trend``
   for what that misses (without a baseline ratio, the PID alone). Then a
   stabilisation window on increases, a tolerance after it (increases under
   ``tolerance_ratio``, cuts under ``tolerance_floor`` are noise: a rise the
   window lets through by a sliver waits until it is worth an action), a
   rate limit and the clamps (:mod:`controllers.stages`) decide what applies.

The budget is a share of the pool's capacity for optional work. :func:`split_levers`
turns it into the two levers of optional work: extra candidates per
request (widen the funnel) and the share of requests served by a bigger model.
:class:`GlobalBudget` caps the sum over pools.

Example::

    c = CapacityController(CapacityConfig())
    d = c.step(now=period_end, latency_ratio=0.041 / 0.06)
    d.applied, d.reason, d.p, d.i, d.d
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from statistics import median
from typing import Any, NamedTuple

from controllers.clock import instant, maybe_instant
from controllers.pid import PidConfig, PidReason, PidState, pid_step
from controllers.stages import Clamp, RateLimit, Stabiliser, Stages, Tolerance


class CapacityReason(StrEnum):
    TRACKING = "tracking"  # the PID moved the budget
    HOLD = "hold"  # in the deadband, or nothing to change
    SLO_BREACH = "slo_breach"  # the latency trend is over the SLO: budget to zero
    STALE_INPUT = "stale_input"  # no fresh latency: the budget given back
    INVALID_INPUT = "invalid_input"  # NaN or inf latency: held
    WITHIN_TOLERANCE = "within_tolerance"
    STABILISING = "stabilising"
    RATE_LIMITED = "rate_limited"
    CLAMPED = "clamped"
    GLOBAL_BUDGET = "global_budget"  # other pools hold the fleet's optional-work limit
    POWER_LIMIT = "power_limit"  # a rack of the pool is over its limit, every lever spent
    # the pool's tokens slowed within a period: cut to the room the baseline leaves at once
    TOKEN_SPEED = "token_speed"


@dataclass(frozen=True, slots=True)
class CapacityConfig:
    setpoint_ratio: float = 0.9  # of the SLO
    load_setpoint_ratio: float = 0.99  # of the batch slots
    kp: float = 0.05
    ki: float = 0.001  # per second
    kd: float = 0.0
    deadband_ratio: float = 0.02
    trend_window: int = 3
    budget_max_ratio: float = 1.0
    tolerance_ratio: float = 0.05
    tolerance_floor: float = 0.01
    stabilise_up_s: float = 120.0
    step_down_ratio: float = 0.15  # baseline this far under the window's busiest: a step
    step_down_sigmas: float = 3.0  # ... and this many of its standard deviations under its mean
    ramp_fit: float = 0.8  # a falling line explaining this share of the window's variance
    ramp_window_s: float = 300.0  # the readings a ramp down is fitted to
    up_per_s: float = 0.005  # budget may grow by 0.5% of capacity per second at most
    down_per_s: float = math.inf
    stale_after_s: float = 30.0
    stale_decay_s: float = 120.0
    stale_budget_ratio: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.setpoint_ratio <= 1:
            raise ValueError("setpoint_ratio is a share of the SLO in (0, 1]")
        if self.trend_window < 1 or not 0 <= self.stale_budget_ratio <= self.budget_max_ratio:
            raise ValueError("trend_window >= 1; stale budget within [0, budget_max_ratio]")
        if not 0 < self.load_setpoint_ratio <= 1:
            raise ValueError("load_setpoint_ratio is a share of the batch slots in (0, 1]")


@dataclass(frozen=True, slots=True)
class CapacityDecision:
    desired: float
    applied: float
    reason: CapacityReason
    message: str
    p: float = 0.0
    i: float = 0.0
    d: float = 0.0
    trend_ratio: float = math.nan


class CapacityController:
    """One pool's optional-work budget: a PID on the latency trend, fed forward by the
    baseline's room, paced by the stages, given back on a breach or a silence."""

    def __init__(self, config: CapacityConfig) -> None:
        c = self.config = config
        self.pid = PidConfig(
            kp=c.kp, ki=c.ki, kd=c.kd, out_min=0.0, out_max=c.budget_max_ratio,
            deadband=c.deadband_ratio, max_gap_s=c.stale_after_s,
        )  # fmt: skip
        self.state = PidState()
        self.stabiliser = Stabiliser(c.stabilise_up_s, cautious="up")
        self.rate = RateLimit(c.up_per_s, c.down_per_s)
        # the tolerance after the stabiliser: a rise the window lets through by a sliver a
        # period is an action a period for nothing; it waits until it is worth one
        self.stages = Stages(
            [
                self.stabiliser,
                Tolerance(c.tolerance_ratio, floor=c.tolerance_floor, up_only=True),
                self.rate,
                Clamp(0.0, c.budget_max_ratio),
            ]
        )
        self.recent: deque[tuple[float, float]] = deque(maxlen=c.trend_window)
        self.baselines: deque[tuple[datetime, float]] = deque()
        self.levels: deque[tuple[datetime, float]] = deque()  # the trend's, by period
        # while the windows settle after a restart, the noise of a reading's change before
        # it (None: settled). A period that a step or a speed-up came within reads a blend of
        # the two levels, and the next ones may still drain a queue: while each reading falls
        # past that noise under the one before (the windows' latest), that one was not the
        # new level
        self.settle_noise: float | None = None
        self.budget = 0.0
        self.fresh_at: datetime | None = None
        self.stale_from: tuple[datetime, float] | None = None  # (when, budget then)

    def remember(self) -> dict[str, Any]:
        """Its state as JSON-able values (the budget in force, the PID's, the windows and
        the stages'), so another process's controller goes on from exactly here."""
        s = self.state
        return {
            "budget": self.budget,
            "pid": [s.integral, s.last_measurement, _at(s.last_at), s.derivative, s.output],
            "recent": [list(r) for r in self.recent],
            "baselines": [[_at(t), b] for t, b in self.baselines],
            "levels": [[_at(t), b] for t, b in self.levels],
            "stabiliser": [[_at(t), v] for t, v in self.stabiliser.recent],
            "settle_noise": self.settle_noise,
            "rate_at": _at(self.rate.last_at),
            "fresh_at": _at(self.fresh_at),
            "stale_from": None if self.stale_from is None
            else [_at(self.stale_from[0]), self.stale_from[1]],
        }  # fmt: skip

    def recall(self, memory: dict[str, Any]) -> None:
        """Go on from what :meth:`remember` wrote. Raises ``ValueError`` on another shape or
        a budget out of range (the controller is then left as it was)."""
        try:
            budget = float(memory["budget"])
            integral, last, last_at, derivative, output = memory["pid"]
            state = PidState(
                float(integral),
                _float(last),
                maybe_instant(last_at),
                float(derivative),
                _float(output),
            )
            recent = [(float(lat), float(load)) for lat, load in memory["recent"]]
            baselines = _series(memory["baselines"])
            levels = _series(memory["levels"])
            window = _series(memory["stabiliser"])
            rate_at, fresh_at = maybe_instant(memory["rate_at"]), maybe_instant(memory["fresh_at"])
            # absent from a memory written before it was kept
            settle_noise = _float(memory.get("settle_noise"))
            stale = memory["stale_from"]
            stale_from = None if stale is None else _series([stale])[0]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a capacity controller's memory: {exc!r}") from exc
        if not 0.0 <= budget <= self.config.budget_max_ratio:
            raise ValueError(f"a budget outside [0, {self.config.budget_max_ratio}]: {budget}")
        self.budget, self.state = budget, state
        self.recent.clear()
        self.recent.extend(recent)
        self.baselines, self.levels = deque(baselines), deque(levels)
        self.stabiliser.recent = deque(window)
        self.rate.last_at, self.fresh_at, self.stale_from = rate_at, fresh_at, stale_from
        self.settle_noise = settle_noise

    def step(
        self,
        *,
        now: datetime,
        latency_ratio: float | None,
        load_ratio: float = 0.0,
        baseline_ratio: float | None = None,
    ) -> CapacityDecision:
        """One period; ``latency_ratio`` is None when no latency arrived this period."""
        c = self.config
        if latency_ratio is None:
            return self._stale_or_hold(now)
        if (
            not (math.isfinite(latency_ratio) and math.isfinite(load_ratio))
            or min(latency_ratio, load_ratio) < 0
        ):
            return CapacityDecision(self.budget, self.budget, CapacityReason.INVALID_INPUT,
                                    f"latency ratio {latency_ratio!r} or load ratio "
                                    f"{load_ratio!r} is not a measurement: held")  # fmt: skip
        self.fresh_at, self.stale_from = now, None
        self.recent.append((latency_ratio, load_ratio))
        latency = median(r for r, _ in self.recent)
        # both on the latency's scale: the load's distance past its own setpoint
        load = median(q for _, q in self.recent) - c.load_setpoint_ratio + c.setpoint_ratio
        trend = max(latency, load)
        if latency > 1.0:
            self.state = PidState(integral=-self.pid.bias, last_measurement=trend, last_at=now)
            self.budget = 0.0
            return CapacityDecision(
                0.0, 0.0, CapacityReason.SLO_BREACH,
                f"latency at {trend:.2f} of the SLO: optional work stopped", trend_ratio=trend,
            )  # fmt: skip
        pid = self.pid
        if baseline_ratio is not None and math.isfinite(baseline_ratio):
            # feedforward: what the load setpoint leaves once baseline work is in; the PID
            # trims what this misses (the latency side, estimation error)
            # sized for the busiest baseline level of the stabilisation window: a dip that
            # may come back is not room. A level is the median of the trend window's
            # readings (one noisy period does not cut the budget, nor, when it leaves the
            # window, raise it); a reading past the window's own swing is a step, taken at
            # once: up, it is the level now; down, the windows start again
            mean, spread = self._swing(now)
            peak = self._peak(now, default=baseline_ratio)
            noise, self.settle_noise = self.settle_noise, None
            if self._stepped_down(baseline_ratio, peak, mean - c.step_down_sigmas * spread):
                # too far under the window's busiest for a dip that comes back: the load
                # stepped down, and the room is real now (the windows start again)
                self.restart_windows()
            elif noise is not None:  # settling: the windows hold only readings since then
                if not self.baselines:
                    self.settle_noise = noise  # the first reading since the restart
                elif baseline_ratio < self.baselines[-1][1] - 2.0 * noise:
                    self._clear_windows()  # the reading before was a blend: not the level
                    self.settle_noise = noise
            self.baselines.append((now, baseline_ratio))
            level = median(b for _, b in itertools.islice(reversed(self.baselines), c.trend_window))
            if baseline_ratio > mean + c.step_down_sigmas * spread:
                level = max(level, baseline_ratio)
            self.levels.append((now, level))
            horizon = now - timedelta(seconds=max(c.stabilise_up_s, c.ramp_window_s))
            while self.baselines[0][0] < horizon:
                self.baselines.popleft()
            while self.levels[0][0] < horizon:
                self.levels.popleft()
            level = self._peak(now, default=level)
            ramp = self._ramp_level(now)
            if ramp is not None and ramp < level:
                level = ramp
                self.stabiliser.forget()  # a ramp down: the room it leaves is real now
            room = c.load_setpoint_ratio - level
            pid = replace(pid, bias=min(max(room, 0.0), c.budget_max_ratio))
        self.state, s = pid_step(
            pid, self.state, setpoint=c.setpoint_ratio, measurement=trend, now=now
        )
        applied, why = self.stages.step(desired=s.output, current=self.budget, now=now)
        changed = applied != self.budget
        reason = (
            CapacityReason(why.value)
            if why is not None
            else CapacityReason.TRACKING
            if changed
            else CapacityReason.HOLD
        )
        if s.reason is PidReason.IN_DEADBAND and not changed:
            reason = CapacityReason.HOLD
        self.budget = applied
        return CapacityDecision(
            s.output, applied, reason,
            f"latency at {trend:.3f} of the SLO (setpoint {c.setpoint_ratio:g}): "
            f"budget {applied:.3f}, wanted {s.output:.3f}",
            p=s.p, i=s.i, d=s.d, trend_ratio=trend,
        )  # fmt: skip

    def restart_windows(self) -> None:
        """Start the baseline's windows and the stabiliser again: what they held out
        against is gone (the load stepped down, or the pool's tokens sped up past their
        noise), and the room it leaves is real now. The PID keeps what it learned. The
        readings that follow settle it: while each falls past the noise of a reading's
        change before the restart, the one before it leaves the windows too."""
        noise = _change_noise([b for _, b in self.baselines])
        self._clear_windows()
        self.settle_noise = noise

    def _clear_windows(self) -> None:
        self.baselines.clear()
        self.levels.clear()
        self.stabiliser.forget()

    def _swing(self, now: datetime) -> tuple[float, float]:
        """The mean and standard deviation of the stabilisation window's readings (an
        infinite spread while there are fewer than two: nothing is past a swing unknown)."""
        since = now - timedelta(seconds=self.config.stabilise_up_s)
        window = [b for t, b in self.baselines if t >= since]
        if len(window) < 2:
            return (window[0] if window else 0.0), math.inf
        mean = sum(window) / len(window)
        return mean, math.sqrt(sum((b - mean) ** 2 for b in window) / (len(window) - 1))

    def _stepped_down(self, baseline: float, peak: float, floor: float) -> bool:
        """Whether this period's ``baseline`` stepped down out of the window's range:
        ``step_down_ratio`` under its busiest level, and under ``floor``, its mean less
        ``step_down_sigmas`` of its standard deviations (so a trough of an oscillation read
        through sensor noise is not taken for a step). With fewer than two readings to
        know the swing by, the ratio alone decides. One reading decides, so a real step
        hands its room out in the period it is seen."""
        if baseline >= peak * (1.0 - self.config.step_down_ratio):
            return False
        return baseline < floor or not math.isfinite(floor)

    def _peak(self, now: datetime, *, default: float) -> float:
        """The busiest baseline level of the stabilisation window."""
        since = now - timedelta(seconds=self.config.stabilise_up_s)
        return max((b for t, b in self.levels if t >= since), default=default)

    def _ramp_level(self, now: datetime) -> float | None:
        """While the baseline falls steadily, the line it falls on now plus twice the spread
        about it (a ramp down is not a dip that comes back); None otherwise. Steadily: a
        least-squares line through a whole ``ramp_window_s`` of readings slopes down and
        explains ``ramp_fit`` of their variance (a window longer than the stabilisation
        window, so the falling half of a slow oscillation is not taken for a ramp)."""
        c = self.config
        if self.baselines[0][0] > now - timedelta(seconds=0.9 * c.ramp_window_s):
            return None  # not a whole window of readings yet
        # (seconds before now, baseline) over the window
        ramp = [
            ((at - now).total_seconds(), b)
            for at, b in self.baselines
            if at >= now - timedelta(seconds=c.ramp_window_s)
        ]
        n = len(ramp)
        if n < 6:
            return None
        mt = sum(t for t, _ in ramp) / n
        mb = sum(b for _, b in ramp) / n
        stt = sum((t - mt) ** 2 for t, _ in ramp)
        sbb = sum((b - mb) ** 2 for _, b in ramp)
        if stt <= 0 or sbb <= 0:
            return None
        slope = sum((t - mt) * (b - mb) for t, b in ramp) / stt
        if slope >= 0 or slope * slope * stt / sbb < c.ramp_fit:
            return None
        spread = math.sqrt(max(0.0, (sbb - slope * slope * stt) / (n - 2)))
        return mb + slope * (0.0 - mt) + 2.0 * spread

    def limit(self, ratio: float) -> bool:
        """Hold the budget at ``ratio`` at most (a cap from outside, such as the global
        budget), unwinding the integral so it does not push against the cap."""
        if self.budget <= ratio:
            return False
        self.budget = ratio
        self.state = PidState(
            integral=min(self.state.integral, ratio - self.pid.bias),
            last_measurement=self.state.last_measurement,
            last_at=self.state.last_at,
            derivative=self.state.derivative,
            output=ratio,
        )
        return True

    def cut_to(self, ratio: float, *, now: datetime) -> bool:
        """Between steps: the budget down to ``ratio`` at once (the room a slowdown leaves,
        seen within a period), as :meth:`limit` holds it, and remembered by the stabiliser
        as if a step had wanted it: a rise past it waits out the window, as after a cut a
        step makes. False if the budget was at or under it already."""
        if not self.limit(max(0.0, ratio)):
            return False
        self.stabiliser.note(self.budget, now=now)
        return True

    def _stale_or_hold(self, now: datetime) -> CapacityDecision:
        c = self.config
        if self.fresh_at is not None and (now - self.fresh_at).total_seconds() < c.stale_after_s:
            return CapacityDecision(self.budget, self.budget, CapacityReason.HOLD,
                                    "no latency this period: held")  # fmt: skip
        # blind for stale_after_s: the budget goes back, linearly over stale_decay_s, to
        # stale_budget_ratio (a blip costs little, a long outage gives it all back); the
        # integral is kept: silence says nothing about the pool, so when readings return
        # the PID starts from what it had learned (the stages still pace the way back)
        if self.stale_from is None:
            self.stale_from = (now, self.budget)
        since, was = self.stale_from
        blind_s = (now - since).total_seconds()
        left = max(0.0, 1.0 - blind_s / c.stale_decay_s) if c.stale_decay_s > 0 else 0.0
        floor = min(was, c.stale_budget_ratio)
        self.budget = floor + (was - floor) * left
        self.recent.clear()
        self.baselines.clear()
        self.levels.clear()
        return CapacityDecision(
            self.budget, self.budget, CapacityReason.STALE_INPUT,
            f"no latency for {(now - (self.fresh_at or since)).total_seconds():g} s: "
            f"budget {self.budget:.3f}",
        )  # fmt: skip


def _at(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat()


def _series(pairs: list[list[Any]]) -> list[tuple[datetime, float]]:
    """``[[instant, value], ...]`` as :meth:`CapacityController.remember` wrote them."""
    return [(instant(t), float(v)) for t, v in pairs]


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True, slots=True)
class LeverConfig:
    """What each lever costs, as load per baseline request (1 = one more request)."""

    funnel_max_extra: float = 4.0  # extra candidates per request, at most
    funnel_cost: float = 0.1  # load of one extra candidate
    upgrade_cost: float = 1.5  # extra load of serving a request with the bigger model
    funnel_first: bool = True  # the lever with more value per unit of load goes first


@dataclass(frozen=True, slots=True)
class Levers:
    funnel_extra: float  # extra candidates per request
    upgrade_ratio: float  # share of requests served by the bigger model
    used_ratio: float  # the share of capacity the two take


def split_levers(budget_ratio: float, baseline_ratio: float, cfg: LeverConfig) -> Levers:
    """Spend ``budget_ratio`` of capacity on the two levers, in value order, for a baseline
    load of ``baseline_ratio`` of capacity."""
    if baseline_ratio <= 0 or budget_ratio <= 0:
        return Levers(0.0, 0.0, 0.0)
    left = budget_ratio
    funnel = upgrade = 0.0
    for lever in ("funnel", "upgrade") if cfg.funnel_first else ("upgrade", "funnel"):
        if lever == "funnel":
            funnel = min(cfg.funnel_max_extra, left / (baseline_ratio * cfg.funnel_cost))
            left -= funnel * baseline_ratio * cfg.funnel_cost
        else:
            upgrade = min(1.0, left / (baseline_ratio * cfg.upgrade_cost))
            left -= upgrade * baseline_ratio * cfg.upgrade_cost
    return Levers(funnel, upgrade, budget_ratio - max(0.0, left))


class Claim(NamedTuple):
    """What one pool held of the fleet's optional-work limit, as of a control period's end,
    and its capacity then (both in the limit's units)."""

    units: float
    capacity_units: float
    at: datetime


@dataclass(slots=True)
class GlobalBudget:
    """Optional work across pools capped at ``limit_units`` (device-equivalents, say).

    Pools step at their own times, so each asks when it steps: it may hold what the
    others leave (:meth:`grant`). What a pool holds stays held until its next step; a
    pool that gives work back frees room for the next that asks.

    Where the pools are planned in several processes (the control role split by region),
    each process grants its own pools (``held``) and hears the others' as claims
    (:meth:`claim`), a step late: a claim counts until a newer one replaces it, or for
    ``claim_life_s`` of event time after it was made (a process gone with its regions, and
    nobody planning them since). Pools of different processes step at the same period
    ends, each on a view of the others that is a step old, so what is free is shared out,
    not taken first come: while other processes claim, a pool grows by at most its share
    of the free units in proportion to its capacity. Grown so at once, every pool of the
    fleet together takes at most what was free; giving back is never held up.
    """

    limit_units: float
    claim_life_s: float = math.inf
    held: dict[str, Claim] = field(default_factory=dict)  # pool -> what it holds, ours
    remote: dict[str, Claim] = field(default_factory=dict)  # other processes' pools

    def grant(
        self, pool: str, ratio: float, capacity_units: float, now: datetime | None = None
    ) -> float:
        """The share of ``pool``'s capacity it may give optional work: ``ratio``, or less
        when the other pools already hold most of the limit (as of ``now``)."""
        capacity = max(0.0, capacity_units)
        others, remote_capacity = self._others(pool, now)
        room = max(0.0, self.limit_units - others)
        if remote_capacity > 0:  # shared with other processes: grow by a share of what is free
            before = self.held[pool].units if pool in self.held else 0.0
            local = sum(c.capacity_units for p, c in self.held.items() if p != pool)
            share = capacity / (capacity + local + remote_capacity)
            room = min(room, before + max(0.0, room - before) * share)
        granted = min(ratio, room / capacity) if capacity > 0 else 0.0
        at = now if now is not None else datetime.min.replace(tzinfo=UTC)
        self.held[pool] = Claim(granted * capacity, capacity, at)
        return granted

    def others(self, pool: str, now: datetime | None = None) -> float:
        """The units every pool but ``pool`` holds: ours, and the live claims of pools we do
        not plan."""
        return self._others(pool, now)[0]

    def _others(self, pool: str, now: datetime | None) -> tuple[float, float]:
        """:meth:`others`, and the capacity of the live claims among them."""
        total = sum(c.units for p, c in self.held.items() if p != pool)
        capacity = 0.0
        for p, c in self.remote.items():
            if p == pool or p in self.held:
                continue
            if now is None or (now - c.at).total_seconds() <= self.claim_life_s:
                total += c.units
                capacity += c.capacity_units
        return total, capacity

    def claim(self, pool: str, claim: Claim) -> None:
        """Another process's pool holds ``claim.units`` of ``claim.capacity_units`` as of
        ``claim.at`` (a claim older than the one heard is ignored: a replay or a reorder
        changes nothing)."""
        heard = self.remote.get(pool)
        if heard is None or claim.at >= heard.at:
            self.remote[pool] = claim

    def release(self, pools: Iterable[str]) -> None:
        """Forget what ``pools`` held here: another process plans them now."""
        for pool in pools:
            self.held.pop(pool, None)


def _change_noise(readings: list[float]) -> float | None:
    """The standard deviation of a reading's change from the one before, from the median
    absolute change (robust to the step or the trend a window may hold); None with fewer
    than two readings."""
    if len(readings) < 2:
        return None
    return 1.4826 * median(abs(b - a) for a, b in itertools.pairwise(readings))
