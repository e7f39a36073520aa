"""Wiring shared by `fleetloop sim` and `fleetloop node`: web pages, spool, producer,
command consumer, and the closed loop around a source."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from agents.executors.consumer import CommandConsumer
from agents.executors.dispatch import CommandDispatcher
from agents.executors.gate import SeenCommands
from agents.loop import LoopSource, LoopStats, run_closed_loop, serve_http
from agents.publisher import KafkaPublisher
from agents.spool import DiskSpool
from fleetloop.settings import LoopSettings


def load_seen(path: Path | None) -> SeenCommands:
    """The replay memory a previous run left, so a redelivered command is a duplicate."""
    if path is None or not path.exists():
        return SeenCommands()
    return SeenCommands.from_json(path.read_text())


def save_seen(path: Path, seen: SeenCommands) -> None:
    """Atomically: a crash mid-write leaves the previous memory, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(seen.to_json())
    tmp.replace(path)


def keep_seen(path: Path | None, seen: SeenCommands) -> Callable[[LoopStats], None]:
    """The loop's ``on_published`` hook that saves the replay memory whenever results
    went out: after the results, before the offsets are committed, so a crash in between
    redelivers commands that were applied and remembered in memory only (power limits,
    clocks, weights and ejections are idempotent; a warm applied twice is cooled back by
    the demand planner's next step)."""
    handled = 0

    def keep(stats: LoopStats) -> None:
        nonlocal handled
        if path is not None and stats.results != handled:
            save_seen(path, seen)
            handled = stats.results

    return keep


@dataclass(frozen=True, slots=True)
class LoopWiring:
    """Where a loop talks: the broker, its consumer group, its web port and spool."""

    bootstrap: str
    topic_prefix: str
    group_id: str
    client_id: str
    web_port: int
    web_bind: str
    spool_dir: Path | None
    spool_max_bytes: int
    send_timeout_s: float
    pages: dict[str, Callable[[], Any]] = field(default_factory=dict)


def wiring_for(
    settings: LoopSettings,
    *,
    group_id: str,
    client_id: str,
    pages: dict[str, Callable[[], Any]] | None = None,
) -> LoopWiring:
    return LoopWiring(
        bootstrap=settings.kafka_bootstrap,
        topic_prefix=settings.topic_prefix,
        group_id=group_id,
        client_id=client_id,
        web_port=settings.web_port,
        web_bind=settings.web_bind,
        spool_dir=settings.spool_dir,
        spool_max_bytes=settings.spool_max_bytes,
        send_timeout_s=settings.send_timeout_s,
        pages=pages or {},
    )


async def run_loop(
    source: LoopSource,
    dispatcher: CommandDispatcher,
    wiring: LoopWiring,
    *,
    ticks: int | None,
    speed: float = 1.0,
    registry: CollectorRegistry,
    on_tick: Callable[[int, LoopStats], None] | None = None,
    on_published: Callable[[LoopStats], None] | None = None,
) -> LoopStats:
    """Run the loop until its ticks are done or SIGTERM/SIGINT ask it to stop at the next
    tick boundary, with everything flushed and committed."""
    w = wiring
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    web = await serve_http(
        registry, clock=lambda: source.now, port=w.web_port, bind=w.web_bind, pages=w.pages
    )
    spool = DiskSpool(w.spool_dir, max_bytes=w.spool_max_bytes) if w.spool_dir else None
    try:
        async with (
            KafkaPublisher(
                w.bootstrap,
                topic_prefix=w.topic_prefix,
                registry=registry,
                spool=spool,
                send_timeout_s=w.send_timeout_s,
                client_id=w.client_id,
                clock=lambda: source.now,
            ) as publisher,
            CommandConsumer(
                w.bootstrap, group_id=w.group_id, topic_prefix=w.topic_prefix, client_id=w.client_id
            ) as consumer,
        ):
            return await run_closed_loop(
                source,
                dispatcher,
                publisher,
                consumer,
                ticks=ticks,
                speed=speed,
                registry=registry,
                on_tick=on_tick,
                on_published=on_published,
                stop=stop,
            )
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await web.cleanup()
