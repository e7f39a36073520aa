"""Commands (decisions addressed to an executor) and their results.

A command is typed, expiring, idempotent by ``command_id`` and signed with
HMAC-SHA256 over its canonical payload (see :mod:`schemas.signing`). Every
command an executor receives produces exactly one :class:`CommandResult`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal
from uuid import UUID

from pydantic import ConfigDict, Field, model_validator

from schemas.base import Contract, Count, Identifier, Ratio, UtcDatetime, Watts

MAX_CLOCK_SKEW_S = 5.0
"""How far ahead of an executor's clock a command's ``issued_at`` may be. Fleet clocks are
NTP-disciplined (a few milliseconds apart in a data centre; chrony steps a clock that is
off by more than a second at start), so 5 s is three orders of magnitude of slack for an
honest issuer, while a command dated further ahead was forged or comes from a broken
clock, and would stay valid past its real lifetime."""


TARGET_FIELDS = ("node_id", "device_uuid", "pool", "rack_id", "region")


def _not_null(*names: str) -> dict[str, Any]:
    """JSON Schema: these members are present and not null."""
    return {"required": list(names), "properties": {n: {"not": {"type": "null"}} for n in names}}


def _action_is(action: str) -> dict[str, Any]:
    return {"required": ["action"], "properties": {"action": {"const": action}}}


class Target(Contract):
    """What a command acts on; the narrowest non-null field wins (device > node > pool)."""

    # the validator's rule, for executors in other languages: at least one field named
    model_config = ConfigDict(json_schema_extra={"anyOf": [_not_null(f) for f in TARGET_FIELDS]})

    node_id: Identifier | None = None
    device_uuid: Identifier | None = None
    pool: Identifier | None = None
    rack_id: Identifier | None = None
    region: Identifier | None = None

    @property
    def routing_key(self) -> str:
        """Kafka key: commands for one node (or rack, pool, region) stay in order."""
        for part in (self.node_id, self.rack_id, self.pool, self.region, self.device_uuid):
            if part:
                return part
        raise AssertionError("validated targets are never empty")

    def __str__(self) -> str:
        return self.routing_key

    @model_validator(mode="after")
    def _not_empty(self) -> Target:
        if not any(getattr(self, name) for name in TARGET_FIELDS):
            raise ValueError("a command target names at least one of node, device, pool, rack")
        return self


def _command_schema(schema: dict[str, Any], cls: Any) -> None:
    rules = cls.schema_rules()
    if rules:
        schema["allOf"] = rules
    schema["$comment"] = (
        "also required, beyond what JSON Schema can say: expires_at after issued_at, by at "
        f"most {cls.max_lifetime_s:g} s for this type"
    )


class Command(Contract):
    """Common header of every command. Each command type also names itself in
    ``command_type`` (on the wire, so under the signature: a signature made for one type
    never verifies as another).

    ``max_lifetime_s`` bounds ``expires_at - issued_at`` per command type: an executor
    refuses a longer-lived command (``bad_time``), so a captured signed command cannot
    stay valid for long. Issuers' TTLs (60 s by default) sit well inside every bound.
    """

    max_lifetime_s: ClassVar[float] = 300.0
    model_config = ConfigDict(json_schema_extra=lambda schema, cls: _command_schema(schema, cls))

    command_id: UUID
    issued_at: UtcDatetime
    expires_at: UtcDatetime
    issuer: Identifier
    target: Target
    reason: Annotated[str, Field(min_length=1, max_length=64)]
    message: Annotated[str, Field(max_length=1024)] = ""
    cause_event_id: UUID | None = Field(
        default=None, description="the telemetry event that triggered the decision behind this"
    )
    cause_observed_at: UtcDatetime | None = Field(
        default=None, description="when that event was observed (for event-to-action latency)"
    )
    decision_id: UUID | None = Field(default=None, description="the controller decision it carries")
    key_id: Identifier | None = None
    signature: Annotated[str, Field(max_length=128)] | None = None

    @classmethod
    def schema_rules(cls) -> list[dict[str, Any]]:
        """The validators' cross-field rules, as JSON Schema (``allOf``), for other languages."""
        return []

    @model_validator(mode="after")
    def _expires_after_issue(self) -> Command:
        if self.expires_at <= self.issued_at:
            raise ValueError("expires_at must be after issued_at")
        return self


class RouteAction(StrEnum):
    DEWEIGHT = "deweight"
    STOP_NEW_SESSIONS = "stop_new_sessions"
    DRAIN = "drain"
    QUARANTINE = "quarantine"
    RESTORE = "restore"


class RouteCommand(Command):
    """Isolation ladder and routing weights.

    Addressed to a device or node (no pool): the node executor changes what that
    device or node accepts. Addressed to a pool: the router executor changes its
    table, for one ``model`` or all; with a device or node as well, it ejects or
    readmits its devices from the pool, or (``deweight``) sets their replicas'
    weight among the pool's (power-aware routing, which brings a replica back
    with ``weight_ratio`` 1, never with ``restore``: that readmits a device the
    isolation ladder ejected).

    At most 600 s: an isolation step acts on a verdict, and one ten minutes old is
    no longer evidence (the ladder dwells one to five minutes between steps).
    """

    max_lifetime_s: ClassVar[float] = 600.0
    command_type: Literal["RouteCommand"] = "RouteCommand"

    @classmethod
    def schema_rules(cls) -> list[dict[str, Any]]:
        return [{"if": _action_is(RouteAction.DEWEIGHT.value), "then": _not_null("weight_ratio")}]

    action: RouteAction
    weight_ratio: Ratio | None = Field(default=None, description="new weight for deweight")
    model: Identifier | None = Field(default=None, description="pool weights: this model only")

    @model_validator(mode="after")
    def _weight_for_deweight(self) -> RouteCommand:
        if self.action is RouteAction.DEWEIGHT and self.weight_ratio is None:
            raise ValueError("deweight needs weight_ratio")
        return self


class ThrottleAction(StrEnum):
    POWER_CAP = "power_cap"
    CLOCK_MODE = "clock_mode"
    BATCH_SIZE = "batch_size"
    ADMISSION = "admission"
    OPTIONAL_BUDGET = "optional_budget"
    MOVE_BATCH = "move_batch"


THROTTLE_PARAMETER = {
    ThrottleAction.POWER_CAP: "power_limit_watts",
    ThrottleAction.CLOCK_MODE: "clock_mode",
    ThrottleAction.BATCH_SIZE: "batch_size_max",
    ThrottleAction.ADMISSION: "admission_ratio",
    ThrottleAction.OPTIONAL_BUDGET: "optional_budget_ratio",
    ThrottleAction.MOVE_BATCH: "batch_move_ratio",
}
"""The parameter each throttle action needs (the validator's rule and the schema's)."""


class ClockMode(StrEnum):
    DEFAULT = "default"
    LOW = "low"


class ThrottleCommand(Command):
    """Power, clock, batch and admission levers.

    At most 300 s: a cap or budget a few control periods (10 s each) old describes a
    rack or pool that has moved on; five minutes leaves room for a paused consumer.
    """

    max_lifetime_s: ClassVar[float] = 300.0
    command_type: Literal["ThrottleCommand"] = "ThrottleCommand"

    @classmethod
    def schema_rules(cls) -> list[dict[str, Any]]:
        rules = [
            {"if": _action_is(action.value), "then": _not_null(parameter)}
            for action, parameter in THROTTLE_PARAMETER.items()
        ]
        move = {"properties": {"target": _not_null("pool", "rack_id")}}
        rules.append({"if": _action_is(ThrottleAction.MOVE_BATCH.value), "then": move})
        return rules

    action: ThrottleAction
    power_limit_watts: Watts | None = None
    clock_mode: ClockMode | None = None
    batch_size_max: Count | None = None
    admission_ratio: Ratio | None = None
    optional_budget_ratio: Ratio | None = None
    funnel_extra_candidates: Annotated[float, Field(ge=0.0, le=1_000.0)] | None = Field(
        default=None, description="with the budget: extra candidates per request it buys"
    )
    upgrade_ratio: Ratio | None = Field(
        default=None, description="with the budget: share of requests sent to the bigger model"
    )
    batch_move_ratio: Ratio | None = Field(
        default=None,
        description="move_batch: share of the pool's deferrable batch work on the target rack "
        "placed elsewhere instead (0 brings it back)",
    )
    to_pool: Identifier | None = Field(
        default=None, description="move_batch: the pool with headroom that takes it"
    )

    @model_validator(mode="after")
    def _parameter_for_action(self) -> ThrottleCommand:
        if getattr(self, THROTTLE_PARAMETER[self.action]) is None:
            raise ValueError(f"throttle action {self.action.value!r} needs its parameter")
        if self.action is ThrottleAction.MOVE_BATCH and not (
            self.target.pool and self.target.rack_id
        ):
            raise ValueError("move_batch names the pool the work is in and the rack it leaves")
        if self.action is ThrottleAction.MOVE_BATCH and self.batch_move_ratio and not self.to_pool:
            raise ValueError("move_batch with a ratio over 0 names the pool that takes the work")
        return self


class WarmAction(StrEnum):
    WARM = "warm"
    COOL = "cool"


class WarmCommand(Command):
    """Load (warm) or unload (cool) a model on a pool, for the warmer executor.

    At most 900 s: a warm is decided a load time ahead, and loads take minutes.
    """

    max_lifetime_s: ClassVar[float] = 900.0
    command_type: Literal["WarmCommand"] = "WarmCommand"
    action: WarmAction
    model: Identifier
    replicas: Annotated[int, Field(ge=1, le=10_000)] = 1  # of one model on one pool
    deadline_at: UtcDatetime | None = Field(
        default=None, description="when the replicas must be serving (warm only)"
    )


class ResultStatus(StrEnum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    EXPIRED = "expired"
    BAD_SIGNATURE = "bad_signature"
    BAD_TIME = "bad_time"  # issued too far ahead of the executor's clock, or lives too long
    MALFORMED = "malformed"  # did not decode as its topic's command type: refused, not applied
    FAILED_TRANSIENT = "failed_transient"
    FAILED_PERMANENT = "failed_permanent"


class CommandResult(Contract):
    """What an executor did with one command."""

    result_id: UUID
    command_id: UUID
    command_type: Identifier
    executor: Identifier
    status: ResultStatus
    detail: Annotated[str, Field(max_length=1024)] = ""
    received_at: UtcDatetime
    completed_at: UtcDatetime
    retry_after_s: Annotated[float, Field(ge=0.0, le=3_600.0)] | None = None


class DeadLetter(Contract):
    """A message the pipeline could not accept, with its coordinates and raw bytes."""

    source_topic: Identifier
    source_partition: Count
    source_offset: Count
    source_index: Count | None = Field(
        default=None,
        description="the refused sample's place in its node-tick envelope; null when the "
        "whole message was refused",
    )
    source_key: str | None = None
    error_kind: Identifier
    error: Annotated[str, Field(max_length=4096)]
    raw_base64: str = Field(description="the message bytes, at most the first 64 KiB")
    raw_size_bytes: Count = Field(description="size of the whole message")
    received_at: UtcDatetime


COMMAND_TYPES: tuple[type[Command], ...] = (RouteCommand, ThrottleCommand, WarmCommand)
