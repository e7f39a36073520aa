"""The TPOT guard: a pool's batch-size target, lowered when TPOT rises, raised with hysteresis.

A bigger batch gives more tokens per second and a slower token for each
sequence. Per pool, once per period, from the TPOT p95 against its SLO, as a
trend: the median of the last ``trend_window`` periods (a one-period sensor
spike moves nothing; a step does by the second period):

- above ``high_ratio`` of the SLO: the target drops to ``decrease_factor`` of
  itself (multiplicative: fast), at most once per ``cooldown_periods`` (and,
  while the trend still holds readings from before the last cut, only on a
  reading at the new cap that is over the mark too: a cut that is working is
  not cut again on old readings), but
  only when the batch in use is above that (the cap binds): a pool whose TPOT
  is slow at a small batch is slow for another reason, and a smaller cap would
  cost throughput for nothing (``not_batch_bound``); nor at the token speed's
  ceiling (below) while the trend is under the SLO less its noise (the
  ceiling is the batch the TPOT model puts at ``high_ratio``: a full batch
  there reads ``high_ratio`` within the model's error, ``at_ceiling``); nor
  while mandatory work
  (baseline or batch: no optional work is admitted) waits behind the cap and
  the TPOT trend is still within the SLO: the pool is load-bound, and a
  smaller cap would serve fewer sequences at once, turning a TPOT that meets
  its SLO into a queue that does not (``queue_bound``; the router's admission
  keeps the token time under the SLO). A cut from above the ceiling (the
  first speed reading sets one under ``max_batch``) stops at the ceiling,
  where the TPOT model puts TPOT at the mark;
- below ``low_ratio`` for ``hold_periods`` periods in a row (each reading,
  not the trend: raising is the risky direction): it rises by
  ``increase_step`` (additive: slow), back up to ``max_batch``;
- with work waiting while the cap binds (its queue is part of the latency a
  user sees, the time to first token): it rises by ``increase_step`` each
  period while the TPOT predicted at the higher cap stays under
  ``high_ratio`` less ``waiting_margin`` (so a raise never sets up the next
  cut: with no gap the two make a limit cycle; TPOT grows as ``1 + batch /
  doubling_batch``, the model the planner sizes its room with), whatever the
  band says: a cap cut for a slowdown that has passed must not hold baseline
  work in the queue;
- with mandatory work waiting (no optional work admitted; no cut follows while
  the trend is within the SLO) the queue breaches before the token time does:
  the raise may pass the speed's ceiling (below), by a step or less, while the
  TPOT predicted stays under the SLO less ``queue_margin`` (or three robust
  standard deviations of one reading's noise, if more). Once nothing
  mandatory has waited for ``hold_periods``, a trend over ``high_ratio`` takes
  the cap back to where that raise began (``margin_back``), not to
  ``decrease_factor`` of it; a trend over the SLO after such a raise (the TPOT
  model missed) is cut as ever, and no margin is spent again until the speed
  sets a new ceiling;
- in between (the hysteresis band), or with no valid reading: it holds.

Ahead of all of these, the token speed (feedforward, one period): the pool's
TPOT at a batch of one (``unit_tpot_s``, read so that one odd second does not
move it). When it moves by more than the noise (``speed_noise_multiple``
robust standard deviations of its period-to-period jitter, and at least
``speed_tolerance``, the margin ``high_ratio`` leaves under the SLO), the
ceiling moves at once to the largest batch whose TPOT stays under
``high_ratio`` of the SLO at the new speed, ``doubling_batch * (high_ratio *
slo / unit - 1)`` (``token_speed``): a slowdown cuts the cap to it in the
period it shows, with no cut on top until the trend holds only readings
taken at the new cap, and no raise past it; the speed coming back returns
the cap it cut. Coming back to the speed it left, a level known, it is told
from the slowed one by their gap and one reading's noise (a CUSUM of the
two levels' likelihood ratio, at ``speed_back_alpha``), not by the noise a
move to an unknown level must pass: a jitter that a rack's caps raise past a
small slowdown's size would hide its end. The first reading sets the speed it
starts from and the ceiling, not the cap (a cut from above it stops at it). A step
that sees the speed move says by how much (``speed_moved``, the new unit TPOT
over the old): the control planner sizes the optional-work budget's room at
the speed now in a period the tokens slowed down.

Example::

    g = TpotGuard(TpotGuardConfig(max_batch=256))
    g.step(tpot_p95_s=0.058, slo_s=0.06)   # -> BatchDecision(target=204, reason=tpot_high)
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import StrEnum
from statistics import median
from typing import Any


class BatchReason(StrEnum):
    TPOT_HIGH = "tpot_high"
    TOKEN_SPEED = "token_speed"  # the token speed moved: the cap follows the SLO's ceiling
    TPOT_LOW = "tpot_low"
    WORK_WAITING = "work_waiting"  # raised: work queues behind the cap, TPOT has room
    MARGIN_BACK = "margin_back"  # the queue a raise into the SLO's margin was for is gone
    AT_CEILING = "at_ceiling"  # held: TPOT at the speed's ceiling, within the model's error
    NOT_BATCH_BOUND = "not_batch_bound"
    QUEUE_BOUND = "queue_bound"  # held: work waits behind the cap, TPOT within the SLO
    HOLD = "hold"
    INVALID_INPUT = "invalid_input"


@dataclass(frozen=True, slots=True)
class TpotGuardConfig:
    max_batch: int = 256
    min_batch: int = 8
    high_ratio: float = 0.95
    low_ratio: float = 0.75
    # raised for waiting work while the TPOT predicted stays this far under high_ratio
    waiting_margin: float = 0.05
    # with mandatory work waiting, raised while the TPOT predicted stays this far under the
    # SLO itself (or three standard deviations of its jitter, if more)
    queue_margin: float = 0.02
    decrease_factor: float = 0.8
    increase_step: int = 16
    hold_periods: int = 3
    cooldown_periods: int = 1
    trend_window: int = 3
    doubling_batch: float = 128.0  # TPOT at this batch is twice TPOT at a batch of one
    # a speed change moves the ceiling when it is over this (the SLO's margin at high_ratio)
    speed_tolerance: float = 0.05
    # ... and over this many robust standard deviations of the period-to-period jitter
    speed_noise_multiple: float = 4.0
    speed_history: int = 30  # periods of jitter it estimates that from
    speed_min_history: int = 5  # periods before the first change is judged
    # the chance the return test reads a slowdown still on as over
    speed_back_alpha: float = 0.001

    def __post_init__(self) -> None:
        if not 1 <= self.min_batch <= self.max_batch:
            raise ValueError("1 <= min_batch <= max_batch")
        if not 0 < self.low_ratio < self.high_ratio:
            raise ValueError("0 < low_ratio < high_ratio: the gap is the hysteresis")
        if not 0 < self.waiting_margin < self.high_ratio:
            raise ValueError("0 < waiting_margin < high_ratio: a raise must not invite a cut")
        if not 0 < self.queue_margin < 1:
            raise ValueError("0 < queue_margin < 1: a raise for waiting work stays under the SLO")
        if not 0 < self.decrease_factor < 1 or self.increase_step < 1:
            raise ValueError("decrease_factor in (0, 1), increase_step >= 1")
        if self.trend_window < 1:
            raise ValueError("trend_window >= 1")
        if self.speed_tolerance <= 0 or self.speed_noise_multiple <= 0:
            raise ValueError("speed_tolerance and speed_noise_multiple > 0")
        if not 1 <= self.speed_min_history <= self.speed_history:
            raise ValueError("1 <= speed_min_history <= speed_history")
        if not 0 < self.speed_back_alpha < 1:
            raise ValueError("0 < speed_back_alpha < 1: the return test's error")


@dataclass(frozen=True, slots=True)
class BatchDecision:
    target: int
    previous: int
    reason: BatchReason
    message: str


class TpotGuard:
    """One pool's batch-size ceiling: lowered while TPOT nears its SLO, raised back in
    steps once it has held below the low mark."""

    def __init__(self, config: TpotGuardConfig) -> None:
        self.config = config
        self.target = config.max_batch
        self.low_streak = 0
        self.since_cut = config.cooldown_periods
        self.recent: deque[float] = deque(maxlen=config.trend_window)
        self.ceiling = config.max_batch  # the largest batch under the mark at the last speed
        self.speed_unit_s: float | None = None  # the token speed the ceiling was set at
        # the speed before the tokens slowed (set at the first slow move, cleared when they
        # speed up): the level a slowdown's end returns to, known, so tested as a level
        self.before_unit_s: float | None = None
        self.back_sum = 0.0  # the return test's statistic (a CUSUM between the two levels)
        self.restore: int | None = None  # the target a slowdown cut, to come back to
        # the target a raise for waiting mandatory work left to spend the SLO's margin (TPOT
        # over high_ratio): where it goes back to once the queue is gone
        self.margin_from: int | None = None
        # a trend over the SLO after such a raise: the TPOT model missed on this pool, so no
        # margin is spent again until the speed sets a new ceiling
        self.margin_spoiled = False
        self.unqueued = 0  # periods in a row with no mandatory work waiting
        self.last_unit_s: float | None = None
        self.jitter: deque[float] = deque(maxlen=config.speed_history)  # |log| period steps
        # the last step's token-speed move (new unit TPOT over the old), if it saw one
        self.speed_moved: float | None = None

    def remember(self) -> dict[str, Any]:
        """Its state as JSON-able values: the batch cap in force and what the guard knows
        of it (the cap a slowdown cut and the speed it was cut at, the trend, the token
        speed's jitter), so another process's guard goes on from exactly here."""
        return {
            "target": self.target, "low_streak": self.low_streak, "since_cut": self.since_cut,
            "recent": list(self.recent), "ceiling": self.ceiling,
            "speed_unit_s": self.speed_unit_s, "restore": self.restore,
            "margin_from": self.margin_from, "margin_spoiled": self.margin_spoiled,
            "last_unit_s": self.last_unit_s, "jitter": list(self.jitter),
            "before_unit_s": self.before_unit_s, "back_sum": self.back_sum,
        }  # fmt: skip

    def recall(self, memory: dict[str, Any]) -> None:
        """Go on from what :meth:`remember` wrote. Raises ``ValueError`` on another shape
        (the guard is then left as it was)."""
        try:
            target, ceiling = int(memory["target"]), int(memory["ceiling"])
            streak, since = int(memory["low_streak"]), int(memory["since_cut"])
            recent = [float(x) for x in memory["recent"]]
            jitter = [float(x) for x in memory["jitter"]]
            speed, last = memory["speed_unit_s"], memory["last_unit_s"]
            restore = memory["restore"]
            margin_from = memory.get("margin_from")  # absent in a memory from before it
            spoiled = bool(memory.get("margin_spoiled", False))
            before_unit = memory.get("before_unit_s")  # absent before the return test
            back_sum = float(memory.get("back_sum", 0.0))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a TPOT guard's memory: {exc!r}") from exc
        c = self.config
        if not c.min_batch <= target <= c.max_batch or not c.min_batch <= ceiling <= c.max_batch:
            raise ValueError(f"a batch cap outside [{c.min_batch}, {c.max_batch}]: {memory}")
        self.target, self.ceiling, self.low_streak, self.since_cut = target, ceiling, streak, since
        self.recent.clear()
        self.recent.extend(recent)
        self.jitter.clear()
        self.jitter.extend(jitter)
        self.speed_unit_s = None if speed is None else float(speed)
        self.last_unit_s = None if last is None else float(last)
        self.restore = None if restore is None else int(restore)
        self.margin_from = None if margin_from is None else int(margin_from)
        self.margin_spoiled = spoiled
        self.before_unit_s = None if before_unit is None else float(before_unit)
        self.back_sum = back_sum

    def step(
        self,
        *,
        tpot_p95_s: float | None,
        slo_s: float,
        batch_in_use: int | None = None,
        waiting: bool = False,
        mandatory: bool = False,
        unit_tpot_s: float | None = None,
        queued: bool | None = None,
    ) -> BatchDecision:
        """One period; ``batch_in_use`` is the largest batch a replica ran (None: unknown,
        taken as binding); ``waiting``, whether work queued behind it; ``mandatory``,
        whether that work is mandatory, baseline or batch (no optional work was admitted);
        ``unit_tpot_s``, the pool's TPOT at a batch of one (None: no speed ceiling);
        ``queued``, whether work queued at all, behind the cap or not (None: as
        ``waiting``): a queue the router's own token-time mark holds back is still one."""
        c, before = self.config, self.target
        self.since_cut += 1
        self.unqueued = 0 if (waiting or queued) and mandatory else self.unqueued + 1
        self.speed_moved = None
        if tpot_p95_s is None or not math.isfinite(tpot_p95_s) or not slo_s > 0:
            self.low_streak = 0
            return BatchDecision(before, before, BatchReason.INVALID_INPUT, "no TPOT: held")
        ratio = tpot_p95_s / slo_s
        self.recent.append(ratio)
        if (speed := self._speed(unit_tpot_s, slo_s, before)) is not None:
            self.low_streak = 0
            return speed
        if (trend := median(self.recent)) > c.high_ratio:
            ratio = trend
            self.low_streak = 0
            cut = max(c.min_batch, math.floor(self.target * c.decrease_factor))
            if self.target > self.ceiling and self.margin_from is None:
                # a cut from above the speed's ceiling (where the TPOT model puts TPOT at the
                # mark) stops at it: further costs throughput for nothing. (A cap a raise for
                # waiting work took past it, and over the SLO now, is where the model missed:
                # that is cut as ever.) Never deeper than decrease_factor at once: a slow
                # model's ceiling may be a batch of 19 where its pool runs 53, and a cut
                # there trades a TPOT a few points over for a third of the throughput
                cut = max(cut, self.ceiling)
            if batch_in_use is not None and batch_in_use <= cut:
                return BatchDecision(before, before, BatchReason.NOT_BATCH_BOUND,
                                     f"TPOT at {ratio:.2f} of the SLO at batch {batch_in_use}: "
                                     f"a cap of {cut} would not change it")  # fmt: skip
            mark = self._queue_mark()
            if self.target == self.ceiling < c.max_batch and trend <= mark:
                # the cap is the speed's ceiling, the batch the TPOT model puts at high_ratio:
                # a full batch there reads high_ratio give or take the model's error, and a
                # cut on that cuts the ceiling's own design point (held-out seed 96: two 20%
                # cuts on 0.950 through a surge queued 8 s of baseline work). Cut past the
                # mark a raise for waiting work may reach, the SLO less one reading's noise
                return BatchDecision(before, before, BatchReason.AT_CEILING,
                                     f"TPOT at {ratio:.2f} of the SLO at the token speed's "
                                     f"ceiling, batch {before}: held under {mark:.2f}")  # fmt: skip
            if waiting and mandatory and trend <= 1.0:
                return BatchDecision(before, before, BatchReason.QUEUE_BOUND,
                                     f"TPOT at {ratio:.2f} of the SLO with work waiting behind "
                                     f"a cap of {before}: a smaller one would only lengthen "
                                     "the queue")  # fmt: skip
            if self.margin_from is not None and trend <= 1.0:
                # the queue the margin was spent on gone for hold_periods (a queue that
                # comes and goes is still the load): back to where it began, not a cut (the
                # TPOT is where the raise put it, within the SLO)
                if self.unqueued < c.hold_periods:
                    return BatchDecision(before, before, BatchReason.QUEUE_BOUND,
                                         f"TPOT at {ratio:.2f} of the SLO, a cap of {before} "
                                         "raised for a queue of mandatory work that has "
                                         f"been gone {self.unqueued} period(s): held")  # fmt: skip
                self.target, self.margin_from = self.margin_from, None
                self.since_cut = 1 - c.trend_window  # no cut on readings from before it
                return BatchDecision(self.target, before, BatchReason.MARGIN_BACK,
                                     f"TPOT at {ratio:.2f} of the SLO with no mandatory work "
                                     f"waiting: batch {before} -> {self.target}, the cap before "
                                     "the queue")  # fmt: skip
            if self.since_cut < c.trend_window and (reading := self.recent[-1]) <= c.high_ratio:
                # the trend still holds readings from before the last cut, and this one,
                # at the cap that cut left, is under the mark: the cut is working
                return BatchDecision(before, before, BatchReason.HOLD,
                                     f"TPOT at {reading:.2f} of the SLO at the cap of {before} "
                                     f"the last cut left (trend {trend:.2f}): held")  # fmt: skip
            if self.since_cut >= c.cooldown_periods and self.target > c.min_batch:
                self.margin_spoiled |= self.margin_from is not None
                self.target, self.margin_from = cut, None
                self.since_cut = 0
                return BatchDecision(self.target, before, BatchReason.TPOT_HIGH,
                                     f"TPOT at {ratio:.2f} of the SLO: batch {before} -> "
                                     f"{self.target}")  # fmt: skip
        elif (
            waiting
            and self.target < c.max_batch
            and (batch_in_use is None or batch_in_use >= self.target - c.increase_step)
        ):
            self.low_streak = 0
            # a step, under the speed's ceiling (set at high_ratio), while the TPOT predicted
            # stays under the mark (TPOT grows as 1 + batch / doubling_batch from where it
            # reads now). With mandatory work waiting (no optional work admitted) no cut
            # follows while the trend is within the SLO (queue_bound): there the queue, not
            # the token time, breaches first, so past the ceiling, as far as the SLO less the
            # TPOT's own noise allows
            k, now = c.doubling_batch, max(ratio, trend)
            if mandatory and not self.margin_spoiled:
                mark = self._queue_mark()
                top = math.ceil(k * (mark * (1 + self.target / k) / now - 1)) - 1
            else:
                mark = c.high_ratio if mandatory else c.high_ratio - c.waiting_margin
                top = self.ceiling
            raised = min(c.max_batch, self.target + c.increase_step, top)
            grow = (1 + raised / k) / (1 + self.target / k)
            if raised > self.target and now * grow < mark:
                past = now * grow > c.high_ratio or raised > self.ceiling
                if past and self.margin_from is None:
                    self.margin_from = self.target
                self.target = raised
                return BatchDecision(self.target, before, BatchReason.WORK_WAITING,
                                     f"work waits behind a cap of {before} with TPOT at "
                                     f"{ratio:.2f} of the SLO (about {ratio * grow:.2f} at "
                                     f"{raised}): batch {before} -> {raised}")  # fmt: skip
        elif ratio < c.low_ratio:
            self.low_streak += 1
            if self.low_streak >= c.hold_periods and self.target < min(c.max_batch, self.ceiling):
                self.low_streak = 0
                self.target = min(c.max_batch, self.target + c.increase_step, self.ceiling)
                return BatchDecision(self.target, before, BatchReason.TPOT_LOW,
                                     f"TPOT at {ratio:.2f} of the SLO for {c.hold_periods} "
                                     f"periods: batch {before} -> {self.target}")  # fmt: skip
        else:
            self.low_streak = 0
        return BatchDecision(before, before, BatchReason.HOLD, f"TPOT at {ratio:.2f}: held")

    def slow_mark_s(self) -> float | None:
        """The TPOT at a batch of one past which the token speed has slowed by more than
        its noise, as the next step would judge it (None: no speed known yet, or too little
        of its jitter to judge by): what the control planner watches for within a period."""
        if self.speed_unit_s is None or len(self.jitter) < self.config.speed_min_history:
            return None
        return self.speed_unit_s * math.exp(self._speed_noise())

    def _speed_noise(self) -> float:
        """How far (as a log ratio) the token speed must move to be taken for a move:
        ``speed_noise_multiple`` robust deviations of its jitter, and ``speed_tolerance`` at
        least."""
        c = self.config
        return max(c.speed_tolerance, c.speed_noise_multiple * self._jitter_sigma())

    def _queue_mark(self) -> float:
        """How near the SLO a raise for waiting mandatory work may take TPOT: under it by
        three robust standard deviations of one reading's noise (a reading that noisy stays
        within the SLO), and at least ``queue_margin``. The jitter is of steps, the
        difference of two readings: one reading's is that over the square root of 2."""
        c = self.config
        noise = self._jitter_sigma() / math.sqrt(2.0)
        return max(c.high_ratio, 1.0 - max(c.queue_margin, 3.0 * noise))

    def _jitter_sigma(self, last: int | None = None) -> float:
        """The token speed's period-to-period jitter as a standard deviation: its median
        absolute step, scaled as the MAD is (robust to the steps a slowdown makes); of the
        ``last`` steps only, if given."""
        steps = list(self.jitter) if last is None else list(self.jitter)[-last:]
        return 1.4826 * median(steps) if steps else 0.0

    def _ceiling_at(self, unit_s: float, slo_s: float) -> int:
        """The largest batch whose TPOT stays under ``high_ratio`` of the SLO at a token
        speed of ``unit_s`` (TPOT grows as ``1 + batch / doubling_batch``)."""
        c = self.config
        fresh = math.floor(c.doubling_batch * (c.high_ratio * slo_s / unit_s - 1.0))
        return max(c.min_batch, min(c.max_batch, fresh))

    def _back(self, unit_s: float) -> bool:
        """Whether the tokens are back at the speed they ran before they slowed. That level
        is known (a slowdown that ends returns to it), so the readings are tested between
        it and the level set since, not against the noise a move to an unknown level must
        pass: Page's CUSUM of each reading's log-likelihood ratio of the two levels (one
        reading's noise is the jitter of a step over the square root of 2), over ``ln(1 /
        speed_back_alpha)``. A gap of six of one reading's sigmas is told in one reading, a
        smaller one takes more (fresh seed 59: an 11% slowdown in a rack's feed loss,
        its return never past the jitter, 0.10 and, with the return in it, 0.14; the budget
        waited out its window for room that was real)."""
        before, now = self.before_unit_s, self.speed_unit_s
        if before is None or now is None or not now > before:
            self.back_sum = 0.0
            return False
        gap, x = math.log(now / before), math.log(unit_s / before)
        # the noise now: the jitter's, or its last few steps' if more (a rack's caps may
        # shake the readings more than the window has seen yet; a false return is the risk)
        recent = self._jitter_sigma(last=2 * self.config.trend_window)
        sigma = max(self._jitter_sigma(), recent) / math.sqrt(2.0)
        if sigma <= 0.0:  # no jitter seen: the nearer level is the level
            return x < 0.5 * gap
        self.back_sum = max(0.0, self.back_sum + (0.5 * gap - x) * gap / sigma**2)
        return self.back_sum > math.log(1.0 / self.config.speed_back_alpha)

    def _speed(self, unit_s: float | None, slo_s: float, before: int) -> BatchDecision | None:
        """The ceiling, moved when the token speed has moved past its noise; a decision when
        that changes the target."""
        c = self.config
        if unit_s is None or not math.isfinite(unit_s) or unit_s <= 0:
            return None
        if self.last_unit_s is not None:
            self.jitter.append(abs(math.log(unit_s / self.last_unit_s)))
        self.last_unit_s = unit_s
        if self.speed_unit_s is None:
            # the first reading is where the speed starts from and sets the ceiling, not the
            # cap: a pool is cut when its TPOT shows it (below), and not past that ceiling
            self.speed_unit_s = unit_s
            self.ceiling = self._ceiling_at(unit_s, slo_s)
            return None
        if len(self.jitter) < c.speed_min_history:
            return None
        moved = math.log(unit_s / self.speed_unit_s)
        if abs(moved) <= self._speed_noise() and not self._back(unit_s):
            return None
        change = f"{math.exp(moved) - 1:+.0%} since it was last set"
        if moved > 0 and self.before_unit_s is None:
            self.before_unit_s = self.speed_unit_s
        elif moved < 0:
            self.before_unit_s = None
        self.back_sum = 0.0
        self.speed_moved, self.speed_unit_s = unit_s / self.speed_unit_s, unit_s
        # a new ceiling: the margin is spent from it, if at all
        self.margin_from, self.margin_spoiled = None, False
        self.ceiling = self._ceiling_at(unit_s, slo_s)
        if self.ceiling < self.target:
            self.restore = self.restore or self.target
            # the trend's readings are from before the cut: no cut on them on top of it
            self.target, self.since_cut = self.ceiling, 1 - c.trend_window
        elif self.restore is not None and self.target < min(self.restore, self.ceiling):
            self.target = min(self.restore, self.ceiling)
        if self.restore is not None and self.target >= self.restore:
            self.restore = None
        if self.target == before:
            return None
        return BatchDecision(self.target, before, BatchReason.TOKEN_SPEED,
                             f"a token takes {unit_s * 1000:.1f} ms at a batch of one ({change}): "
                             f"batch {self.ceiling} at most keeps TPOT under {c.high_ratio:g} of "
                             f"the SLO; batch {before} -> {self.target}")  # fmt: skip
