"""The node-side closed loop: commands in, telemetry and results out.

It drives anything with a clock and a ``tick``: the simulated fleet (all its
executors) or a real GPU host (its NVML reader and node executor). Each tick,
in this order:

1. take the commands consumed since the last tick and hand each to the dispatcher's
   executors at the source's current instant;
2. tick the source (step the fleet, or read the hardware), so the telemetry
   already shows what the commands did;
3. publish the results and the telemetry (spooled to disk if the broker is away);
4. commit the command offsets, only now that their results are out;
5. wait ``interval_s / speed`` of wall time.

Executors judge expiry on the source's clock, the clock of what they act on:
a simulated fleet run faster than real time still honours commands stamped
with its event times; a real host uses the wall clock.

``serve_http`` serves ``/metrics``, ``/healthz`` (with the source's time) and
any extra JSON pages (the simulated router's table at ``/routes``) over aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from agents.executors.consumer import CommandConsumer
from agents.executors.dispatch import CommandDispatcher
from agents.publisher import KafkaPublisher
from agents.runner import Records, publish_tick
from schemas.base import Contract
from schemas.topics import COMMAND_RESULTS, TopicSpec

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LoopStats:
    ticks: int = 0
    events: int = 0
    results: int = 0
    acked: int = 0


class LoopSource(Protocol):
    """What the loop drives: a clock, a step length and a tick that returns telemetry."""

    @property
    def now(self) -> datetime: ...

    @property
    def interval_s(self) -> float: ...

    def tick(self, tick: int) -> Records: ...


class LoopMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.ticks = Counter(
            "fleetloop_loop_ticks_total", "Ticks of the node loop", registry=registry
        )
        self.lag = Gauge(
            "fleetloop_loop_behind_seconds",
            "Wall seconds the loop is behind its schedule (0 when keeping up)",
            registry=registry,
        )
        self.source_time = Gauge(
            "fleetloop_loop_source_time_seconds",
            "The source's clock (simulated time for the simulator), Unix seconds",
            registry=registry,
        )


async def run_closed_loop(
    source: LoopSource,
    dispatcher: CommandDispatcher,
    publisher: KafkaPublisher,
    consumer: CommandConsumer | None,
    *,
    ticks: int | None,
    speed: float,
    registry: CollectorRegistry | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    on_tick: Callable[[int, LoopStats], None] | None = None,
    on_published: Callable[[LoopStats], None] | None = None,
    stop: asyncio.Event | None = None,
) -> LoopStats:
    """Run until ``ticks`` steps (forever when None) or until ``stop`` is set, always at a
    tick boundary (results out, offsets committed), each tick in the order above.

    ``on_published`` runs after a tick's results are out and before the command
    offsets are committed: the place to persist the executors' replay memory.
    """
    metrics = LoopMetrics(registry or CollectorRegistry())
    stats = LoopStats()
    wall_interval_s = source.interval_s / speed
    next_at = monotonic()
    n = 0
    while (ticks is None or n < ticks) and not (stop is not None and stop.is_set()):
        consumed = await consumer.poll(0.0) if consumer is not None else []
        now = source.now
        records: list[tuple[TopicSpec, Contract]] = []
        for c in consumed:
            result = dispatcher.handle_raw(c.spec, c.value, now=now, received_at=now)
            if result is not None:
                records.append((COMMAND_RESULTS, result))
        stats.results += len(records)
        events = source.tick(n)
        stats.events += len(events)
        records.extend(events)
        stats.acked += await publish_tick(publisher, records)
        if on_published is not None:
            on_published(stats)
        if consumed and consumer is not None:
            await consumer.commit()
        n += 1
        stats.ticks = n
        metrics.ticks.inc()
        metrics.source_time.set(source.now.timestamp())
        if on_tick is not None:
            on_tick(n, stats)
        next_at += wall_interval_s
        behind = monotonic() - next_at
        metrics.lag.set(max(0.0, behind))
        if stop is None:
            await asyncio.sleep(max(0.0, -behind))
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, -behind))
    return stats


async def serve_http(
    registry: CollectorRegistry,
    *,
    clock: Callable[[], datetime],
    port: int,
    bind: str,
    pages: dict[str, Callable[[], Any]] | None = None,
) -> web.AppRunner:
    """Start ``/metrics``, ``/healthz`` and JSON ``pages``; the caller cleans the runner up."""

    def json_page(produce: Callable[[], Any]) -> Callable[[web.Request], Any]:
        async def page(request: web.Request) -> web.Response:
            return web.Response(text=json.dumps(produce()), content_type="application/json")

        return page

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), content_type=CONTENT_TYPE_LATEST.split(";")[0]
        )

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "source_time": clock().isoformat()})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    for path, produce in (pages or {}).items():
        app.router.add_get(path, json_page(produce))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, bind, port).start()
    return runner
