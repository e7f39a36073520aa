"""Hosts executors: decode a consumed command, hand it to its owner, account for it.

One host runs any subset of the three executors (the simulator runs all three
beside the fleet; a GPU host runs only its node executor). For each consumed
message it returns the owner's :class:`~schemas.commands.CommandResult`, or
None when the command is not for an executor it runs (another host answers it)
or does not decode (the stream worker dead-letters it with its coordinates;
the host counts it and carries on).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from prometheus_client import CollectorRegistry, Counter, Histogram

from agents.executors.executors import Scope, scope_of
from agents.executors.gate import Actuator, CommandGate, execute
from schemas.codec import DecodeError, decode
from schemas.commands import Command, CommandResult
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
            "Command messages that did not decode (dead-lettered by the stream worker)",
            ["topic"],
            registry=registry,
        )
        self.not_mine = Counter(
            "fleetloop_executor_skipped_total",
            "Commands owned by an executor this host does not run",
            ["scope"],
            registry=registry,
        )


@dataclass(frozen=True, slots=True)
class HostedExecutor:
    name: str  # appears in results, e.g. "node-executor"
    actuator: Actuator[Any]
    gate: CommandGate
    accepts: Callable[[Command], bool] | None = None  # e.g. only this host's node and devices


class ExecutorHost:
    """Dispatch by :func:`~agents.executors.executors.scope_of`; one result per owned command."""

    def __init__(
        self,
        executors: Mapping[Scope, HostedExecutor],
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
        """Decode ``raw`` as ``spec``'s command type and handle it."""
        try:
            command = decode(raw, spec.value_type)
        except DecodeError as exc:
            self.metrics.malformed.labels(spec.name).inc()
            log.warning("undecodable command on %s (%s): %s", spec.name, exc.kind.value, exc)
            return None
        assert isinstance(command, Command)
        return self.handle(command, now=now, received_at=received_at)

    def handle(
        self, command: Command, *, now: datetime, received_at: datetime
    ) -> CommandResult | None:
        scope = scope_of(command)
        hosted = self.executors.get(scope)
        if hosted is None or (hosted.accepts is not None and not hosted.accepts(command)):
            self.metrics.not_mine.labels(scope.value).inc()
            return None
        result = execute(
            command,
            gate=hosted.gate,
            actuator=hosted.actuator,
            executor=hosted.name,
            received_at=received_at,
            now=now,
            new_id=self.new_id,
        )
        self.metrics.commands.labels(hosted.name, result.command_type, result.status.value).inc()
        latency_s = (result.completed_at - command.issued_at).total_seconds()
        self.metrics.latency.labels(hosted.name).observe(max(0.0, latency_s))
        log.info(
            "%s %s %s -> %s: %s",
            hosted.name,
            result.command_type,
            command.command_id,
            result.status.value,
            result.detail,
        )
        hosted.gate.seen.prune(now)
        return result
