"""A state record as large as a region's control levers get: on the real broker, the state
topic takes it and the state reader reads it back whole. A region of 50,000 devices with
every one capped (a site-wide power emergency) writes about 2.5 MB, over the broker's
default limit of 1 MB; a process that could not write it would stop (fail-stop)."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime
from typing import Any

import faust
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError

from fleetloop.topics_admin import ensure_topics
from schemas.codec import encode
from schemas.state import ControlMemory
from schemas.topics import CONTROL_STATE, STATE_RECORD_BYTES
from streams.state_topic import StateTopic

pytestmark = pytest.mark.integration


def _held(devices: int, per_rack: int) -> dict[str, Any]:
    """What a region's levers hold with ``devices`` capped, in racks of ``per_rack``: the
    shape ``ControlPlanner.held`` writes (each device's default watts and clock mode, each
    rack's power controller with the draws it keeps)."""
    at = datetime(2026, 12, 3, tzinfo=UTC).isoformat()
    racks = devices // per_rack
    return {
        "power": {
            "devices": {f"node-{i // 8:05d}-gpu{i % 8}": [700.0, False] for i in range(devices)},
            "batch_moved": {},
            "controllers": {
                f"rack-{r:04d}": {
                    "last_draw": 20_000.0,
                    "history": [[at, 20_000.0 + k, 1.0] for k in range(14)],
                    "calm": 0,
                    "warned": 0,
                    "held": 5,
                    "batch_off_watts": 0.0,
                    "pending_watts": 0.0,
                    "pending_periods": 0,
                }
                for r in range(racks)
            },
        },
        "weights": [],
        "batch_guards": {},
        "budgets": {},
    }


async def _send(bootstrap: str, topic: str, payload: bytes) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", max_request_size=STATE_RECORD_BYTES
    )
    await producer.start()
    try:
        await producer.send_and_wait(topic, payload, key=b"us-east", partition=0)
    finally:
        await producer.stop()


def test_a_region_with_every_device_capped_is_written_and_read_back_whole(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    record = ControlMemory(region="us-east", held=_held(50_000, 40))
    payload = encode(record)
    assert 2_000_000 < len(payload) < STATE_RECORD_BYTES
    asyncio.run(ensure_topics(kafka_bootstrap, prefix=topic_prefix, specs=(CONTROL_STATE,)))
    asyncio.run(_send(kafka_bootstrap, topic_prefix + CONTROL_STATE.name, payload))
    app = faust.App("state-records", broker=f"kafka://{kafka_bootstrap}")
    state = StateTopic(app, topic_prefix + CONTROL_STATE.name, partitions=CONTROL_STATE.partitions)
    loaded = asyncio.run(state.load(ControlMemory, only={0}))
    assert loaded["us-east"].held == record.held
    # the same topic at the broker's default limit refuses it: the limit is what lets it in
    plain = dataclasses.replace(CONTROL_STATE, name="state.control.default-limit.v1",
                                max_message_bytes=None)  # fmt: skip
    asyncio.run(ensure_topics(kafka_bootstrap, prefix=topic_prefix, specs=(plain,)))
    with pytest.raises(MessageSizeTooLargeError):
        asyncio.run(_send(kafka_bootstrap, topic_prefix + plain.name, payload))
