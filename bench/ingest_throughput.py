"""Ingest throughput per device sample: the production ingest loop against raw getmany.

Every path reads the same pre-produced telemetry (node-tick envelopes, as agents
send them: all families of the simulated fleet's mix) from the same broker in
one run, and is timed from its first fetched batch to its last sample:

- the baseline: a raw aiokafka ``getmany`` loop that decodes and validates every
  envelope (msgspec, :func:`schemas.codec.decode_tick`) and does nothing else;
- the ingest loop the worker runs (:class:`streams.ingest_loop.IngestLoop`), in
  this process, into embedded ClickHouse: decode, dead letters, watermarks,
  insert, commit;
- optionally (``--worker``) the worker process with only the ingest role, read
  from outside through ``/sql``.

Rates are device samples (ClickHouse rows) per second; the goal is >= 100,000
with a ratio >= 0.5 against the baseline.

    python -m bench.ingest_throughput --samples 400000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer
from prometheus_client import CollectorRegistry

from agents.envelopes import pack
from agents.publisher import KafkaPublisher
from agents.simulated import SimulatedFleetAgent
from bench.broker import bench_broker
from fleetloop.kafka_broker import free_port
from fleetloop.settings import REPO_ROOT
from fleetloop.topics_admin import ensure_topics
from fleetloop.worker import tune_gc
from schemas.codec import DecodeError, decode_samples, decode_tick
from schemas.topics import INGESTED_TOPICS, TELEMETRY_TOPICS, TopicSpec
from streams.clickhouse_store import open_store
from streams.ingest_loop import IngestLoop, IngestSettings
from streams.rows import LAYOUTS
from streams.sink import ClickHouseSink


def _messages(samples: int) -> list[tuple[TopicSpec, Any]]:
    """Envelopes of at least ``samples`` device samples (and the other families beside)."""
    agent = SimulatedFleetAgent(nodes=250, devices_per_node=8, seed=5, start=datetime.now(UTC))
    events: list[tuple[TopicSpec, Any]] = []
    n = 0
    while len(events) < samples:
        events += agent.tick(n)
        n += 1
    return pack(events)


async def produce(bootstrap: str, prefix: str, messages: list[tuple[TopicSpec, Any]]) -> float:
    started = time.perf_counter()
    async with KafkaPublisher(bootstrap, topic_prefix=prefix, linger_ms=20) as publisher:
        for i, (spec, value) in enumerate(messages):
            await publisher.publish(spec, value)
            if i % 20_000 == 19_999:
                await publisher.flush()
        await publisher.flush()
    return len(messages) / (time.perf_counter() - started)


async def _raw_loop(bootstrap: str, prefix: str, total: int) -> tuple[float, float, int]:
    """getmany + decode and validate every sample: the ceiling of any ingest. Samples per
    second of wall time and per CPU second of this process, and how many were invalid."""
    by_name = {prefix + spec.name: spec for spec in TELEMETRY_TOPICS}
    consumer = AIOKafkaConsumer(
        *by_name,
        bootstrap_servers=bootstrap,
        group_id=f"bench-raw-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=10_000,
        fetch_max_bytes=64 * 1024 * 1024,
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )
    await consumer.start()
    seen = bad = 0
    started: float | None = None
    cpu_at = 0.0
    try:
        while seen < total:
            batches = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            if started is None and batches:
                started, cpu_at = time.perf_counter(), _cpu_s()
            for tp, records in batches.items():
                value_type = by_name[tp.topic].value_type
                for record in records:
                    try:
                        if by_name[tp.topic].envelope:
                            tick = decode_tick(record.value, value_type).tick
                            seen += 0 if tick is None else len(tick.samples)
                        else:
                            seen += len(decode_samples(record.value, value_type))
                    except DecodeError:
                        bad += 1
        assert started is not None
        return seen / (time.perf_counter() - started), seen / (_cpu_s() - cpu_at), bad
    finally:
        await consumer.stop()


def _cpu_s() -> float:
    """CPU seconds this process has used, every thread (chDB's included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _ingest_loop(
    bootstrap: str, prefix: str, total: int, home: Path, *, write: bool = True
) -> tuple[float, float]:
    """The worker's ingest loop, in this process, into embedded ClickHouse: samples per
    second of wall time, and per CPU second (what one core carries). ``write=False``: the
    same loop with ClickHouse's part of each insert skipped (everything up to the call is
    done as always), to tell the Python half's cost from ClickHouse's on the same cores."""
    store = open_store(url=None, data_dir=home / f"loop-clickhouse-{write}", database="bench")
    store.apply_schema()
    if not write:
        store.insert_json_lines = lambda *args, **kwargs: None  # type: ignore[method-assign]
        store.insert = lambda *args, **kwargs: None  # type: ignore[method-assign]
    registry = CollectorRegistry()
    sink = ClickHouseSink(store, registry=registry)
    from streams.app import IngestMetrics  # the worker's own counters

    metrics = IngestMetrics(registry)
    topics = {prefix + spec.name: spec for spec in INGESTED_TOPICS}
    settings = IngestSettings(
        bootstrap=bootstrap,
        group_id=f"bench-ingest-{uuid.uuid4().hex[:6]}",
        topics=topics,
        dlq_names={name: prefix + spec.dlq_name for name, spec in topics.items()},
    )

    def fatal(where: str, exc: BaseException) -> None:
        raise RuntimeError(f"{where} failed") from exc

    loop = IngestLoop(
        settings, sink, events=metrics.events, dead_letters=metrics.dead_letters,
        errors=metrics.errors, on_fatal=fatal,
    )  # fmt: skip
    first: list[tuple[float, float]] = []
    fetch, insert = loop._fetch, sink.insert
    done = asyncio.get_running_loop().create_future()
    written = 0

    async def timed(within_s: float) -> Any:
        batch = await fetch(within_s)
        if batch is not None and not first:  # as the baseline: from the first batch's return
            first.append((time.perf_counter(), _cpu_s()))
        return batch

    async def counted(inserts: Any) -> int:
        # the end is the insert that lands the last row, read where it returns: polling
        # the metrics registry instead (0.8 ms a look, 50 looks a second) took 4% of the
        # loop's own thread
        nonlocal written
        rows = await insert(inserts)
        written += rows
        if written >= total and not done.done():
            done.set_result((time.perf_counter(), _cpu_s()))
        return rows

    loop._fetch = timed  # type: ignore[method-assign]
    sink.insert = counted  # type: ignore[method-assign]
    task = asyncio.create_task(loop.run())
    try:
        await asyncio.wait({task, done}, return_when=asyncio.FIRST_COMPLETED)
        if not done.done():
            task.result()  # it ended first: say why
            raise RuntimeError(f"the ingest loop stopped after {written} of {total} rows")
        ended_at, cpu_at = done.result()
        wall, cpu = ended_at - first[0][0], cpu_at - first[0][1]
        return total / wall, total / cpu
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        store.close()


def _worker_rate(bootstrap: str, prefix: str, total: int, home: Path) -> tuple[float, Counter[str]]:
    sys.path.insert(0, str(REPO_ROOT))
    from tests.integration.worker_proc import WorkerProcess

    worker = WorkerProcess(bootstrap=bootstrap, prefix=prefix, home=home, web_port=free_port())
    worker.args += ["--loglevel", "warning", "--processors", "ingest"]
    tables = sorted({s.table for s in TELEMETRY_TOPICS})
    count_sql = " UNION ALL ".join(f"SELECT '{t}', count() FROM fleetloop.{t}" for t in tables)
    worker.start()
    try:
        first_at: float | None = None
        first_count = 0
        while True:
            rows = {r[0]: int(r[1]) for r in worker.sql(count_sql)}
            stored = sum(rows.values())
            now = time.perf_counter()
            if first_at is None and stored > 0:
                first_at, first_count = now, stored
            if stored >= total:
                assert first_at is not None
                elapsed = max(now - first_at, 1e-9)
                return (stored - first_count) / elapsed, Counter(rows)
            time.sleep(0.2)
    finally:
        worker.stop()


def _line(label: str, rate: float, note: str = "") -> None:
    print(f"{label:44}: {rate:10,.0f} samples/s" + (f"  ({note})" if note else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=400_000)
    parser.add_argument("--worker", action="store_true", help="also the worker process")
    parser.add_argument(
        "--split-cost",
        action="store_true",
        help="also the ingest loop with ClickHouse's part of the insert skipped (a diagnostic)",
    )
    args = parser.parse_args()
    tune_gc()  # as the worker does at start-up
    with tempfile.TemporaryDirectory(prefix="fleetloop-bench-") as tmp:
        home = Path(tmp)
        with bench_broker(home) as bootstrap:
            prefix = f"bench-{uuid.uuid4().hex[:8]}."
            asyncio.run(ensure_topics(bootstrap, prefix=prefix, specs=INGESTED_TOPICS))
            messages = _messages(args.samples)
            rows = sum(LAYOUTS[type(v)].rows(v) for _, v in messages)
            produce_rate = asyncio.run(produce(bootstrap, prefix, messages))
            mix = Counter(spec.name for spec, _ in messages)
            print(f"pre-produced {len(messages)} messages, {rows} samples ({dict(mix)}) "
                  f"at {produce_rate:,.0f} messages/s")  # fmt: skip
            raw_rate, raw_per_core, bad = asyncio.run(_raw_loop(bootstrap, prefix, rows))
            _line("raw getmany + decode (baseline)", raw_rate, f"{bad} invalid")
            _line("baseline, per CPU second of its process", raw_per_core, "one core's share")
            loop_rate, per_core = asyncio.run(_ingest_loop(bootstrap, prefix, rows, home))
            _line("ingest loop -> embedded ClickHouse", loop_rate, "in-process")
            _line("ingest loop, per CPU second of its process", per_core, "ClickHouse's included")
            print(f"ratio ingest loop / raw baseline: {loop_rate / raw_rate:.3f} "
                  f"(per CPU second: {per_core / raw_per_core:.3f}; the broker shares the "
                  f"{os.cpu_count()} cores)")  # fmt: skip
            if args.split_cost:
                python_rate, python_per_core = asyncio.run(
                    _ingest_loop(bootstrap, prefix, rows, home, write=False)
                )
                _line("diagnostic: the loop, ClickHouse skipped", python_rate, "its Python half")
                print(f"ratio without ClickHouse's part / raw baseline: "
                      f"{python_rate / raw_rate:.3f} (per CPU second: "
                      f"{python_per_core / raw_per_core:.3f})")  # fmt: skip
            if args.worker:
                worker_rate, stored = _worker_rate(bootstrap, prefix, rows, home / "worker")
                _line("worker process (ingest only)", worker_rate, f"{sum(stored.values())} rows")
                print(f"ratio worker / raw baseline: {worker_rate / raw_rate:.3f}")


if __name__ == "__main__":
    main()
