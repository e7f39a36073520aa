"""The ``control.plan`` processor: serving, PDU and accelerator telemetry into the
control planner (:mod:`planning.pools`), its throttle commands and decisions out."""

from __future__ import annotations

from typing import Any

import faust

from controllers.capacity import CapacityReason
from controllers.power import PowerReason
from controllers.tpot_guard import BatchReason
from planning.pools import ControlPlanner
from planning.throttle import ControlWiring
from schemas.codec import DecodeError, decode, encode
from schemas.topics import ACCELERATOR, DECISIONS, PDU, SERVING, THROTTLE_COMMANDS, TopicSpec
from streams.controller_metrics import ControllerMetrics


def add_control(app: faust.App, w: ControlWiring, shared: ControllerMetrics) -> list[TopicSpec]:
    """Register ``control.plan`` on ``app``; returns the topics it reads."""
    planner = ControlPlanner(w)
    specs = {w.topic_prefix + s.name: s for s in (SERVING, PDU, ACCELERATOR)}
    source = app.topic(*specs, value_type=bytes, key_type=bytes)
    commands = app.topic(w.topic_prefix + THROTTLE_COMMANDS.name, value_type=bytes, key_type=bytes)
    decisions = app.topic(w.topic_prefix + DECISIONS.name, value_type=bytes, key_type=bytes)
    reasons = [*CapacityReason, *BatchReason, *PowerReason]
    for controller in ("capacity", "tpot_guard", "power"):
        shared.declare(controller, [r.value for r in reasons])

    async def plan(stream: Any) -> None:
        async for events in stream.take_events(5_000, within=w.batch_within_s):
            for e in events:
                try:
                    value = decode(e.message.value, specs[e.message.topic].value_type)
                except DecodeError:
                    continue  # ingest dead-letters it
                made = planner.feed(value)
                for o in made:
                    if o.command is not None:
                        await commands.send(
                            key=THROTTLE_COMMANDS.key_for(o.command), value=encode(o.command)
                        )
                        shared.commands.labels("ThrottleCommand", o.command.action.value).inc()
                    await decisions.send(
                        key=DECISIONS.key_for(o.decision), value=encode(o.decision)
                    )
                    shared.decisions.labels(
                        o.decision.controller, o.decision.outcome.value, o.decision.reason
                    ).inc()

    plan.__name__ = plan.__qualname__ = "control.plan"
    app.agent(source, name="control.plan", concurrency=1)(plan)
    return [SERVING, PDU, ACCELERATOR]
