"""`fleetloop node` on the real broker, with a fake NVML in place of the driver: it
publishes what NVML reports and its node executor applies this host's power caps."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from aiokafka import AIOKafkaConsumer
from prometheus_client import CollectorRegistry

from agents.publisher import KafkaPublisher
from fleetloop.kafka_broker import free_port
from fleetloop.node import run_node_async
from fleetloop.settings import NodeSettings
from fleetloop.topics_admin import ensure_topics
from schemas.codec import encode
from schemas.commands import Target, ThrottleAction, ThrottleCommand
from schemas.topics import ACCELERATOR_TICKS, COMMAND_RESULTS, NODE_HEALTH, THROTTLE_COMMANDS
from tests.factories import COMMAND_KEYS_SETTING, signed_command
from tests.fake_nvml import FakeGpu, FakeNvml


async def _read_all(bootstrap: str, topics: list[str]) -> list[tuple[str, dict[str, object]]]:
    consumer = AIOKafkaConsumer(
        *topics, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    out: list[tuple[str, dict[str, object]]] = []
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=2000)
            if not batch:
                return out
            out += [(r.topic, json.loads(r.value)) for rs in batch.values() for r in rs]
    finally:
        await consumer.stop()


def test_node_agent_publishes_nvml_samples_and_applies_its_own_power_caps(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    asyncio.run(ensure_topics(kafka_bootstrap, prefix=topic_prefix))
    nvml = FakeNvml([FakeGpu("GPU-aaaa"), FakeGpu("GPU-bbbb")])
    settings = NodeSettings(
        kafka_bootstrap=kafka_bootstrap,
        topic_prefix=topic_prefix,
        node_id="node-7",
        rack_id="rack-0003",
        interval_s=0.2,
        ticks=40,
        web_port=free_port(),
        spool_dir=tmp_path / "spool",
        seen_file=tmp_path / "state" / "seen.json",
        command_keys=COMMAND_KEYS_SETTING,
    )
    now = datetime.now(UTC)
    mine = signed_command(
        ThrottleCommand,
        issued_at=now,
        target=Target(device_uuid="GPU-aaaa"),
        action=ThrottleAction.POWER_CAP,
        power_limit_watts=450.0,
    )
    other = signed_command(
        ThrottleCommand,
        issued_at=now,
        target=Target(node_id="node-8"),
        action=ThrottleAction.POWER_CAP,
        power_limit_watts=300.0,
    )

    async def scenario() -> None:
        node = asyncio.create_task(
            run_node_async(settings, nvml=nvml, registry=CollectorRegistry())
        )
        await asyncio.sleep(2.0)  # a few samples at the old limit first
        async with KafkaPublisher(kafka_bootstrap, topic_prefix=topic_prefix) as pub:
            for c in (mine, other):
                await pub.publish_raw(
                    THROTTLE_COMMANDS.name, THROTTLE_COMMANDS.key_for(c), encode(c)
                )
            await pub.flush()
        await asyncio.sleep(2.0)
        url = f"http://127.0.0.1:{settings.web_port}/metrics"
        metrics = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
        stats = await node
        assert stats.ticks == 40 and stats.results == 1
        text = metrics.decode()
        for family in (
            "fleetloop_agent_events_published_total",
            "fleetloop_loop_ticks_total",
            "fleetloop_executor_command_latency_seconds_bucket",
        ):
            assert family in text, family
        assert 'status="applied"' in text and 'executor="node-executor"' in text

    asyncio.run(scenario())
    names = [topic_prefix + t.name for t in (ACCELERATOR_TICKS, NODE_HEALTH, COMMAND_RESULTS)]
    seen = asyncio.run(_read_all(kafka_bootstrap, names))
    results = [v for t, v in seen if t.endswith(COMMAND_RESULTS.name)]
    assert [(r["command_id"], r["status"]) for r in results] == [(str(mine.command_id), "applied")]
    assert nvml.gpus[0].limit_mw == 450_000 and nvml.gpus[1].limit_mw == 700_000
    ticks = [v for t, v in seen if t.endswith(ACCELERATOR_TICKS.name)]  # one per tick, v2
    assert len(ticks) == 40 and all(tick["node_id"] == "node-7" for tick in ticks)
    limits = [
        sample["power_limit_watts"]
        for tick in ticks
        for sample in cast(list[dict[str, Any]], tick["samples"])
        if sample["device_uuid"] == "GPU-aaaa"
    ]
    assert len(limits) == 40 and limits[0] == 700.0 and limits[-1] == 450.0
    beats = [v for t, v in seen if t.endswith(NODE_HEALTH.name)]
    assert [b["heartbeat_seq"] for b in beats] == list(range(1, 41))
    assert all(b["node_id"] == "node-7" and b["rack_id"] == "rack-0003" for b in beats)

    # A restarted node remembers what it handled: the same command again is a duplicate.
    assert settings.seen_file is not None and settings.seen_file.exists()
    nvml.gpus[0].limit_mw = 700_000

    async def replay() -> None:
        node = asyncio.create_task(
            run_node_async(
                settings.model_copy(update={"ticks": 15}), nvml=nvml, registry=CollectorRegistry()
            )
        )
        async with KafkaPublisher(kafka_bootstrap, topic_prefix=topic_prefix) as pub:
            await pub.publish_raw(
                THROTTLE_COMMANDS.name, THROTTLE_COMMANDS.key_for(mine), encode(mine)
            )
            await pub.flush()
        assert (await node).results == 1

    asyncio.run(replay())
    results = [
        v
        for t, v in asyncio.run(_read_all(kafka_bootstrap, names))
        if t.endswith(COMMAND_RESULTS.name)
    ]
    assert [r["status"] for r in results] == ["applied", "duplicate"]
    assert nvml.gpus[0].limit_mw == 700_000  # not applied again
