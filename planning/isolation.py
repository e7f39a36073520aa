"""Isolation: a step of the isolation ladder as its decision and, when allowed and keyed,
its signed route command.

The ladder and its guardrail (:mod:`controllers.isolation`,
:mod:`controllers.guardrail`) decide what a verdict calls for; this turns each
step into the record ClickHouse keeps (:class:`~schemas.verdicts.Decision`) and
the command the node executor acts on. ``health.isolate`` (:mod:`streams.health`)
feeds it verdicts and publishes what comes out; ``eval faults --in-process``
drives the same function.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from controllers.guardrail import Guardrail, GuardrailConfig
from controllers.isolation import IsolationLadder, LadderConfig, LadderDecision, LadderReason
from models.health import HealthConfig, HealthDetector
from planning.issuing import IssuerWiring, Output, issue
from planning.registry import ISOLATION
from schemas.commands import RouteCommand, Target
from schemas.verdicts import ATTRIBUTE, Decision, DecisionOutcome, HealthStatus, Level, Verdict


@dataclass(frozen=True)
class HealthTuning:
    """The health role's settings (``FLEETLOOP_HEALTH__*``, ``--health.*``)."""

    batch_within_s: float = 0.05
    memory_every_s: float = 60.0  # how often the detector's per-device records are kept
    detector: HealthConfig = field(default_factory=HealthConfig)
    ladder: LadderConfig = field(default_factory=LadderConfig)
    guardrail: GuardrailConfig = field(default_factory=GuardrailConfig)

    def __post_init__(self) -> None:
        for name in ("batch_within_s", "memory_every_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")


@dataclass(frozen=True)
class HealthWiring(HealthTuning, IssuerWiring):
    """What the health processors need besides the app: tuning and issuing."""


def detector(tuning: HealthTuning) -> HealthDetector:
    """The health detector ``health.detect`` runs, from its settings."""
    return HealthDetector(tuning.detector)


def ladder(tuning: HealthTuning) -> IsolationLadder:
    """The isolation ladder ``health.isolate`` runs, with its guardrail, from its settings
    (the guardrail learns the fleet's devices from the verdicts it sees)."""
    return IsolationLadder(tuning.ladder, Guardrail(tuning.guardrail, devices={}))


def decide(step: LadderDecision, now: datetime, wiring: HealthWiring) -> Output[RouteCommand]:
    """One ladder step -> its decision record and, when allowed and keyed, its command."""
    v = step.verdict
    decision_id = uuid.uuid4()
    command: RouteCommand | None = None
    node = step.unit is Level.NODE  # a node drained or restored as one unit
    target = Target(node_id=step.device_uuid) if node else Target(device_uuid=step.device_uuid)
    if not step.allowed:
        outcome = DecisionOutcome.REFUSED
    else:
        command = issue(
            RouteCommand, wiring, by=ISOLATION, at=now, decision_id=decision_id,
            target=target, reason=step.reason,
            message=step.message, cause_event_id=v.cause_event_id,
            cause_observed_at=v.observed_at, action=step.action, weight_ratio=step.weight_ratio,
        )  # fmt: skip
        outcome = DecisionOutcome.ADVISORY if command is None else DecisionOutcome.ISSUED
    decision = Decision(
        decision_id=decision_id,
        decided_at=now,
        controller=ISOLATION.name,
        target=step.device_uuid,
        pool=None if v.pool == "*" else v.pool,
        rack_id=None if v.rack_id == "*" else v.rack_id,
        action=step.action.value,
        outcome=outcome,
        reason=step.reason,
        message=step.message,
        verdict_id=v.verdict_id,
        verdict_status=v.status,
        command_id=None if command is None else command.command_id,
        cause_event_id=v.cause_event_id,
        cause_observed_at=v.observed_at,
        cause_appended_at=v.cause_appended_at,
        desired=float(step.rung),
        applied=float(step.rung) if step.allowed else None,
    )
    return Output(decision, command)


def attribute(verdict: Verdict, now: datetime) -> Output[RouteCommand] | None:
    """A group's verdict (common mode) as the decision an SRE reads: what the group's devices
    share, that no device of it is isolated for it, and when it is over. None for a device's
    verdict, and for a group's that changes nothing worth a record (suspect, or healthy
    after healthy)."""
    if verdict.level is Level.DEVICE:
        return None
    flagged = verdict.status in (HealthStatus.DYING, HealthStatus.FAILED)
    if not flagged and verdict.previous_status in (HealthStatus.HEALTHY, HealthStatus.SUSPECT):
        return None
    if flagged and verdict.level is Level.NODE:
        message = f"{verdict.attribution}; alert raised, the node drained as one unit"
    elif flagged:
        message = f"{verdict.attribution}; no device isolated for it, alert raised"
    else:
        message = f"{verdict.attribution}; alert cleared"
    decision = Decision(
        decision_id=uuid.uuid4(),
        decided_at=now,
        controller=ISOLATION.name,
        target=verdict.scope or verdict.device_uuid,
        pool=None if verdict.pool == "*" else verdict.pool,
        rack_id=None if verdict.rack_id == "*" else verdict.rack_id,
        action=ATTRIBUTE,
        outcome=DecisionOutcome.ADVISORY,
        reason=LadderReason.COMMON_MODE.value,
        message=message[:1024],
        verdict_id=verdict.verdict_id,
        verdict_status=verdict.status,
        cause_event_id=verdict.cause_event_id,
        cause_observed_at=verdict.observed_at,
        cause_appended_at=verdict.cause_appended_at,
    )
    return Output(decision, None)
