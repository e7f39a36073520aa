"""Metrics every controller process shares: its decisions, the commands it sent, and how
long its online models take. One instance per worker registry (the families are global)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram

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

    def declare(self, controller: str, reasons: Iterable[str]) -> None:
        """Pre-create a controller's label sets, so every series exists from the start."""
        for outcome in DecisionOutcome:
            for reason in reasons:
                self.decisions.labels(controller, outcome.value, reason)
