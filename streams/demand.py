"""The ``demand.plan`` processor: demand and serving telemetry into the demand planner
(:mod:`planning.demand`); forecasts, warm commands and decisions out. A role loop
(:mod:`streams.role_loop`): it reads every serving sample of the fleet."""

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
from streams.role_loop import RoleLoops


def add_demand(
    app: faust.App,
    wiring: DemandWiring,
    outputs: Outputs,
    registry: CollectorRegistry,
    access: PageAccess | None,
    loops: RoleLoops,
) -> list[TopicSpec]:
    """Register ``demand.plan`` (a role loop; no pages); faust reads nothing for it."""
    del access
    planner = DemandPlanner(wiring)
    clock = EventClock()
    names = [wiring.topic_prefix + s.name for s in (DEMAND, SERVING_TICKS, SERVING)]
    forecasts = app.topic(wiring.topic_prefix + FORECASTS.name, value_type=bytes, key_type=bytes)
    timer = outputs.metrics.scoring.labels("demand_forecast")

    async def plan(records: list[Any]) -> None:
        for r in records:
            try:
                if r.topic != names[0]:
                    spec = SERVING_TICKS if r.topic == names[1] else SERVING
                    for served in decode_samples(r.value, spec.value_type):
                        planner.serving(served)
                    continue
                demand = decode(r.value, Demand)
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

    loops.add("demand.plan", (DEMAND, SERVING_TICKS, SERVING), plan, batch_within_s=0.5)
    return []
