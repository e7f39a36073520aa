"""The ``control.plan`` processor: serving, PDU and accelerator telemetry into the
control planner (:mod:`planning.pools`), its throttle commands and decisions out. A role
loop (:mod:`streams.role_loop`): it reads every serving sample of the fleet."""

from __future__ import annotations

from typing import Any

import faust
from prometheus_client import CollectorRegistry

from planning.pools import ControlPlanner
from planning.throttle import ControlWiring
from schemas.codec import DecodeError, decode, decode_tick
from schemas.topics import ACCELERATOR, ACCELERATOR_TICKS, PDU, SERVING, SERVING_TICKS, TopicSpec
from streams.outputs import Outputs
from streams.page_access import PageAccess
from streams.role_loop import RoleLoops

READ = (SERVING_TICKS, PDU, ACCELERATOR_TICKS, SERVING, ACCELERATOR)
"""What ``control.plan`` reads: node ticks (v2), PDU readings, and v1 from older agents."""


def add_control(
    app: faust.App,
    wiring: ControlWiring,
    outputs: Outputs,
    registry: CollectorRegistry,
    access: PageAccess | None,
    loops: RoleLoops,
) -> list[TopicSpec]:
    """Register ``control.plan`` (a role loop; no pages); faust reads nothing for it."""
    del app, access
    planner = ControlPlanner(wiring)
    specs = {wiring.topic_prefix + s.name: s for s in READ}

    async def plan(records: list[Any]) -> None:
        for r in records:
            spec = specs[r.topic]
            try:
                if spec.envelope:  # its valid samples (the bad ones are ingest's to letter)
                    tick = decode_tick(r.value, spec.value_type).tick
                    out = [] if tick is None else planner.tick(tick)
                else:
                    out = planner.feed(decode(r.value, spec.value_type))
            except DecodeError:
                continue  # ingest dead-letters it
            if out:  # each message's as it is handled
                await outputs.publish(out)

    loops.add("control.plan", READ, plan, batch_within_s=wiring.batch_within_s)
    return []
