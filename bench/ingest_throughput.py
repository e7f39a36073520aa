"""Ingest throughput: the faust worker against a raw aiokafka ``getmany`` + decode loop.

All read the same pre-produced telemetry (all five families, the simulated
fleet's mix) from the same broker in one run. The raw loop only decodes and
validates; the worker also writes to ClickHouse (embedded) and commits
offsets, which is the real job; a faust worker whose processors only count
separates faust's own per-event cost from ours. Prints the rates and ratios.

    python -m bench.ingest_throughput --events 100000
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from aiokafka import AIOKafkaConsumer
from prometheus_client import CollectorRegistry

from agents.publisher import KafkaPublisher
from agents.simulated import SimulatedFleetAgent
from bench.broker import bench_broker
from fleetloop.kafka_broker import free_port
from fleetloop.settings import REPO_ROOT
from fleetloop.topics_admin import ensure_topics
from fleetloop.worker import tune_gc
from schemas.base import Contract
from schemas.codec import DecodeError, decode
from schemas.topics import TELEMETRY_TOPICS, TopicSpec
from streams.clickhouse_store import open_store
from streams.ingest import RawMessage, split
from streams.rows import Coordinates
from streams.sink import ClickHouseSink


def _events(count: int) -> list[tuple[TopicSpec, Contract]]:
    agent = SimulatedFleetAgent(nodes=50, devices_per_node=8, seed=5, start=datetime.now(UTC))
    return agent.first(count)


async def _produce(bootstrap: str, prefix: str, events: list[tuple[TopicSpec, Contract]]) -> float:
    started = time.perf_counter()
    async with KafkaPublisher(bootstrap, topic_prefix=prefix, linger_ms=20) as publisher:
        for i, (spec, value) in enumerate(events):
            await publisher.publish(spec, value)
            if i % 20_000 == 19_999:
                await publisher.flush()
        await publisher.flush()
    return len(events) / (time.perf_counter() - started)


async def _raw_loop(
    bootstrap: str, prefix: str, total: int, sink: ClickHouseSink | None = None
) -> tuple[float, int]:
    """getmany + decode; with ``sink``, also the worker's ingest step and ClickHouse writes."""
    by_name = {prefix + spec.name: spec for spec in TELEMETRY_TOPICS}
    consumer = AIOKafkaConsumer(
        *by_name,
        bootstrap_servers=bootstrap,
        group_id=f"bench-raw-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=10_000,
        fetch_max_bytes=64 * 1024 * 1024,
    )
    await consumer.start()
    seen = bad = 0
    started: float | None = None
    try:
        while seen < total:
            batches = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            if started is None and batches:
                started = time.perf_counter()
            now = datetime.now(UTC)
            decoded: list[tuple[Contract, Coordinates]] = []
            for tp, records in batches.items():
                spec = by_name[tp.topic]
                if sink is not None:
                    messages = [
                        RawMessage(Coordinates(r.topic, r.partition, r.offset), r.key, r.value)
                        for r in records
                    ]
                    result = split(messages, spec.value_type, now=now)
                    decoded += [*result.valid, *result.dead]
                    bad += len(result.dead)
                    seen += len(records)
                    continue
                for record in records:
                    try:
                        decode(record.value, spec.value_type)
                    except DecodeError:
                        bad += 1
                    seen += 1
            if sink is not None and decoded:
                await sink.write(decoded, now=now)  # one insert per table per poll
        assert started is not None
        return seen / (time.perf_counter() - started), bad
    finally:
        await consumer.stop()


def _worker_rate(bootstrap: str, prefix: str, total: int, home: Path) -> tuple[float, Counter[str]]:
    sys.path.insert(0, str(REPO_ROOT))
    from tests.integration.worker_proc import WorkerProcess

    worker = WorkerProcess(bootstrap=bootstrap, prefix=prefix, home=home, web_port=free_port())
    worker.args += ["--loglevel", "warning"]
    count_sql = " UNION ALL ".join(
        f"SELECT '{s.table}', count() FROM fleetloop.{s.table}" for s in TELEMETRY_TOPICS
    )
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


def _faust_noop_rate(bootstrap: str, prefix: str, total: int) -> float:
    cmd = [
        sys.executable,
        "-m",
        "bench.faust_noop",
        "--bootstrap",
        bootstrap,
        "--prefix",
        prefix,
        "--events",
        str(total),
    ]
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=900, cwd=REPO_ROOT, check=False
    )
    rates = re.findall(r"^rate (\d+)$", out.stdout, flags=re.MULTILINE)
    if not rates:
        raise RuntimeError(f"faust no-op run failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return float(rates[0])


def _line(label: str, rate: float, note: str = "") -> None:
    print(f"{label:42}: {rate:10,.0f} events/s" + (f"  ({note})" if note else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleetloop-bench-") as tmp:
        home = Path(tmp)
        with bench_broker(home) as bootstrap:
            prefix = f"bench-{uuid.uuid4().hex[:8]}."
            asyncio.run(ensure_topics(bootstrap, prefix=prefix, specs=TELEMETRY_TOPICS))
            events = _events(args.events)
            produce_rate = asyncio.run(_produce(bootstrap, prefix, events))
            mix = Counter(spec.name.split(".")[1] for spec, _ in events)
            print(f"pre-produced {len(events)} events ({dict(mix)}) at {produce_rate:,.0f}/s")
            raw_rate, bad = asyncio.run(_raw_loop(bootstrap, prefix, len(events)))
            _line("raw aiokafka getmany + decode (baseline)", raw_rate, f"{bad} invalid")
            sink_rates: dict[str, float] = {}
            for gc_mode in ("default", "tuned"):
                if gc_mode == "tuned":
                    tune_gc()  # as the worker does at start-up
                store = open_store(
                    url=None, data_dir=home / "raw-clickhouse", database=f"raw_{gc_mode}_gc"
                )
                store.apply_schema()
                sink = ClickHouseSink(store, registry=CollectorRegistry())
                rate, _ = asyncio.run(_raw_loop(bootstrap, prefix, len(events), sink))
                sink_rates[gc_mode] = rate
                _line(f"raw getmany + ingest + sink, gc {gc_mode}", rate, "the worker's steps")
            noop_rate = _faust_noop_rate(bootstrap, prefix, len(events))
            _line("faust no-op processors", noop_rate, "faust's own ceiling")
            worker_rate, stored = _worker_rate(bootstrap, prefix, len(events), home / "worker")
            _line("faust worker -> ClickHouse", worker_rate, f"{sum(stored.values())} rows")
            print(f"ratio worker / raw baseline: {worker_rate / raw_rate:.3f}")
            print(f"ratio faust no-op / raw baseline: {noop_rate / raw_rate:.3f}")
            print(f"ratio worker / faust no-op: {worker_rate / noop_rate:.3f}")
            print(f"ratio worker / raw + sink (gc tuned): {worker_rate / sink_rates['tuned']:.3f}")
            print(
                f"ratio gc tuned / gc default (raw + sink): "
                f"{sink_rates['tuned'] / sink_rates['default']:.3f}"
            )


if __name__ == "__main__":
    main()
