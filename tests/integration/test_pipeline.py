"""Agents -> real Kafka -> faust worker -> ClickHouse: nothing lost, nothing duplicated.

Phase 1 publishes 10,000 events of all five families and 100 malformed
messages and checks ClickHouse holds exactly those. Phase 2 publishes 20,000
more plus 50 malformed, SIGKILLs the worker mid-stream while it holds written
rows whose offsets are not committed (it commits every 5 s; its metrics say),
restarts it and checks the totals again: the restarted worker re-reads rows
the killed one had already written, and the watermarks must drop them. Phase 3
stops a worker gracefully mid-stream and checks the same.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from agents.envelopes import pack
from agents.publisher import KafkaPublisher
from fleetloop.kafka_broker import free_port
from fleetloop.topics_admin import ensure_topics
from schemas.codec import encode
from schemas.topics import ACCELERATOR_TICKS, INGESTED_TOPICS, TELEMETRY_TOPICS, TopicSpec
from streams.lag import fetch_lag
from tests.factories import fleet_events, malformed_payloads
from tests.integration.worker_proc import WorkerProcess

pytestmark = pytest.mark.integration
DB = "fleetloop"
TABLES = sorted({spec.table for spec in TELEMETRY_TOPICS})
PER_SAMPLE = {spec.table for spec in TELEMETRY_TOPICS if spec.envelope}  # rows of envelopes
COUNTS_SQL = " UNION ALL ".join(
    f"SELECT '{table}', count(), "
    f"uniqExact(event_id{', sample_index' if table in PER_SAMPLE else ''}) FROM {DB}.{table}"
    for table in TABLES
) + (
    f" UNION ALL SELECT 'dead_letters', count(), "
    f"uniqExact(source_topic, source_partition, source_offset) FROM {DB}.dead_letters"
)


async def _publish(bootstrap: str, prefix: str, events: list, bad: list) -> None:  # type: ignore[type-arg]
    """``events`` as agents send them (node-tick envelopes), then ``bad`` raw."""
    async with KafkaPublisher(bootstrap, topic_prefix=prefix) as publisher:
        for spec, value in pack(events):
            await publisher.publish(spec, value)
        for i, (spec, raw, _kind) in enumerate(bad):
            await publisher.publish_raw(spec.name, f"bad-{i}".encode(), raw)
        await publisher.flush()


def _counts(worker: WorkerProcess) -> dict[str, tuple[int, int]]:
    return {row[0]: (int(row[1]), int(row[2])) for row in worker.sql(COUNTS_SQL)}


def _settled(worker: WorkerProcess) -> bool:
    """Whether the worker's ingest has committed every message on its topics: it commits
    only what it has written, so nothing more (a duplicate) can land after this."""
    group = f"{worker.app_id}.ingest"
    topics = [worker.prefix + spec.name for spec in INGESTED_TOPICS]
    return sum(asyncio.run(fetch_lag(worker.bootstrap, group, topics)).values()) == 0


def _wait_for(
    worker: WorkerProcess, events: int, dead: int, timeout_s: float = 180.0
) -> dict[str, tuple[int, int]]:
    """The counts once ClickHouse holds ``events`` event rows and ``dead`` dead letters and
    the worker has committed everything it read."""
    deadline = time.monotonic() + timeout_s
    counts: dict[str, tuple[int, int]] = {}
    while time.monotonic() < deadline:
        counts = _counts(worker)
        stored = sum(c for t, (c, _) in counts.items() if t != "dead_letters")
        if stored >= events and counts["dead_letters"][0] >= dead and _settled(worker):
            return _counts(worker)
        time.sleep(0.5)
    raise AssertionError(f"timed out at {counts}\n{worker.log_tail()}")


def _written(worker: WorkerProcess) -> tuple[int, int]:
    """Event rows this process has written to ClickHouse, and the messages it has written
    whose offsets are not committed yet (what a crash now would make the next one re-read)."""
    rows = pending = 0.0
    for series, value in worker.series():  # one scrape: both readings of one instant
        if series.startswith("fleetloop_sink_rows_total{") and "dead_letters" not in series:
            rows += value
        elif series == "fleetloop_ingest_uncommitted_messages":
            pending = value
    return int(rows), int(pending)


def _stop_mid_stream(
    worker: WorkerProcess, *, past: int, how: Callable[[WorkerProcess], None]
) -> tuple[int, int]:
    """Stop ``worker`` (``how``) once it has written more than ``past`` event rows and holds
    written messages not yet committed, read from its metrics (cheap beside a count in
    ClickHouse, which a busy worker answers late: by then it may have caught up and
    committed everything). Returns both readings."""
    rows = pending = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rows, pending = _written(worker)
        if rows > past and pending > 0:
            break
        time.sleep(0.01)
    how(worker)
    return rows, pending


def _expected(events: list) -> Counter[str]:  # type: ignore[type-arg]
    """Rows per table: one per device sample, packed or not."""
    return Counter(spec.table for spec, _ in events)


def _one_bad_sample_each(count: int) -> tuple[list[tuple[TopicSpec, bytes, str]], int]:
    """``count`` envelopes whose third sample is out of bounds (dead-lettered alone), and
    how many good samples they carry."""
    ticks = [v for s, v in pack(fleet_events(2_000, seed=9)) if s is ACCELERATOR_TICKS][:count]
    out: list[tuple[TopicSpec, bytes, str]] = []
    for tick in ticks:
        doc = json.loads(encode(tick))
        doc["samples"][2]["gpu_temp_celsius"] = 9_000.0
        out.append((ACCELERATOR_TICKS, json.dumps(doc).encode(), "schema"))
    return out, sum(len(t.samples) - 1 for t in ticks)


async def _dlq_coordinates(bootstrap: str, prefix: str, expected: int) -> list[dict]:  # type: ignore[type-arg]
    consumer = AIOKafkaConsumer(
        *(prefix + spec.dlq_name for spec in TELEMETRY_TOPICS),
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    letters: list[dict] = []  # type: ignore[type-arg]
    try:
        deadline = time.monotonic() + 60
        while len(letters) < expected and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=1000)
            for records in batches.values():
                letters.extend(json.loads(r.value) for r in records)
    finally:
        await consumer.stop()
    return letters


@pytest.fixture
def worker_home(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


def test_exactly_once_into_clickhouse_across_sigkill(
    kafka_bootstrap: str, topic_prefix: str, worker_home: Path
) -> None:
    asyncio.run(ensure_topics(kafka_bootstrap, prefix=topic_prefix))
    port = free_port()
    opts = ("--batch-max", "250", "--batch-within-s", "0.2", "--commit-interval-s", "5")

    def start_worker() -> WorkerProcess:  # same group, same data: a restart
        return WorkerProcess(
            bootstrap=kafka_bootstrap,
            prefix=topic_prefix,
            home=worker_home,
            web_port=port,
            extra=opts,
        ).start()

    worker = start_worker()
    restarted: WorkerProcess | None = None
    try:
        # Phase 1: 10,000 events of all five families + 100 malformed messages.
        events = fleet_events(10_000, seed=1)
        sample_bad, good_beside = _one_bad_sample_each(5)
        bad = malformed_payloads(100)
        assert set(_expected(events)) == set(TABLES)
        asyncio.run(_publish(kafka_bootstrap, topic_prefix, events, bad + sample_bad))
        counts = _wait_for(worker, 10_000 + good_beside, 105)
        expected = _expected(events)
        expected["accelerator_telemetry"] += good_beside
        for table, n in expected.items():
            assert counts[table] == (n, n), table
        assert counts["dead_letters"] == (105, 105)
        kinds = worker.sql(f"SELECT error_kind, count() FROM {DB}.dead_letters GROUP BY 1")
        assert dict((k, int(c)) for k, c in kinds) == Counter(k for _, _, k in bad + sample_bad)
        indexed = worker.sql(
            f"SELECT source_index, count() FROM {DB}.dead_letters "
            "WHERE source_index IS NOT NULL GROUP BY 1"
        )
        assert [(int(i), int(c)) for i, c in indexed] == [(2, 5)]  # the bad sample alone

        letters = asyncio.run(_dlq_coordinates(kafka_bootstrap, topic_prefix, 105))
        coords = {(d["source_topic"], d["source_partition"], d["source_offset"]) for d in letters}
        assert len(coords) == 105
        assert all(d["error_kind"] and d["raw_base64"] is not None for d in letters)

        # Phase 2: 20,000 more + 50 malformed; SIGKILL mid-stream while written rows are
        # not committed; restart. The kill and the worker's next commit race (a commit
        # between the last metrics reading and the signal leaves nothing to re-read), so a
        # round that re-read nothing is run again with fresh events, three rounds at most.
        more_bad = malformed_payloads(150)[100:]
        replayed, rounds = 0.0, 0
        while replayed == 0:
            rounds += 1
            assert rounds <= 3, "three kills in a row landed just after a commit"
            more = fleet_events(20_000, seed=1 + rounds)
            base, _ = _written(worker)
            asyncio.run(_publish(kafka_bootstrap, topic_prefix, more, more_bad))
            at_kill, pending = _stop_mid_stream(worker, past=base + 2_000, how=WorkerProcess.kill)
            assert pending > 0 and at_kill - base < 20_000, (at_kill - base, pending)
            expected += _expected(more)
            total = sum(expected.values())
            worker = restarted = start_worker()
            counts = _wait_for(restarted, total, 155)
            for table, n in expected.items():
                assert counts[table] == (n, n), (table, counts[table], n)
            assert counts["dead_letters"] == (155, 155)
            more_bad = []
            replayed = restarted.metric("fleetloop_sink_replayed_rows_total")
            print(
                f"round {rounds}: killed with {at_kill - base} of 20,000 rows written, "
                f"{pending} messages uncommitted; restart dropped {replayed:.0f} replayed rows"
            )
        assert restarted is not None

        # `fleetloop sql` is answered by the worker that owns the (locked) embedded data,
        # read-only.
        def fleetloop_sql(query: str) -> subprocess.CompletedProcess[str]:
            cli = [
                sys.executable,
                "-m",
                "fleetloop",
                "sql",
                "--format",
                "json",
                "--query-url",
                restarted.url,
                "--clickhouse-dir",
                str(worker_home / "clickhouse"),
                query,
            ]
            env = dict(os.environ, FLEETLOOP_PAGE_TOKEN=restarted.token)
            return subprocess.run(
                cli, capture_output=True, text=True, timeout=60, check=False, env=env
            )

        out = fleetloop_sql(f"SELECT count() FROM {DB}.dead_letters")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["rows"] == [[155]]
        out = fleetloop_sql(f"TRUNCATE TABLE {DB}.dead_letters")
        assert out.returncode == 1 and "readonly" in out.stderr.lower()
        assert _counts(restarted)["dead_letters"] == (155, 155)

        # Phase 3: a graceful stop (SIGTERM) mid-stream must not commit unwritten rows either.
        last = fleet_events(20_000, seed=10)
        base, _ = _written(restarted)
        asyncio.run(_publish(kafka_bootstrap, topic_prefix, last, []))
        at_term, pending = _stop_mid_stream(restarted, past=base + 2_000, how=WorkerProcess.stop)
        assert at_term - base < 20_000, f"SIGTERM not mid-stream: {at_term - base} rows"
        third = start_worker()
        try:
            expected += _expected(last)
            counts = _wait_for(third, sum(expected.values()), 155)
            for table, n in expected.items():
                assert counts[table] == (n, n), (table, counts[table], n)
            print(f"SIGTERM with {at_term - base} of 20,000 written; all exact after restart")
        finally:
            third.stop()
    finally:
        worker.stop()
        if restarted is not None:
            restarted.stop()
