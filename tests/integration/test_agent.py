"""The simulated agent on the real broker: what it says it sent is on the topics."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
import urllib.request
from collections import Counter

import pytest
from aiokafka import AIOKafkaConsumer
from prometheus_client import CollectorRegistry, start_http_server

from agents.publisher import KafkaPublisher
from fleetloop.kafka_broker import free_port
from fleetloop.settings import REPO_ROOT
from fleetloop.topics_admin import ensure_topics
from schemas.codec import decode
from schemas.topics import TELEMETRY_TOPICS
from tests.factories import fleet_events

pytestmark = pytest.mark.integration


async def _consume_all(bootstrap: str, prefix: str, expected: int) -> Counter[str]:
    by_name = {prefix + s.name: s for s in TELEMETRY_TOPICS}
    consumer = AIOKafkaConsumer(
        *by_name,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    seen: Counter[str] = Counter()
    try:
        deadline = time.monotonic() + 60
        while sum(seen.values()) < expected and time.monotonic() < deadline:
            for tp, records in (await consumer.getmany(timeout_ms=1000)).items():
                spec = by_name[tp.topic]
                for record in records:
                    decode(record.value, spec.value_type)  # valid contracts only
                    seen[spec.name] += 1
    finally:
        await consumer.stop()
    return seen


def test_agent_command_publishes_what_it_reports(kafka_bootstrap: str, topic_prefix: str) -> None:
    asyncio.run(ensure_topics(kafka_bootstrap, prefix=topic_prefix))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetloop",
            "agent",
            "--kafka-bootstrap",
            kafka_bootstrap,
            "--topic-prefix",
            topic_prefix,
            "--nodes",
            "6",
            "--devices-per-node",
            "4",
            "--ticks",
            "3",
            "--interval-s",
            "0.1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO_ROOT,
    )
    assert out.returncode == 0, out.stderr
    match = re.search(r"published (\d+) events", out.stdout)
    assert match, out.stdout
    sent = int(match.group(1))
    # per node one envelope of its 4 devices, a heartbeat and one envelope of its replicas
    # (2 of 4 devices loaded); then PDUs, demand (3 models, 1 region)
    per_tick = 6 + 6 + 6 + 2 + 3
    assert sent == 3 * per_tick
    seen = asyncio.run(_consume_all(kafka_bootstrap, topic_prefix, sent))
    assert sum(seen.values()) == sent
    assert seen["telemetry.accelerator.v2"] == 3 * 6
    assert seen.get("telemetry.accelerator.v1", 0) == 0  # agents publish v2 only


def test_publisher_metrics_count_acknowledged_events_over_http(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    asyncio.run(ensure_topics(kafka_bootstrap, prefix=topic_prefix))
    registry = CollectorRegistry()
    events = fleet_events(500)

    async def publish() -> None:
        async with KafkaPublisher(
            kafka_bootstrap, topic_prefix=topic_prefix, registry=registry
        ) as publisher:
            await publisher.publish_all(events)

    asyncio.run(publish())
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        thread.join(timeout=10)
    counts = Counter(topic_prefix + spec.name for spec, _ in events)
    for topic, n in counts.items():
        line = f'fleetloop_agent_events_published_total{{topic="{topic}"}} {float(n)}'
        assert line in text
    assert "fleetloop_agent_publish_errors_total" in text
