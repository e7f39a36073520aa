"""Runs the simulated agent in real time: one tick per interval, flushed each tick."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from agents.publisher import KafkaPublisher
from agents.simulated import SimulatedFleetAgent


async def run_agent(
    agent: SimulatedFleetAgent,
    publisher: KafkaPublisher,
    *,
    ticks: int | None,
    interval_s: float,
    monotonic: Callable[[], float] = time.monotonic,
    on_tick: Callable[[int, int], None] | None = None,
) -> int:
    """Publish tick after tick until ``ticks`` (forever when None); return events sent."""
    sent = 0
    n = 0
    next_at = monotonic()
    while ticks is None or n < ticks:
        sent += await publisher.publish_all(agent.tick(n))
        await publisher.flush()
        if on_tick is not None:
            on_tick(n, sent)
        n += 1
        next_at += interval_s
        await asyncio.sleep(max(0.0, next_at - monotonic()))
    return sent
