"""The ``control.plan`` processor: serving, PDU and accelerator telemetry into the
control planner (:mod:`planning.pools`), its throttle commands and decisions out."""

from __future__ import annotations

from typing import Any

import faust
from prometheus_client import CollectorRegistry

from planning.pools import ControlPlanner
from planning.throttle import ControlWiring
from schemas.codec import DecodeError, decode_samples
from schemas.topics import ACCELERATOR, ACCELERATOR_TICKS, PDU, SERVING, SERVING_TICKS, TopicSpec
from streams.outputs import Outputs
from streams.page_access import PageAccess

READ = (SERVING_TICKS, PDU, ACCELERATOR_TICKS, SERVING, ACCELERATOR)
"""What ``control.plan`` reads: node ticks (v2), PDU readings, and v1 from older agents."""


def add_control(
    app: faust.App,
    wiring: ControlWiring,
    outputs: Outputs,
    registry: CollectorRegistry,
    access: PageAccess | None,
) -> list[TopicSpec]:
    """Register ``control.plan`` on ``app`` (no pages); returns the topics it reads."""
    del access
    planner = ControlPlanner(wiring)
    specs = {wiring.topic_prefix + s.name: s for s in READ}
    source = app.topic(*specs, value_type=bytes, key_type=bytes)

    async def plan(stream: Any) -> None:
        async for events in stream.take_events(5_000, within=wiring.batch_within_s):
            for e in events:
                try:
                    values = decode_samples(e.message.value, specs[e.message.topic].value_type)
                except DecodeError:
                    continue  # ingest dead-letters it
                for value in values:
                    await outputs.publish(planner.feed(value))

    plan.__name__ = plan.__qualname__ = "control.plan"
    app.agent(source, name="control.plan", concurrency=1)(plan)
    return list(READ)
