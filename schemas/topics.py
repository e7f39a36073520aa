"""The topic registry: the single source of truth for every Kafka topic.

Names carry their contract version (``.v1``). Each telemetry topic has a dead
letter twin, ``<name>.dlq``, whose values are :class:`~schemas.commands.DeadLetter`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from schemas.commands import CommandResult, DeadLetter, RouteCommand, ThrottleCommand, WarmCommand
from schemas.derived import BudgetClaim, ServingStep
from schemas.envelopes import AcceleratorTick, ServingTick
from schemas.events import AcceleratorTelemetry, Demand, NodeHealth, PduReading, ServingMetrics
from schemas.state import ControlMemory, DemandMemory, DetectorMemory, IsolationRecord
from schemas.verdicts import Decision, Forecast, Verdict

HOUR_MS = 3600 * 1000
DAY_MS = 24 * HOUR_MS
# the largest record a state topic takes (its max.message.bytes; the worker's producer and
# the state readers are sized to it): a control region's record grows with the devices its
# levers hold, about 50 bytes each (a region of 50,000 devices, every one capped: 2.5 MB),
# over the broker's default of 1 MB
STATE_RECORD_BYTES = 16 * 1024 * 1024

RESENT_HEADER = "fleetloop-resent"
"""Record header an agent puts on a record it sends again from its spool (delivery is at
least once, so it may be a copy of one the broker has); the sink looks those up by
``event_id`` and stores each event once."""


class TopicKind(StrEnum):
    TELEMETRY = "telemetry"
    COMMAND = "command"
    RESULT = "result"
    VERDICT = "verdict"
    DECISION = "decision"
    FORECAST = "forecast"
    DEAD_LETTER = "dead_letter"
    STATE = "state"
    DERIVED = "derived"  # between the pipeline's own stages (a repartition)


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic: name, what keys it, what its values are, and how it is kept."""

    name: str
    kind: TopicKind
    value_type: type[Any]  # a Contract (v1 and every non-telemetry topic) or an envelope (v2)
    key_fields: tuple[str, ...]
    partitions: int
    retention_ms: int
    compacted: bool = False
    table: str = ""
    max_message_bytes: int | None = None  # None: the broker's default (1 MB)

    @property
    def dlq_name(self) -> str:
        return f"{self.name}.dlq"

    @property
    def envelope(self) -> bool:
        """Whether its values are node-tick envelopes (:mod:`schemas.envelopes`)."""
        return self.value_type in (AcceleratorTick, ServingTick)

    def key_for(self, value: Any) -> bytes:
        """Message key: the key fields joined by ``|`` (node id for telemetry)."""
        return "|".join(str(getattr(value, f)) for f in self.key_fields).encode()

    def config(self, *, log_append_time: bool = False) -> dict[str, str]:
        """Broker-side topic configuration (``retention_ms < 0``: kept until superseded).

        ``log_append_time`` stamps a telemetry topic's records with the broker's clock
        when they are appended, which is what liveness and silence are judged on; without
        it the producer's stamp stands (a simulator's clock, in a simulated world).
        """
        stamp = "LogAppendTime" if log_append_time and self.kind is TopicKind.TELEMETRY else None
        config = {"message.timestamp.type": stamp} if stamp else {}
        if self.max_message_bytes is not None:
            config["max.message.bytes"] = str(self.max_message_bytes)
        if self.retention_ms < 0:
            return {**config, "retention.ms": "-1", "cleanup.policy": "compact"}
        return {
            **config,
            "retention.ms": str(self.retention_ms),
            "cleanup.policy": "compact,delete" if self.compacted else "delete",
        }


ACCELERATOR = TopicSpec(
    "telemetry.accelerator.v1",
    TopicKind.TELEMETRY,
    AcceleratorTelemetry,
    ("node_id",),
    partitions=12,
    retention_ms=3 * DAY_MS,
    table="accelerator_telemetry",
)
NODE_HEALTH = TopicSpec(
    "telemetry.node_health.v1",
    TopicKind.TELEMETRY,
    NodeHealth,
    ("node_id",),
    partitions=12,
    retention_ms=3 * DAY_MS,
    table="node_health",
)
PDU = TopicSpec(
    "telemetry.pdu.v1",
    TopicKind.TELEMETRY,
    PduReading,
    ("pdu_id",),
    partitions=4,
    retention_ms=7 * DAY_MS,
    table="pdu_readings",
)
ACCELERATOR_TICKS = TopicSpec(
    "telemetry.accelerator.v2",
    TopicKind.TELEMETRY,
    AcceleratorTick,
    ("node_id",),
    partitions=12,
    retention_ms=3 * DAY_MS,
    table="accelerator_telemetry",  # one row per device sample, as v1
)
"""Node-tick envelopes of accelerator samples; agents publish these, v1 is still read."""
SERVING = TopicSpec(
    "telemetry.serving.v1",
    TopicKind.TELEMETRY,
    ServingMetrics,
    ("node_id",),
    partitions=12,
    retention_ms=3 * DAY_MS,
    table="serving_metrics",
)
SERVING_TICKS = TopicSpec(
    "telemetry.serving.v2",
    TopicKind.TELEMETRY,
    ServingTick,
    ("node_id",),
    partitions=12,
    retention_ms=3 * DAY_MS,
    table="serving_metrics",
)
"""Node-tick envelopes of serving metrics; agents publish these, v1 is still read."""
DEMAND = TopicSpec(
    "telemetry.demand.v1",
    TopicKind.TELEMETRY,
    Demand,
    ("model", "region"),
    partitions=4,
    retention_ms=14 * DAY_MS,
    table="demand",
)
ROUTE_COMMANDS = TopicSpec(
    "commands.route.v1",
    TopicKind.COMMAND,
    RouteCommand,
    ("target",),
    partitions=4,
    retention_ms=7 * DAY_MS,
    table="commands",
)
THROTTLE_COMMANDS = TopicSpec(
    "commands.throttle.v1",
    TopicKind.COMMAND,
    ThrottleCommand,
    ("target",),
    partitions=4,
    retention_ms=7 * DAY_MS,
    table="commands",
)
WARM_COMMANDS = TopicSpec(
    "commands.warm.v1",
    TopicKind.COMMAND,
    WarmCommand,
    ("model",),
    partitions=4,
    retention_ms=7 * DAY_MS,
    table="commands",
)
COMMAND_RESULTS = TopicSpec(
    "commands.results.v1",
    TopicKind.RESULT,
    CommandResult,
    ("command_id",),
    partitions=4,
    retention_ms=30 * DAY_MS,
    table="command_results",
)

VERDICTS = TopicSpec(
    "health.verdicts.v1",
    TopicKind.VERDICT,
    Verdict,
    ("device_uuid",),
    partitions=1,  # one isolation controller sees every verdict: its guardrail is fleet-wide
    retention_ms=30 * DAY_MS,
    table="verdicts",
)
DECISIONS = TopicSpec(
    "decisions.v1",
    TopicKind.DECISION,
    Decision,
    ("target",),
    partitions=4,
    retention_ms=30 * DAY_MS,
    table="decisions",
)

FORECASTS = TopicSpec(
    "forecasts.v1",
    TopicKind.FORECAST,
    Forecast,
    ("model", "region"),
    partitions=4,
    retention_ms=30 * DAY_MS,
    table="forecasts",
)

TELEMETRY_TOPICS: tuple[TopicSpec, ...] = (
    ACCELERATOR_TICKS, SERVING_TICKS, ACCELERATOR, NODE_HEALTH, PDU, SERVING, DEMAND,
)  # fmt: skip
"""Every telemetry topic: v2 envelopes first (what agents publish), then v1."""
COMMAND_TOPICS: tuple[TopicSpec, ...] = (ROUTE_COMMANDS, THROTTLE_COMMANDS, WARM_COMMANDS)


def dead_letter_topic(source: TopicSpec) -> TopicSpec:
    """The dead letter twin of ``source``; keyed like it, kept longer."""
    return TopicSpec(
        source.dlq_name,
        TopicKind.DEAD_LETTER,
        DeadLetter,
        ("source_key",),
        partitions=1,
        retention_ms=30 * DAY_MS,
        table="dead_letters",
    )


JUDGEMENT_TOPICS: tuple[TopicSpec, ...] = (VERDICTS, DECISIONS, FORECASTS)
"""What the pipeline itself concludes and decides."""

INGESTED_TOPICS: tuple[TopicSpec, ...] = (
    *TELEMETRY_TOPICS,
    *COMMAND_TOPICS,
    COMMAND_RESULTS,
    *JUDGEMENT_TOPICS,
)
"""Topics the stream worker writes to ClickHouse; each has a dead letter twin."""

ISOLATION_STATE = TopicSpec(
    "state.isolation.v1",
    TopicKind.STATE,
    IsolationRecord,
    ("key",),
    partitions=1,  # one isolation controller owns it, beside the one verdict partition
    retention_ms=-1,  # kept until superseded: compaction only, never expired by age
    compacted=True,
)
"""The isolation processor's durable state (:mod:`schemas.state`); not ingested."""

HEALTH_STATE = TopicSpec(
    "state.health.v1",
    TopicKind.STATE,
    DetectorMemory,
    ("device_uuid",),
    partitions=12,  # as the telemetry: a device's record sits in its node's partition
    retention_ms=-1,
    compacted=True,
)
"""The health detector's per-device memory (:mod:`models.health_memory`); not ingested."""

DEMAND_STATE = TopicSpec(
    "state.demand.v1",
    TopicKind.STATE,
    DemandMemory,
    ("model", "region"),
    partitions=DEMAND.partitions,  # as the demand: a key's record sits in its partition
    retention_ms=-1,
    compacted=True,
    max_message_bytes=STATE_RECORD_BYTES,  # a day's season of one key: about 310 KB
)
"""The demand planner's memory per (model, region) (:mod:`planning.demand`); not ingested."""

REGIONAL_PARTITIONS = 6
"""Partitions of the control role's region-keyed topics. A region's records go to one
partition (the key's hash), so the role splits over at most as many processes as there are
regions, and two regions may share a partition: more partitions than regions make that
less likely (``GET /control/regions`` shows which process plans which)."""


CONTROL_STATE = TopicSpec(
    "state.control.v1",
    TopicKind.STATE,
    ControlMemory,
    ("region",),
    partitions=REGIONAL_PARTITIONS,  # a region's record in its telemetry's partition
    retention_ms=-1,
    compacted=True,
    max_message_bytes=STATE_RECORD_BYTES,  # grows with the devices held: see the constant
)
"""What each region's control planner's levers hold (:mod:`planning.pools`); not ingested."""

STATE_TOPICS: tuple[TopicSpec, ...] = (ISOLATION_STATE, HEALTH_STATE, DEMAND_STATE, CONTROL_STATE)

SERVING_STEPS = TopicSpec(
    "demand.serving-steps.v1",
    TopicKind.DERIVED,
    ServingStep,
    ("model", "region"),
    partitions=DEMAND.partitions,  # co-partitioned with the demand: same key, same count
    retention_ms=DAY_MS,
)
"""The demand role's repartition of serving telemetry from node keys to model|region keys
(:mod:`schemas.derived`); not ingested."""


def regional(source: TopicSpec) -> TopicSpec:
    """The control role's repartition of a telemetry topic: its records as they are, keyed
    by region (``control.route`` forwards them; ``control.plan`` reads every such topic
    co-partitioned). Kept an hour: control reads the present, and a record older than
    that plans nothing."""
    return TopicSpec(
        f"control.by-region.{source.name}",
        TopicKind.DERIVED,
        source.value_type,
        ("region",),
        partitions=REGIONAL_PARTITIONS,
        retention_ms=HOUR_MS,
    )


CONTROL_INPUTS: tuple[TopicSpec, ...] = (
    SERVING_TICKS,
    PDU,
    ACCELERATOR_TICKS,
    SERVING,
    ACCELERATOR,
)
"""What the control role reads: node ticks (v2), PDU readings, and v1 from older agents."""

BUDGET_CLAIMS = TopicSpec(
    "control.budget-claims.v1",
    TopicKind.DERIVED,
    BudgetClaim,
    ("pool",),
    partitions=1,  # every control process reads all of it
    retention_ms=DAY_MS,
    compacted=True,  # a pool's latest claim is what counts
)
"""Each pool's share of the fleet's optional-work limit, between control processes."""

DERIVED_TOPICS: tuple[TopicSpec, ...] = (
    SERVING_STEPS,
    *(regional(t) for t in CONTROL_INPUTS),
    BUDGET_CLAIMS,
)

ALL_TOPICS: tuple[TopicSpec, ...] = (
    *INGESTED_TOPICS,
    *(dead_letter_topic(t) for t in INGESTED_TOPICS),
    *STATE_TOPICS,
    *DERIVED_TOPICS,
)

_BY_NAME = {t.name: t for t in ALL_TOPICS}


def by_name(name: str) -> TopicSpec:
    """Look a topic up by name; ``KeyError`` names the known ones."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown topic {name!r}; known: {sorted(_BY_NAME)}") from None
