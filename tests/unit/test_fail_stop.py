"""A processor that cannot write must stop the worker, never skip ahead."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from schemas.codec import encode
from schemas.topics import ACCELERATOR
from streams.app import WorkerConfig, create_app
from streams.clickhouse_store import ClickHouseStore
from streams.fatal import EXIT_PROCESSING_FAILED
from tests.factories import fleet_events


class _OneBatch:
    def __init__(self, events: list[Any]) -> None:
        self.events = events

    acked: list[Any]

    async def noack_take(self, max_: int, within: float) -> AsyncIterator[list[Any]]:
        self.acked = []
        yield self.events

    async def ack(self, event: Any) -> None:
        self.acked.append(event)


def test_a_failed_batch_calls_on_fatal_with_the_processor(
    store: ClickHouseStore, tmp_path: Path
) -> None:
    broken = ClickHouseStore(store.client, database="no_such_database")  # real engine, real error
    fatal: list[tuple[str, BaseException]] = []
    registry = CollectorRegistry()
    config = WorkerConfig(
        app_id="t-fatal", bootstrap="127.0.0.1:1", worker_dir=tmp_path, web_port=1
    )
    app = create_app(config, broken, registry, on_fatal=lambda p, e: fatal.append((p, e)))
    values = [v for s, v in fleet_events(50) if s is ACCELERATOR][:3]
    events = [
        SimpleNamespace(
            message=SimpleNamespace(
                topic=ACCELERATOR.name,
                partition=0,
                offset=i,
                key=b"n",
                value=encode(v),
                headers=[],
            )
        )
        for i, v in enumerate(values)
    ]
    agent = app.agents["ingest.telemetry.accelerator.v1"]
    stream = _OneBatch(events)
    with pytest.raises(Exception, match=r"(?i)no_such_database|unknown_database"):
        asyncio.run(agent.fun(stream))
    assert stream.acked == []  # a failed batch is never acked, so never committed
    assert [p for p, _ in fatal] == ["ingest.telemetry.accelerator.v1"]
    assert "no_such_database" in str(fatal[0][1]).lower() or "UNKNOWN_DATABASE" in str(fatal[0][1])
    errors = registry.get_sample_value(
        "fleetloop_processing_errors_total", {"processor": "ingest.telemetry.accelerator.v1"}
    )
    assert errors == 1.0


def test_fail_stop_ends_the_process_with_a_failure_code() -> None:
    code = "from streams.fatal import fail_stop; fail_stop('ingest.demand', RuntimeError('boom'))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == EXIT_PROCESSING_FAILED
    assert "ingest.demand" in proc.stderr and "boom" in proc.stderr


def test_a_written_batch_is_acked_after_clickhouse_holds_it(
    store: ClickHouseStore, tmp_path: Path
) -> None:
    config = WorkerConfig(app_id="t-ack", bootstrap="127.0.0.1:1", worker_dir=tmp_path, web_port=1)
    app = create_app(config, store, CollectorRegistry())
    values = [v for s, v in fleet_events(50) if s is ACCELERATOR][:4]
    topic = "ack-test." + ACCELERATOR.name
    events = [
        SimpleNamespace(
            message=SimpleNamespace(
                topic=topic, partition=3, offset=i, key=b"n", value=encode(v), headers=[]
            )
        )
        for i, v in enumerate(values)
    ]
    stream = _OneBatch(events)
    asyncio.run(app.agents["ingest.telemetry.accelerator.v1"].fun(stream))
    stored = store.query(
        f"SELECT count() FROM {store.database}.accelerator_telemetry WHERE src_topic = '{topic}'"
    ).rows[0][0]
    assert stored == 4
    assert stream.acked == events
