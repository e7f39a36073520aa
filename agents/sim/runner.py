"""The closed loop around a simulated fleet: commands in, telemetry and results out.

Each tick, in this order:

1. take the commands consumed since the last tick and hand each to its
   executor (node, router, warmer) at the fleet's current simulated instant;
2. step the fleet, so the next telemetry already shows what the commands did;
3. publish the results and the telemetry (spooled to disk if the broker is away);
4. commit the command offsets, only now that their results are out;
5. wait ``interval_s / speed`` of wall time.

Executors judge expiry on the fleet's clock, the clock of what they act on,
so a fleet run faster than real time still honours commands stamped with its
event times.

The router's table is served as JSON at ``GET /routes`` beside ``/metrics``
and ``/healthz`` (aiohttp).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from agents.executors.consumer import CommandConsumer
from agents.executors.host import ExecutorHost
from agents.publisher import KafkaPublisher
from agents.runner import publish_tick
from agents.sim.control import SimControl
from agents.sim.simulation import Simulation
from agents.sim.telemetry import Record
from schemas.topics import COMMAND_RESULTS

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LoopStats:
    ticks: int = 0
    events: int = 0
    results: int = 0
    acked: int = 0


class SimMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.ticks = Counter("fleetloop_sim_ticks_total", "Simulated steps", registry=registry)
        self.lag = Gauge(
            "fleetloop_sim_behind_seconds",
            "Wall seconds the simulation is behind its schedule (0 when keeping up)",
            registry=registry,
        )
        self.sim_time = Gauge(
            "fleetloop_sim_time_seconds", "Simulated seconds since the run began", registry=registry
        )


async def run_closed_loop(
    sim: Simulation,
    host: ExecutorHost,
    publisher: KafkaPublisher,
    consumer: CommandConsumer | None,
    *,
    ticks: int | None,
    speed: float,
    registry: CollectorRegistry | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    on_tick: Callable[[int, LoopStats], None] | None = None,
) -> LoopStats:
    """Run until ``ticks`` steps (forever when None); see the module docstring."""
    metrics = SimMetrics(registry or CollectorRegistry())
    stats = LoopStats()
    wall_interval_s = sim.fleet.interval_s / speed
    next_at = monotonic()
    n = 0
    while ticks is None or n < ticks:
        consumed = await consumer.poll(0.0) if consumer is not None else []
        now = sim.fleet.now
        records: list[Record] = []
        for c in consumed:
            result = host.handle_raw(c.spec, c.value, now=now, received_at=now)
            if result is not None:
                records.append((COMMAND_RESULTS, result))
        stats.results += len(records)
        events = sim.tick(n)
        stats.events += len(events)
        records.extend(events)
        stats.acked += await publish_tick(publisher, records)
        if consumed and consumer is not None:
            await consumer.commit()
        n += 1
        stats.ticks = n
        metrics.ticks.inc()
        metrics.sim_time.set(sim.fleet.t_s)
        if on_tick is not None:
            on_tick(n, stats)
        next_at += wall_interval_s
        behind = monotonic() - next_at
        metrics.lag.set(max(0.0, behind))
        await asyncio.sleep(max(0.0, -behind))
    return stats


async def serve_http(
    control: SimControl, registry: CollectorRegistry, *, port: int, bind: str
) -> web.AppRunner:
    """Start the router table, metrics and health pages; the caller cleans the runner up."""

    async def routes(request: web.Request) -> web.Response:
        return web.Response(text=json.dumps(control.table()), content_type="application/json")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), content_type=CONTENT_TYPE_LATEST.split(";")[0]
        )

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "sim_time": control.fleet.now.isoformat()})

    app = web.Application()
    app.router.add_get("/routes", routes)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, bind, port).start()
    return runner
