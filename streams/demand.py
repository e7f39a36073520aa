"""The ``demand.plan`` processor: demand and serving telemetry into the demand planner
(:mod:`planning.demand`); forecasts, warm commands and decisions out."""

from __future__ import annotations

import time
from typing import Any

import faust
from prometheus_client import CollectorRegistry

from controllers.clock import EventClock
from planning.demand import DemandPlanner, DemandWiring, decide_warm
from schemas.codec import DecodeError, decode, decode_samples, encode
from schemas.events import Demand
from schemas.topics import DEMAND, FORECASTS, SERVING, SERVING_TICKS, TopicSpec
from streams.outputs import Outputs
from streams.page_access import PageAccess


def add_demand(
    app: faust.App,
    wiring: DemandWiring,
    outputs: Outputs,
    registry: CollectorRegistry,
    access: PageAccess | None,
) -> list[TopicSpec]:
    """Register ``demand.plan`` on ``app`` (no pages); returns the topics it reads."""
    del access
    planner = DemandPlanner(wiring)
    clock = EventClock()
    names = [wiring.topic_prefix + s.name for s in (DEMAND, SERVING_TICKS, SERVING)]
    source = app.topic(*names, value_type=bytes, key_type=bytes)
    forecasts = app.topic(wiring.topic_prefix + FORECASTS.name, value_type=bytes, key_type=bytes)
    timer = outputs.metrics.scoring.labels("demand_forecast")

    async def plan(stream: Any) -> None:
        async for events in stream.take_events(5_000, within=0.5):
            for e in events:
                try:
                    if e.message.topic != names[0]:
                        spec = SERVING_TICKS if e.message.topic == names[1] else SERVING
                        for served in decode_samples(e.message.value, spec.value_type):
                            planner.serving(served)
                        continue
                    demand = decode(e.message.value, Demand)
                except DecodeError:
                    continue  # ingest dead-letters it
                clock.observe(demand.observed_at, time.monotonic())
                started = time.perf_counter()
                made, steps = planner.demand(demand, now=clock.now(time.monotonic()))
                if made:
                    timer.observe(time.perf_counter() - started)
                for f in made:
                    await forecasts.send(key=FORECASTS.key_for(f), value=encode(f))
                await outputs.publish(decide_warm(step, wiring) for step in steps)

    plan.__name__ = plan.__qualname__ = "demand.plan"
    app.agent(source, name="demand.plan", concurrency=1)(plan)
    return [DEMAND, SERVING_TICKS, SERVING]
