"""The control role's wiring, and how its controllers' decisions become throttle commands.

Shared by the capacity side (:mod:`streams.control`) and the power side
(:mod:`planning.racks`): both step once per ``period_s`` of event time and
turn what changed into a :class:`~schemas.verdicts.Decision` and, with a
signing key, a signed ``ThrottleCommand`` (a ``RouteCommand`` for a replica's
routing weight) (:meth:`ThrottleIssuer._output`).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from controllers.capacity import CapacityConfig, LeverConfig
from controllers.power import PowerConfig
from controllers.power_routing import PowerRoutingConfig
from controllers.tpot_guard import TpotGuardConfig
from planning.issuing import IssuerWiring, Output, issue
from planning.registry import Controller
from schemas.commands import RouteAction, RouteCommand, Target, ThrottleAction, ThrottleCommand
from schemas.verdicts import Decision, DecisionOutcome

ControlOutput = Output[ThrottleCommand | RouteCommand]
"""A capacity, batch, power or rack-routing decision with its command, if one was sent."""


@dataclass(frozen=True)
class ControlTuning:
    """The control role's settings (``FLEETLOOP_CONTROL__*``, ``--control.*``)."""

    period_s: float = 10.0
    # the processor's batch window: short, as a rack over its breaker limit waits in it
    # (part of the transport budget, tests/unit/test_breaker_budget.py)
    batch_within_s: float = 0.1
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
    power_routing: PowerRoutingConfig = field(default_factory=PowerRoutingConfig)


@dataclass(frozen=True)
class ControlWiring(ControlTuning, IssuerWiring):
    """The control processor's wiring: its tuning and how it issues commands."""


class ThrottleIssuer:
    """Periods of event time, and decisions with their throttle commands."""

    def __init__(
        self, wiring: ControlWiring, *, new_id: Callable[[], uuid.UUID] = uuid.uuid4
    ) -> None:
        self.wiring = wiring
        self.new_id = new_id

    def _period(self, at: datetime) -> int:
        return int(at.timestamp() // self.wiring.period_s)

    def _end(self, period: int) -> datetime:
        return datetime.fromtimestamp((period + 1) * self.wiring.period_s, UTC)

    def _output(
        self, at: datetime, target_name: str, by: Controller, action: ThrottleAction | RouteAction,
        reason: str, message: str, target: Target, *, changed: bool, extra: dict[str, Any],
        params: dict[str, Any],
    ) -> ControlOutput:  # fmt: skip
        decision_id = self.new_id()
        command: ThrottleCommand | RouteCommand | None = None
        if changed:
            fields = dict(
                by=by, at=at, decision_id=decision_id, new_id=self.new_id, target=target,
                reason=reason, message=message[:1024], **params,
            )  # fmt: skip
            if isinstance(action, RouteAction):
                command = issue(RouteCommand, self.wiring, action=action, **fields)
            else:
                command = issue(ThrottleCommand, self.wiring, action=action, **fields)
        outcome = DecisionOutcome.ISSUED if command is not None else DecisionOutcome.ADVISORY
        decision = Decision(
            decision_id=decision_id, decided_at=at, controller=by.name, target=target_name,
            pool=target.pool, action=action.value, outcome=outcome, reason=reason,
            message=message[:1024], command_id=None if command is None else command.command_id,
            **extra,
        )  # fmt: skip
        return Output(decision, command)
