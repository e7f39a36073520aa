"""The one way a controller's output leaves the worker.

Every controller processor hands what its planner made (an
:class:`~planning.issuing.Output`: a decision, and the command it issued if it
issued one) to :meth:`Outputs.publish`, which sends the command to its
controller's command topic, the decision to ``decisions.v1`` (ingest writes it
to ClickHouse), and counts both. It checks on the way that the command was
issued by the controller that decided it (a command's issuer is its decision's
controller), so a command is never on the wire without the decision that
explains it.

It also holds the metrics every controller process shares: decisions, commands
and how long online models take, declared for every registered controller of
the worker's roles at start (:mod:`planning.registry`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import faust
from prometheus_client import CollectorRegistry, Counter, Histogram

from planning.issuing import Output
from planning.registry import CONTROLLERS, controller
from schemas.codec import encode
from schemas.commands import RouteCommand, ThrottleCommand, WarmCommand
from schemas.topics import DECISIONS
from schemas.verdicts import DecisionOutcome


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "fleetloop_decisions_total",
            "Controller decisions, by controller, outcome and reason",
            ["controller", "outcome", "reason"],
            registry=registry,
        )
        self.commands = Counter(
            "fleetloop_commands_issued_total",
            "Commands the controllers sent, by type and action",
            ["command_type", "action"],
            registry=registry,
        )
        self.scoring = Histogram(
            "fleetloop_model_scoring_seconds",
            "Time to score and learn one event (or one step) in an online model",
            ["model"],
            buckets=(1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2, 0.1),
            registry=registry,
        )

    def declare(self, name: str, reasons: Iterable[str]) -> None:
        """Pre-create a controller's label sets, so every series exists from the start."""
        for outcome in DecisionOutcome:
            for reason in reasons:
                self.decisions.labels(name, outcome.value, reason)


class Outputs:
    """Publishes, counts and (through ``decisions.v1``) records every controller output."""

    def __init__(
        self, app: faust.App, metrics: ControllerMetrics, *, topic_prefix: str, roles: set[str]
    ) -> None:
        self.metrics = metrics
        self.decisions = app.topic(topic_prefix + DECISIONS.name, value_type=bytes, key_type=bytes)
        self.commands = {
            c.topic.name: app.topic(topic_prefix + c.topic.name, value_type=bytes, key_type=bytes)
            for c in CONTROLLERS
            if c.role in roles
        }
        for c in CONTROLLERS:
            if c.role in roles:
                metrics.declare(c.name, c.reasons)

    async def publish(self, outputs: Iterable[Output[Any]]) -> None:
        for o in outputs:
            d, command = o.decision, o.command
            if command is not None:
                spec = controller(d.controller).topic
                if command.issuer != d.controller or command.decision_id != d.decision_id:
                    raise ValueError(
                        f"command {command.command_id} (issuer {command.issuer!r}) is not "
                        f"the command of decision {d.decision_id} ({d.controller!r})"
                    )
                if not isinstance(command, RouteCommand | ThrottleCommand | WarmCommand):
                    raise TypeError(f"{type(command).__name__} is not a command type we send")
                topic = self.commands[spec.name]
                await topic.send(key=spec.key_for(command), value=encode(command))
                self.metrics.commands.labels(type(command).__name__, command.action.value).inc()
            await self.decisions.send(key=DECISIONS.key_for(d), value=encode(d))
            self.metrics.decisions.labels(d.controller, d.outcome.value, d.reason).inc()

    async def resend(
        self, commands: Iterable[RouteCommand | ThrottleCommand | WarmCommand]
    ) -> None:
        """Send commands already issued (and recorded with their decisions) once more: what a
        resumed controller does with the commands its previous process may not have sent.
        Same id, same signature: an executor that applied one answers ``duplicate``."""
        for command in commands:
            spec = controller(command.issuer).topic
            await self.commands[spec.name].send(key=spec.key_for(command), value=encode(command))
