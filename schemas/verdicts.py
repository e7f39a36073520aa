"""What the stream processors conclude, and what the controllers decide.

A :class:`Verdict` is a health judgement about one device, with the signals
behind it; a :class:`Forecast` is the demand expected for a model in a region.
A :class:`Decision` is what a controller wanted and what survived its stages
(ladder hysteresis, the shared guardrail), with a closed reason; refusals are
decisions too, so an SRE can ask why nothing happened.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated
from uuid import UUID

from pydantic import Field

from schemas.base import (
    AcceleratorType,
    Contract,
    Identifier,
    IntervalSeconds,
    PerSecond,
    Ratio,
    Seconds,
    UtcDatetime,
)


class HealthStatus(StrEnum):
    """Ordered from best to worst; see :data:`SEVERITY`."""

    HEALTHY = "healthy"
    SUSPECT = "suspect"  # a soft signal over its threshold, not yet sustained
    DYING = "dying"  # a soft signal sustained: the device is degrading
    FAILED = "failed"  # a hard fault: fatal XID, double-bit ECC, lost heartbeat, failed probe


SEVERITY: dict[HealthStatus, int] = {s: i for i, s in enumerate(HealthStatus)}


class Level(StrEnum):
    """What a verdict judges: one device, or a group whose devices deviate together (the
    cause is shared: a node's cooling, a rack's air or power, a rollout on a cohort)."""

    DEVICE = "device"
    NODE = "node"
    RACK = "rack"
    COHORT = "cohort"  # an accelerator type, or a model, in a region


Evidence = Annotated[float, Field(ge=-1e15, le=1e15)]
"""A signal's value or threshold: a rate, a duration, a temperature, a ratio, a count
over a device's life; none comes near 1e15 (a forged 1e308 does)."""
Setting = Annotated[float, Field(ge=-1e9, le=1e9)]
"""What a controller decides, and its PID terms: a ratio, a batch size, watts, replicas;
all well under a billion."""


HARD_CONFIRMED = "hard_confirmed"
"""The signal a ``failed`` verdict carries beside evidence the device reports of itself (a
double-bit ECC error, a fatal XID, a failed probe): how many samples in a row, at least a
second apart in broker time, carried it (threshold 2). Only confirmed evidence of the
device's own lets an isolation skip the pool and rack caps and the rate limit: one forged
message cannot confirm itself, and a skewed clock cannot produce a device's error counter.
Silence (a lost heartbeat, a device gone quiet) is judged on broker time and never skips
them: a partition, a skewed or a stalled agent can fake silence, not an error counter."""


COUNTED_SIGNALS = frozenset({"probe_slow"})
"""Soft signals whose value counts occurrences (slow probes in a row) rather than measures a
level: one is suspect, ``threshold`` of them sustained; a count that restarts has not
receded."""


SILENCE_SIGNALS = ("heartbeat_lost_s", "device_silent_s")
"""Hard signals of silence: a node's heartbeats lost, a device gone quiet while its node
reports. Judged on broker time; never confirmed evidence (see :data:`HARD_CONFIRMED`)."""


class Signal(Contract):
    """One piece of evidence: what was measured, against what threshold."""

    name: Identifier
    value: Evidence
    threshold: Evidence


class Verdict(Contract):
    """The health of one device as of ``observed_at`` (event time of its newest evidence),
    or of a group (``level``) whose devices deviate together: then ``device_uuid`` and
    ``scope`` name the group (a node id, a rack id, ``TYPE@region`` or ``model@region``),
    and fields that do not apply to it say ``*``."""

    verdict_id: UUID
    observed_at: UtcDatetime
    device_uuid: Identifier
    node_id: Identifier
    region: Identifier
    rack_id: Identifier
    pool: Identifier
    accelerator_type: AcceleratorType
    status: HealthStatus
    previous_status: HealthStatus
    score: Ratio = Field(description="0 healthy .. 1 certainly faulty")
    evidence: Annotated[str, Field(max_length=1024)] = ""
    signals: tuple[Signal, ...] = ()
    cause_event_id: UUID | None = Field(default=None, description="the event that settled it")
    cause_appended_at: UtcDatetime | None = Field(
        default=None, description="when that event reached the broker (its log timestamp)"
    )
    level: Level = Field(default=Level.DEVICE, description="what is judged: a device or a group")
    scope: Identifier | None = Field(default=None, description="the group judged, if a group")
    attribution: Annotated[str, Field(max_length=1024)] = Field(
        default="", description="why this level: what the device or group deviates from"
    )
    members: Annotated[int, Field(ge=0, le=1_000_000)] | None = Field(
        default=None, description="a group's devices with a current reading"
    )


ATTRIBUTE = "attribute"
"""The action of a decision that attributes a deviation to a group and isolates no device."""


class DecisionOutcome(StrEnum):
    ISSUED = "issued"  # a command was sent
    REFUSED = "refused"  # a stage (guardrail, hysteresis) said no
    ADVISORY = "advisory"  # no signing key: what would have been sent


class Decision(Contract):
    """What a controller wanted for one target, and what came of it."""

    decision_id: UUID
    decided_at: UtcDatetime
    controller: Identifier
    target: Identifier
    pool: Identifier | None = None
    rack_id: Identifier | None = None
    action: Identifier
    outcome: DecisionOutcome
    reason: Identifier = Field(description="closed per controller: a metric label and a filter")
    message: Annotated[str, Field(max_length=1024)] = ""
    verdict_id: UUID | None = None
    verdict_status: HealthStatus | None = None
    command_id: UUID | None = None
    cause_event_id: UUID | None = None
    cause_observed_at: UtcDatetime | None = None
    cause_appended_at: UtcDatetime | None = None
    p_term: Setting | None = None
    i_term: Setting | None = None
    d_term: Setting | None = None
    desired: Setting | None = None
    applied: Setting | None = None


class Forecast(Contract):
    """Demand for one model in one region, ``horizon_s`` after ``made_at``, with its band."""

    forecast_id: UUID
    made_at: UtcDatetime = Field(description="end of the step it was made from (event time)")
    target_at: UtcDatetime
    model: Identifier
    region: Identifier
    horizon_s: Seconds
    step_s: IntervalSeconds
    observed_rps: PerSecond = Field(description="demand in the step just ended")
    point_rps: PerSecond
    low_rps: PerSecond
    high_rps: PerSecond
    chosen: Identifier = Field(description="the candidate model with the lowest recent error")
