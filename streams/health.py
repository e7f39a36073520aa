"""Health and isolation processors: thin adapters around the pure detector and ladder.

``health.detect`` reads accelerator, node-health and serving telemetry (all
keyed by node, so one worker sees every signal of the nodes it owns), feeds
:class:`~models.health.HealthDetector` and publishes verdicts. ``health.isolate``
reads every verdict (one partition: its guardrail is fleet-wide), steps the
:class:`~controllers.isolation.IsolationLadder`, and publishes one decision
per step (:func:`planning.isolation.decide`), plus a signed route command when
the step is allowed and a signing key is configured (advisory otherwise: the
decision says what would have been sent). A one-second timer lets dwell times
and probations run out.

Both keep their model state in memory; a restarted worker relearns it (the
cohorts within a minute, a device's history over its next samples).
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

import faust
from prometheus_client import CollectorRegistry, Counter, Gauge

from controllers.clock import EventClock
from controllers.isolation import LadderDecision
from planning import isolation
from planning.isolation import HealthWiring, decide
from schemas.codec import DecodeError, decode, encode
from schemas.events import AcceleratorTelemetry, NodeHealth, ServingMetrics
from schemas.topics import ACCELERATOR, NODE_HEALTH, SERVING, VERDICTS, TopicSpec
from schemas.verdicts import HealthStatus, Verdict
from streams.outputs import Outputs
from streams.page_access import PageAccess, refusal

log = logging.getLogger(__name__)


class HealthMetrics:
    def __init__(self, registry: CollectorRegistry, outputs: Outputs) -> None:
        self.verdicts = Counter(
            "fleetloop_verdicts_total", "Verdicts published, by status", ["status"],
            registry=registry,
        )  # fmt: skip
        self.scoring = outputs.metrics.scoring
        self.skipped = Counter(
            "fleetloop_health_skipped_total",
            "Messages the health processor could not decode (ingest dead-letters them)",
            registry=registry,
        )
        self.isolated = Gauge(
            "fleetloop_isolated_devices", "Devices the guardrail counts as isolated now",
            registry=registry,
        )  # fmt: skip
        self.devices = Gauge(
            "fleetloop_health_devices", "Devices the health detector tracks", registry=registry
        )
        self.locked_out = Gauge(
            "fleetloop_guardrail_locked_out",
            "1 while the isolation guardrail is locked out (until a person resets it)",
            registry=registry,
        )
        for status in HealthStatus:
            self.verdicts.labels(status.value)


def add_health(
    app: faust.App,
    wiring: HealthWiring,
    outputs: Outputs,
    registry: CollectorRegistry,
    access: PageAccess | None,
) -> list[TopicSpec]:
    """Register ``health.detect``, ``health.isolate``, the ladder's timer and the guardrail
    pages on ``app``; returns the topics they read."""
    m = HealthMetrics(registry, outputs)
    _add_detector(app, wiring, m)
    _add_isolation(app, wiring, m, outputs, access)
    return [ACCELERATOR, NODE_HEALTH, SERVING, VERDICTS]


def _add_detector(app: faust.App, wiring: HealthWiring, metrics: HealthMetrics) -> None:
    detector = isolation.detector(wiring)
    names = [wiring.topic_prefix + s.name for s in (ACCELERATOR, NODE_HEALTH, SERVING)]
    source = app.topic(*names, value_type=bytes, key_type=bytes)
    verdicts = app.topic(wiring.topic_prefix + VERDICTS.name, value_type=bytes, key_type=bytes)
    kinds: dict[str, tuple[type[Any], Any]] = {
        names[0]: (AcceleratorTelemetry, metrics.scoring.labels("health_device")),
        names[1]: (NodeHealth, metrics.scoring.labels("health_node")),
        names[2]: (ServingMetrics, metrics.scoring.labels("health_peers")),
    }
    by_status = {s: metrics.verdicts.labels(s.value) for s in HealthStatus}

    async def detect(stream: Any) -> None:
        async for events in stream.take_events(5_000, within=wiring.batch_within_s):
            out: list[Verdict] = []
            newest: datetime | None = None
            received = time.monotonic()
            for e in events:
                value_type, timer = kinds[e.message.topic]
                try:
                    value = decode(e.message.value, value_type)
                except DecodeError:
                    metrics.skipped.inc()
                    continue
                appended = datetime.fromtimestamp(e.message.timestamp, UTC)
                started = time.perf_counter()
                source = (e.message.topic, e.message.partition)
                out += detector.observe(
                    value, appended_at=appended, received_s=received, source=source
                )
                timer.observe(time.perf_counter() - started)
                newest = value.observed_at if newest is None else max(newest, value.observed_at)
            if newest is not None:
                out += detector.tick(newest, wall_s=time.monotonic())
            for v in out:
                await verdicts.send(key=v.device_uuid.encode(), value=encode(v))
                by_status[v.status].inc()
            metrics.devices.set(len(detector.devices))

    detect.__name__ = detect.__qualname__ = "health.detect"
    app.agent(source, name="health.detect", concurrency=1)(detect)


def _add_isolation(
    app: faust.App,
    wiring: HealthWiring,
    metrics: HealthMetrics,
    outputs: Outputs,
    access: PageAccess | None,
) -> None:
    ladder = isolation.ladder(wiring)
    clock = EventClock()
    source = app.topic(wiring.topic_prefix + VERDICTS.name, value_type=bytes, key_type=bytes)

    async def publish(steps: list[LadderDecision], now: datetime) -> None:
        await outputs.publish(decide(step, now, wiring) for step in steps)
        metrics.isolated.set(len(ladder.guard.state.isolated))
        metrics.locked_out.set(1 if ladder.guard.state.locked_out else 0)

    async def isolate(stream: Any) -> None:
        async for events in stream.take_events(1_000, within=wiring.batch_within_s):
            for e in events:
                try:
                    v = decode(e.message.value, Verdict)
                except DecodeError:
                    metrics.skipped.inc()
                    continue
                clock.observe(v.observed_at, time.monotonic())
                now = clock.now(time.monotonic())
                await publish(ladder.verdict(v, now=now), now)

    async def ladder_tick() -> None:
        if clock.started:
            now = clock.now(time.monotonic())
            await publish(ladder.tick(now), now)

    isolate.__name__ = isolate.__qualname__ = "health.isolate"
    app.agent(source, name="health.isolate", concurrency=1)(isolate)
    app.timer(interval=1.0, name="health.ladder_tick")(ladder_tick)

    @app.page("/guardrail")
    class GuardrailView(faust.web.View):
        """GET: the guardrail's state; POST /guardrail/reset: a person lifts a lockout."""

        async def get(self, request: Any) -> Any:
            refused = refusal(access, request.headers, guarded=False)
            if refused is not None:
                return self.json({"error": refused[1]}, status=refused[0])
            state = ladder.guard.state
            return self.json(
                {
                    "locked_out": state.locked_out,
                    "isolated": sorted(state.isolated),
                    "recent_actions": len(state.actions),
                }
            )

    @app.page("/guardrail/reset")
    class GuardrailReset(faust.web.View):
        async def post(self, request: Any) -> Any:
            refused = refusal(access, request.headers, guarded=True)
            if refused is not None:
                return self.json({"error": refused[1]}, status=refused[0])
            was = ladder.guard.state.locked_out
            ladder.guard.reset()
            metrics.locked_out.set(0)
            log.warning("guardrail reset by a person (was locked out: %s)", was)
            return self.json({"locked_out": False, "was_locked_out": was})
