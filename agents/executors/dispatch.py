"""Dispatches commands to executors: decode a consumed command, hand it to its owner,
account for it.

One dispatcher runs any subset of the three executors (the simulator runs all
three beside the fleet; a GPU host runs only its node executor). For each consumed
message it returns the owner's :class:`~schemas.commands.CommandResult`, or
None when the message is not for an executor it runs (another dispatcher answers it).

No message stops a dispatcher: one that does not decode is refused with a ``malformed``
result by the executor it would belong to (read from whatever parts of it do
decode, :func:`~agents.executors.executors.scope_of_malformed`), and the stream
worker dead-letters it with its coordinates; whatever else fails while handling
one command becomes a ``failed_permanent`` result for it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from prometheus_client import CollectorRegistry, Counter, Histogram

from agents.executors.executors import Scope, scope_of, scope_of_malformed
from agents.executors.gate import Actuator, CommandGate, execute
from schemas.codec import DecodeError, decode
from schemas.commands import Command, CommandResult, ResultStatus, Target
from schemas.topics import TopicSpec

log = logging.getLogger(__name__)


class ExecutorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.commands = Counter(
            "fleetloop_executor_commands_total",
            "Commands handled, by executor, command type and result status",
            ["executor", "command_type", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "fleetloop_executor_command_latency_seconds",
            "From a command's issued_at to its result",
            ["executor"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
            registry=registry,
        )
        self.malformed = Counter(
            "fleetloop_executor_malformed_total",
            "Command messages that did not decode (refused as malformed by their owner, "
            "dead-lettered by the stream worker)",
            ["topic"],
            registry=registry,
        )
        self.not_mine = Counter(
            "fleetloop_executor_skipped_total",
            "Commands owned by an executor this dispatcher does not run",
            ["scope"],
            registry=registry,
        )


@dataclass(frozen=True, slots=True)
class GatedExecutor:
    name: str  # appears in results, e.g. "node-executor"
    actuator: Actuator[Any]
    gate: CommandGate
    accepts: Callable[[Target], bool] | None = None  # e.g. only this host's node and devices


class CommandDispatcher:
    """Dispatch by :func:`~agents.executors.executors.scope_of`; one result per owned command."""

    def __init__(
        self,
        executors: Mapping[Scope, GatedExecutor],
        *,
        registry: CollectorRegistry | None = None,
        new_id: Callable[[], UUID] = uuid.uuid4,
    ) -> None:
        self.executors = dict(executors)
        self.metrics = ExecutorMetrics(registry or CollectorRegistry())
        self.new_id = new_id

    def handle_raw(
        self, spec: TopicSpec, raw: bytes | None, *, now: datetime, received_at: datetime
    ) -> CommandResult | None:
        """Decode ``raw`` as ``spec``'s command type and handle it; never raises."""
        try:
            command = decode(raw, spec.value_type)
        except DecodeError as exc:
            self.metrics.malformed.labels(spec.name).inc()
            log.warning("undecodable command on %s (%s): %s", spec.name, exc.kind.value, exc)
            return self._refuse_malformed(spec, raw, exc, now=now, received_at=received_at)
        assert isinstance(command, Command)
        payload, _ = _readable_parts(raw)  # the signature covers what arrived, as it arrived
        return self.handle(command, now=now, received_at=received_at, payload=payload)

    def _refuse_malformed(
        self,
        spec: TopicSpec,
        raw: bytes | None,
        error: DecodeError,
        *,
        now: datetime,
        received_at: datetime,
    ) -> CommandResult | None:
        doc, target = _readable_parts(raw)
        scope = scope_of_malformed(spec.value_type, doc, target)
        owner = self.executors.get(scope)
        if owner is None or (
            owner.accepts is not None and (target is None or not owner.accepts(target))
        ):
            self.metrics.not_mine.labels(scope.value).inc()
            return None
        self.metrics.commands.labels(
            owner.name, spec.value_type.__name__, ResultStatus.MALFORMED.value
        ).inc()
        return CommandResult(
            result_id=self.new_id(),
            command_id=_claimed_id(doc, raw),
            command_type=spec.value_type.__name__,
            executor=owner.name,
            status=ResultStatus.MALFORMED,
            detail=f"not applied: {error}"[:1024],
            received_at=received_at,
            completed_at=now,
        )

    def handle(
        self,
        command: Command,
        *,
        now: datetime,
        received_at: datetime,
        payload: Mapping[str, Any] | None = None,
    ) -> CommandResult | None:
        """Hand ``command`` to its owner (None when this process runs no owner for it);
        ``payload`` is its JSON object as received, which its signature must cover."""
        scope = scope_of(command)
        owner = self.executors.get(scope)
        if owner is None or (owner.accepts is not None and not owner.accepts(command.target)):
            self.metrics.not_mine.labels(scope.value).inc()
            return None
        result = execute(
            command,
            gate=owner.gate,
            actuator=owner.actuator,
            executor=owner.name,
            received_at=received_at,
            now=now,
            new_id=self.new_id,
            payload=payload,
        )
        self.metrics.commands.labels(owner.name, result.command_type, result.status.value).inc()
        latency_s = (result.completed_at - command.issued_at).total_seconds()
        self.metrics.latency.labels(owner.name).observe(max(0.0, latency_s))
        log.info(
            "%s %s %s -> %s: %s",
            owner.name,
            result.command_type,
            command.command_id,
            result.status.value,
            result.detail,
        )
        owner.gate.seen.prune(now)
        return result


def _readable_parts(raw: bytes | None) -> tuple[dict[str, object], Target | None]:
    """The JSON object a malformed command carries (empty if none), and its target if valid."""
    try:
        doc = json.loads(raw or b"")
    except (ValueError, RecursionError):
        return {}, None
    if not isinstance(doc, dict):
        return {}, None
    try:
        return doc, Target.model_validate(doc.get("target"))
    except Exception:  # any failure means: no target to read
        return doc, None


def _claimed_id(doc: Mapping[str, object], raw: bytes | None) -> UUID:
    """The command id the message claims, or one derived from its bytes (stable on replay)."""
    claimed = doc.get("command_id")
    if isinstance(claimed, str):
        try:
            return UUID(claimed)
        except ValueError:
            pass
    return uuid.UUID(bytes=hashlib.sha256(raw or b"").digest()[:16], version=5)
