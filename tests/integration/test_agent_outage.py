"""A broker outage costs the agent nothing: unacknowledged ticks wait in the spool."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from prometheus_client import CollectorRegistry

from agents.envelopes import pack
from agents.publisher import KafkaPublisher
from agents.runner import run_agent
from agents.simulated import SimulatedFleetAgent
from agents.spool import DiskSpool
from fleetloop.kafka_broker import LocalKafkaBroker, free_port
from fleetloop.settings import REPO_ROOT, BrokerSettings
from fleetloop.topics_admin import ensure_topics
from schemas.topics import TELEMETRY_TOPICS
from tests.factories import START

pytestmark = pytest.mark.integration
RECOVERY_DEADLINE_S = 180.0  # for aiokafka to reconnect and drain the spool, however busy
JAR_DIR = Path(os.environ.get("FLEETLOOP_JAR_DIR", REPO_ROOT / ".cache" / "kafka"))


async def _event_ids(bootstrap: str, prefix: str, expected: int) -> list[str]:
    import json

    consumer = AIOKafkaConsumer(
        *(prefix + s.name for s in TELEMETRY_TOPICS),
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    ids: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while len(set(ids)) < expected and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                ids.extend(json.loads(r.value)["event_id"] for r in records)
    finally:
        await consumer.stop()
    return ids


def test_ticks_sent_while_the_broker_is_down_arrive_after_it_returns(tmp_path: Path) -> None:
    broker = LocalKafkaBroker(
        BrokerSettings(
            broker_dir=tmp_path / "kafka",
            jar_dir=JAR_DIR,
            port=free_port(),
            controller_port=free_port(),
        )
    )
    broker.up()
    try:
        prefix = "outage."
        asyncio.run(ensure_topics(broker.bootstrap, prefix=prefix, specs=TELEMETRY_TOPICS))
        agent = SimulatedFleetAgent(nodes=3, devices_per_node=2, seed=9, start=START)
        per_tick = len(pack(agent.tick(0)))  # messages: a node's samples travel as one
        agent = SimulatedFleetAgent(nodes=3, devices_per_node=2, seed=9, start=START)
        spool = DiskSpool(tmp_path / "spool", max_bytes=10 * 1024**2)
        registry = CollectorRegistry()
        spooled_after: dict[int, int] = {}
        drained = asyncio.Event()
        deadline = [0.0]

        def outage(count: int, _sent: int) -> None:
            spooled_after[count] = len(spool.segments())
            if count == 0:
                broker.down()
            if count == 2:  # up() runs its own event loop: not inside the agent's
                restart = threading.Thread(target=broker.up)
                restart.start()
                restart.join()
                deadline[0] = time.monotonic() + RECOVERY_DEADLINE_S
            # ticks go on until the spool is empty again (a condition, not a tick count)
            if count > 2 and (spooled_after[count] == 0 or time.monotonic() > deadline[0]):
                drained.set()

        async def run() -> int:
            async with KafkaPublisher(
                broker.bootstrap,
                topic_prefix=prefix,
                spool=spool,
                registry=registry,
                send_timeout_s=3.0,
            ) as publisher:
                return await run_agent(
                    agent, publisher, ticks=None, interval_s=0.5, on_tick=outage, stop=drained
                )

        acknowledged = asyncio.run(run())
        ticks = len(spooled_after)
        assert spooled_after[0] == 0 and spooled_after[1] == 1  # the outage began after tick 0
        assert spooled_after[2] == 2  # no second timeout: tick 2 went straight to the spool
        assert spooled_after[ticks - 1] == 0, f"spool not drained in {RECOVERY_DEADLINE_S} s"
        assert acknowledged == ticks * per_tick
        ids = asyncio.run(_event_ids(broker.bootstrap, prefix, ticks * per_tick))
        assert len(set(ids)) == ticks * per_tick  # nothing lost
        assert len(ids) == len(set(ids))  # the insured segment was not sent again
        print(f"spool segments after each tick: {spooled_after}")
        spooled = registry.get_sample_value("fleetloop_agent_spooled_events_total")
        assert spooled is not None and spooled >= 2 * per_tick
        assert registry.get_sample_value("fleetloop_agent_spool_bytes") == 0
    finally:
        broker.down()
