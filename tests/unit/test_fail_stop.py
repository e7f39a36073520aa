"""A processor that cannot write must stop the worker, never skip ahead."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from schemas.codec import encode
from schemas.envelopes import AcceleratorTick
from schemas.topics import ACCELERATOR_TICKS
from streams.app import IngestMetrics
from streams.clickhouse_store import ClickHouseStore
from streams.fatal import EXIT_PROCESSING_FAILED
from streams.ingest import RawMessage, split
from streams.ingest_loop import IngestLoop, IngestSettings, _Batch
from streams.rows import Coordinates
from streams.sink import ClickHouseSink
from tests.factories import fleet_messages, ingest_now


class _Consumer:
    """What the ingest loop asks of its consumer when it writes: the owned partitions, and
    a commit (recorded, so the test sees that none happened)."""

    def __init__(self, owned: set[TopicPartition]) -> None:
        self.owned = owned
        self.commits: list[dict[TopicPartition, int]] = []

    def assignment(self) -> set[TopicPartition]:
        return self.owned

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(offsets)


def test_a_failed_write_calls_on_fatal_and_commits_nothing(store: ClickHouseStore) -> None:
    broken = ClickHouseStore(store.client, database="no_such_database")  # real engine, real error
    fatal: list[tuple[str, BaseException]] = []
    registry = CollectorRegistry()
    metrics = IngestMetrics(registry)
    sink = ClickHouseSink(broken, registry=registry, max_attempts=1)
    topic = ACCELERATOR_TICKS.name
    sink.marks.marks[("accelerator_telemetry", topic, 0)] = -1  # known: no read before the write
    settings = IngestSettings(
        bootstrap="127.0.0.1:1", group_id="t-fatal", topics={topic: ACCELERATOR_TICKS},
        dlq_names={topic: ACCELERATOR_TICKS.dlq_name},
    )  # fmt: skip
    loop = IngestLoop(
        settings, sink, events=metrics.events, dead_letters=metrics.dead_letters,
        errors=metrics.errors, on_fatal=lambda where, exc: fatal.append((where, exc)),
    )  # fmt: skip
    consumer = _Consumer({TopicPartition(topic, 0)})
    loop._consumer = consumer
    loop._producer = SimpleNamespace()  # no dead letters to send
    ticks = [v for s, v in fleet_messages(200) if s is ACCELERATOR_TICKS][:3]
    raw = [RawMessage(Coordinates(topic, 0, i), b"n", encode(v)) for i, v in enumerate(ticks)]
    split_up = split(raw, AcceleratorTick, now=ingest_now())
    batch = _Batch(
        split_up.valid, {TopicPartition(topic, 0): 3}, {topic: 3}, {topic: 0}, 0, ingest_now()
    )

    async def write() -> None:
        await loop._write(await loop._prepare(batch))

    with pytest.raises(Exception, match=r"(?i)no_such_database|unknown_database"):
        asyncio.run(write())
    assert consumer.commits == [] and loop._uncommitted == {}  # so the offsets never move
    assert [where for where, _ in fatal] == ["ingest"]
    assert "no_such_database" in str(fatal[0][1]).lower() or "UNKNOWN_DATABASE" in str(fatal[0][1])
    assert (
        registry.get_sample_value("fleetloop_processing_errors_total", {"processor": "ingest"})
        == 1.0
    )


def test_fail_stop_ends_the_process_with_a_failure_code() -> None:
    code = "from streams.fatal import fail_stop; fail_stop('ingest.demand', RuntimeError('boom'))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == EXIT_PROCESSING_FAILED
    assert "ingest.demand" in proc.stderr and "boom" in proc.stderr


def _committing_loop(store: ClickHouseStore, registry: CollectorRegistry, topic: str) -> IngestLoop:
    """An ingest loop on ``topic`` that commits after every write (no broker: a test sets
    its consumer and producer)."""
    metrics = IngestMetrics(registry)
    settings = IngestSettings(
        bootstrap="127.0.0.1:1", group_id="t-" + topic, topics={topic: ACCELERATOR_TICKS},
        dlq_names={topic: topic + ".dlq"}, commit_interval_s=0.0,
    )  # fmt: skip
    return IngestLoop(
        settings, ClickHouseSink(store, registry=registry), events=metrics.events,
        dead_letters=metrics.dead_letters, errors=metrics.errors, on_fatal=_never,
    )  # fmt: skip


def test_a_written_batch_is_committed_once_clickhouse_holds_it(store: ClickHouseStore) -> None:
    registry = CollectorRegistry()
    topic = "commit-test." + ACCELERATOR_TICKS.name
    loop = _committing_loop(store, registry, topic)
    consumer = _Consumer({TopicPartition(topic, 3)})
    loop._consumer = consumer
    loop._producer = SimpleNamespace()
    ticks = [v for s, v in fleet_messages(200) if s is ACCELERATOR_TICKS][:4]
    raw = [RawMessage(Coordinates(topic, 3, i), b"n", encode(v)) for i, v in enumerate(ticks)]
    batch = _Batch(
        split(raw, AcceleratorTick, now=ingest_now()).valid, {TopicPartition(topic, 3): 4},
        {topic: 4}, {topic: 0}, 0, ingest_now(),
    )  # fmt: skip

    async def write() -> None:
        await loop._write(await loop._prepare(batch))

    asyncio.run(write())
    stored = store.query(
        f"SELECT count() FROM {store.database}.accelerator_telemetry WHERE src_topic = '{topic}'"
    ).rows[0][0]
    assert stored == sum(len(t.samples) for t in ticks)
    assert consumer.commits == [{TopicPartition(topic, 3): 4}]


def _never(where: str, exc: BaseException) -> None:
    raise AssertionError(f"{where} failed: {exc!r}")


def test_batches_that_wait_for_a_write_are_written_and_committed_together(
    store: ClickHouseStore,
) -> None:
    """Group commit: the batches queued while the writer was busy go in as one insert per
    table, land once, and commit each partition's last offset once."""
    registry = CollectorRegistry()
    topic = "together-test." + ACCELERATOR_TICKS.name
    loop = _committing_loop(store, registry, topic)
    consumer = _Consumer({TopicPartition(topic, 0), TopicPartition(topic, 1)})
    loop._consumer = consumer
    loop._producer = SimpleNamespace()
    ticks = [v for s, v in fleet_messages(400) if s is ACCELERATOR_TICKS][:6]
    batches = []
    for first in (0, 3):  # partition 0 in both batches, partition 1 in the first
        raw = [
            RawMessage(Coordinates(topic, part, first + i), b"n", encode(ticks[first + i]))
            for i, part in enumerate((0, 0, 1 if first == 0 else 0))
        ]
        ends = {TopicPartition(topic, m.at.partition): m.at.offset + 1 for m in raw}
        batches.append(
            _Batch(split(raw, AcceleratorTick, now=ingest_now()).valid, ends, {topic: 3},
                   {topic: 0}, 0, ingest_now())
        )  # fmt: skip

    async def write() -> None:
        for batch in batches:  # prepared while no writer runs: they wait together
            loop._queue.put_nowait(await loop._prepare(batch))
        writer = asyncio.create_task(loop._write_in_order())
        await loop._queue.join()
        writer.cancel()

    asyncio.run(write())
    stored = store.query(
        f"SELECT count(), uniqExact(src_offset, sample_index) FROM {store.database}."
        f"accelerator_telemetry WHERE src_topic = '{topic}'"
    ).rows[0]
    assert stored == [sum(len(t.samples) for t in ticks)] * 2
    inserts = registry.get_sample_value(
        "fleetloop_sink_insert_seconds_count", {"table": "accelerator_ticks_in"}
    )
    assert inserts == 1
    assert consumer.commits == [{TopicPartition(topic, 0): 6, TopicPartition(topic, 1): 3}]
    assert (
        registry.get_sample_value(
            "fleetloop_ingest_events_total", {"topic": topic, "outcome": "valid"}
        )
        == 6
    )


def test_watermarks_are_read_on_assignment_so_a_first_batch_waits_on_no_read(
    store: ClickHouseStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A new owner reads every assigned partition's watermark, its dead letters' too, before
    the first batch: the batch then makes no read of its own (one would queue behind the
    insert in flight), and what ClickHouse holds is dropped, the rest written."""
    registry = CollectorRegistry()
    topic = "assign-test." + ACCELERATOR_TICKS.name
    ticks = [v for s, v in fleet_messages(200) if s is ACCELERATOR_TICKS][:4]
    raw = [RawMessage(Coordinates(topic, 0, i), b"n", encode(v)) for i, v in enumerate(ticks)]
    first = _committing_loop(store, registry, topic)
    first._consumer, first._producer = _Consumer({TopicPartition(topic, 0)}), SimpleNamespace()
    batch = _Batch(
        split(raw[:2], AcceleratorTick, now=ingest_now()).valid, {TopicPartition(topic, 0): 2},
        {topic: 2}, {topic: 0}, 0, ingest_now(),
    )  # fmt: skip

    async def write(loop: IngestLoop, batch: _Batch) -> None:
        await loop._write(await loop._prepare(batch))

    asyncio.run(write(first, batch))

    after = _committing_loop(store, CollectorRegistry(), topic)  # the partitions moved here
    after._consumer, after._producer = _Consumer({TopicPartition(topic, 0)}), SimpleNamespace()
    asyncio.run(after.assigned([TopicPartition(topic, 0), TopicPartition(topic, 1)]))
    assert after.sink.marks.marks == {
        ("accelerator_telemetry", topic, 0): 1, ("accelerator_telemetry", topic, 1): -1,
        ("dead_letters", topic, 0): -1, ("dead_letters", topic, 1): -1,
    }  # fmt: skip
    reads: list[str] = []
    query = store.query

    def counted(sql: str, *args: Any, **kwargs: Any) -> Any:
        reads.append(sql)
        return query(sql, *args, **kwargs)

    store.query = counted  # type: ignore[method-assign]
    try:  # a replay from offset 0: two envelopes stored already, two not
        replay = _Batch(
            split(raw, AcceleratorTick, now=ingest_now()).valid, {TopicPartition(topic, 0): 4},
            {topic: 4}, {topic: 0}, 0, ingest_now(),
        )  # fmt: skip
        asyncio.run(write(after, replay))
    finally:
        del store.query
    assert reads == []
    stored = store.query(
        f"SELECT count() FROM {store.database}.accelerator_telemetry WHERE src_topic = '{topic}'"
    ).rows[0][0]
    assert stored == sum(len(t.samples) for t in ticks)

    broken = _committing_loop(
        ClickHouseStore(store.client, database="no_such_database"), CollectorRegistry(), topic
    )
    with caplog.at_level("WARNING"):  # left to the first batch, which reads it then
        asyncio.run(broken.assigned([TopicPartition(topic, 2)]))
    assert broken.sink.marks.marks == {}
    assert "could not read the watermarks" in caplog.text
