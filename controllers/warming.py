"""The warming policy: replicas ready before demand arrives, let go when it will not.

Per (model, region), once per step, from the demand forecast's band at each
horizon (in steps), the replicas ready and loading, one replica's capacity
(requests per step) and the load time (steps):

- **warm**: enough replicas for the band's upper edge at the first horizon at
  least one load time ahead (a replica started now serves from then), and never
  fewer than the demand seen now needs; the shortfall is warmed now;
- **cool**: a replica is kept while the upper edge at any horizon up to
  ``keep_steps`` still needs it (a keep-alive derived from the forecast, not a
  timer); a surplus held for ``cool_after_steps`` steps is cooled;
- **budget**: once the replica-steps spent exceed ``budget_replica_steps``, no
  more pre-warming beyond what demand needs now.

Every decision says what it wanted, what it asked for and why; a
:class:`WarmDecision` with ``replicas == 0`` is a hold. Pure: numbers and the
step index in, a decision out.

Example::

    policy = WarmingPolicy(WarmingConfig())
    d = policy.step(step=n, bands=forecaster.forecast(), ready=2, loading=0,
                    capacity=600.0, load_steps=1, observed=900.0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class BandLike(Protocol):
    @property
    def point(self) -> float: ...
    @property
    def high(self) -> float: ...


class WarmReason(StrEnum):
    FORECAST_RISE = "forecast_rise"  # the band ahead needs more than there is
    DEMAND_NOW = "demand_now"  # demand now exceeds what is ready or loading
    FORECAST_FALL = "forecast_fall"  # the band up to the keep horizon needs fewer
    HOLD = "hold"
    BUDGET = "budget"  # pre-warming stopped: the replica budget is spent


@dataclass(frozen=True, slots=True)
class WarmingConfig:
    keep_steps: int = 5
    cool_after_steps: int = 2
    min_replicas: int = 0
    headroom_ratio: float = 1.0  # scale the band's upper edge (1: as forecast)
    budget_replica_steps: float = math.inf

    def __post_init__(self) -> None:
        if self.keep_steps < 1 or self.cool_after_steps < 1 or self.min_replicas < 0:
            raise ValueError("keep_steps and cool_after_steps >= 1, min_replicas >= 0")
        if not (math.isfinite(self.headroom_ratio) and self.headroom_ratio > 0):
            raise ValueError(f"headroom_ratio must be positive, not {self.headroom_ratio!r}")


@dataclass(frozen=True, slots=True)
class WarmDecision:
    replicas: int  # > 0 warm this many, < 0 cool this many, 0 hold
    desired: int  # replicas the policy wants
    reason: WarmReason
    message: str


def replicas_for(demand: float, capacity: float) -> int:
    """Replicas that serve ``demand`` (per step) at ``capacity`` per replica."""
    if capacity <= 0:
        raise ValueError(f"a replica's capacity must be positive, not {capacity!r}")
    if not math.isfinite(demand) or demand <= 0:
        return 0
    return math.ceil(demand / capacity - 1e-9)


class WarmingPolicy:
    """Warms for the forecast band's upper edge one load time ahead, keeps replicas while
    the band a few steps ahead needs them, cools a surplus that has lasted. One instance
    per (model, region)."""

    def __init__(self, config: WarmingConfig) -> None:
        self.config = config
        self.surplus_since: int | None = None
        self.spent_replica_steps = 0.0

    def step(
        self,
        *,
        step: int,
        bands: Mapping[int, BandLike],
        ready: int,
        loading: int,
        capacity: float,
        load_steps: int,
        observed: float,
    ) -> WarmDecision:
        c = self.config
        have = ready + loading
        self.spent_replica_steps += have
        now_need = max(c.min_replicas, replicas_for(observed, capacity))
        ahead = [h for h in sorted(bands) if h >= max(1, load_steps)]
        lead = ahead[0] if ahead else None
        over_budget = self.spent_replica_steps > c.budget_replica_steps
        want = now_need
        if lead is not None and not over_budget:
            want = max(want, replicas_for(bands[lead].high * c.headroom_ratio, capacity))
        if want > have:
            self.surplus_since = None
            reason = WarmReason.DEMAND_NOW if want == now_need else WarmReason.FORECAST_RISE
            where = "now" if reason is WarmReason.DEMAND_NOW else f"in {lead} steps"
            return WarmDecision(
                want - have, want, reason, f"need {want} replicas {where}, have {have}"
            )
        keep = now_need
        if not over_budget:
            for h, band in bands.items():
                if h <= c.keep_steps:
                    keep = max(keep, replicas_for(band.high * c.headroom_ratio, capacity))
        if have > keep:
            if self.surplus_since is None:
                self.surplus_since = step
            if step - self.surplus_since + 1 >= c.cool_after_steps:
                self.surplus_since = None
                return WarmDecision(
                    keep - have,
                    keep,
                    WarmReason.FORECAST_FALL,
                    f"the forecast up to {c.keep_steps} steps needs {keep}, have {have}",
                )
        else:
            self.surplus_since = None
        reason = WarmReason.BUDGET if over_budget else WarmReason.HOLD
        return WarmDecision(0, max(keep, want), reason, f"have {have}, keep {keep}")
