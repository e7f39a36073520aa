"""Runs the simulated agent in real time: one tick per interval, flushed each tick.

A tick the broker does not acknowledge goes to the publisher's spool. Each
later tick first tries to drain the spool, oldest segment first; while that
fails the new tick is spooled behind it, so per-key order is kept. While
aiokafka is still retrying a spooled tick the drain does not try again, so an
outage costs one send timeout, not one per tick.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from agents.envelopes import pack
from agents.publisher import KafkaPublisher
from schemas.topics import TopicSpec

Records = Sequence[tuple[TopicSpec, Any]]  # v1 contracts; packed into envelopes on publish


class TickSource(Protocol):
    def tick(self, tick: int) -> Records: ...


async def publish_tick(publisher: KafkaPublisher, records: Records) -> int:
    """Publish one tick's records, each node's samples packed into envelopes (:func:`pack`),
    behind any spooled backlog; return the messages acknowledged."""
    records = pack(records)
    sent = 0
    if publisher.backlog:
        sent += await publisher.drain_spool()  # oldest first, so keys stay in order
    if publisher.backlog:
        publisher.spool_now(records)  # the broker is still away
    else:
        await publisher.publish_all(records)
        sent += await publisher.flush()  # what the broker misses goes to the spool
    return sent


async def run_agent(
    agent: TickSource,
    publisher: KafkaPublisher,
    *,
    ticks: int | None,
    interval_s: float,
    monotonic: Callable[[], float] = time.monotonic,
    on_tick: Callable[[int, int], None] | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Publish tick after tick until ``ticks`` (forever when None) or until ``stop`` is set
    (checked after each tick); return events acknowledged."""
    sent = 0
    n = 0
    next_at = monotonic()
    while (ticks is None or n < ticks) and not (stop is not None and stop.is_set()):
        sent += await publish_tick(publisher, agent.tick(n))
        if on_tick is not None:
            on_tick(n, sent)
        n += 1
        next_at += interval_s
        await asyncio.sleep(max(0.0, next_at - monotonic()))
    return sent
