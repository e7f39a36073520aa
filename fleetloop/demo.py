"""`fleetloop demo`: the whole path live on embedded defaults.

Starts the local broker (unless ``KAFKA_BOOTSTRAP`` names one), creates the
topics, starts a stream worker (which owns the embedded ClickHouse), runs the
simulated agents for a while, sends a few malformed messages to show the dead
letter path, waits until ClickHouse holds every event, prints a summary and
stops what it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from agents.publisher import KafkaPublisher
from agents.runner import run_agent
from agents.simulated import SimulatedFleetAgent
from fleetloop.kafka_broker import LocalKafkaBroker
from fleetloop.settings import AgentSettings, BrokerSettings
from fleetloop.sqlclient import format_table, run_query
from fleetloop.topics_admin import ensure_topics
from schemas.topics import ACCELERATOR, SERVING

MALFORMED = (
    (ACCELERATOR.name, b"{not json"),
    (ACCELERATOR.name, b'{"schema_version": 9}'),
    (SERVING.name, b'{"schema_version": 1, "tpot_p95_s": NaN}'),
)

SUMMARY_SQL = """
SELECT 'accelerator_telemetry' AS table, count() AS rows, uniqExact(event_id) AS unique_ids
FROM {db}.accelerator_telemetry WHERE ingested_at >= {since}
UNION ALL SELECT 'node_health', count(), uniqExact(event_id) FROM {db}.node_health
WHERE ingested_at >= {since}
UNION ALL SELECT 'pdu_readings', count(), uniqExact(event_id) FROM {db}.pdu_readings
WHERE ingested_at >= {since}
UNION ALL SELECT 'serving_metrics', count(), uniqExact(event_id) FROM {db}.serving_metrics
WHERE ingested_at >= {since}
UNION ALL SELECT 'demand', count(), uniqExact(event_id) FROM {db}.demand
WHERE ingested_at >= {since}
UNION ALL SELECT 'dead_letters', count(), uniqExact(source_topic, source_partition, source_offset)
FROM {db}.dead_letters WHERE ingested_at >= {since}
"""

FLEET_SQL = """
SELECT accelerator_type, count() AS samples, round(avg(gpu_util_ratio), 3) AS util,
       round(toFloat64(max(gpu_temp_celsius)), 1) AS max_temp_c,
       round(avg(power_usage_watts)) AS avg_watts,
       countIf(memory_temp_celsius IS NULL) AS no_mem_temp
FROM {db}.accelerator_telemetry WHERE ingested_at >= {since}
GROUP BY accelerator_type ORDER BY accelerator_type
"""


DEAD_SQL = """
SELECT source_topic, source_offset, error_kind, substring(error, 1, 60) AS error
FROM {db}.dead_letters WHERE ingested_at >= {since} ORDER BY received_at DESC LIMIT 5
"""


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with code {proc.returncode} while starting")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"worker did not answer {url} within {timeout_s:.0f}s")


def run_demo(broker_settings: BrokerSettings, agent: AgentSettings, *, keep_running: bool) -> int:
    """Run the demo; return a process exit code."""
    run_started = datetime.now(UTC)
    since = f"toDateTime64('{run_started:%Y-%m-%d %H:%M:%S}', 3, 'UTC')"  # this run's rows only
    env = dict(os.environ)
    broker: LocalKafkaBroker | None = None
    bootstrap = agent.kafka_bootstrap
    if "KAFKA_BOOTSTRAP" not in os.environ:
        broker = LocalKafkaBroker(broker_settings)
        print(f"[demo] starting Kafka {broker.version} (jars from Maven Central, cached)")
        print("[demo] " + broker.up().describe())
        bootstrap = broker.bootstrap
    env["KAFKA_BOOTSTRAP"] = bootstrap
    created = asyncio.run(ensure_topics(bootstrap, prefix=agent.topic_prefix))
    print(f"[demo] topics ready ({len(created)} created)")

    web_port = agent.query_url.rsplit(":", 1)[-1].strip("/")
    log_path = Path("var/worker.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fleetloop",
            "worker",
            "--web-port",
            web_port,
            "--clickhouse-dir",
            str(agent.clickhouse_dir),
            "--worker-dir",
            "var/worker",
            "--topic-prefix",
            agent.topic_prefix,
        ],
        env=env,
        stdout=log_path.open("ab"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    print(f"[demo] worker starting (log: {log_path})")
    try:
        _wait_http(agent.query_url + "/healthz", worker, timeout_s=90)
        print(f"[demo] worker up; metrics at {agent.query_url}/metrics")
        fleet = SimulatedFleetAgent(
            nodes=agent.nodes,
            devices_per_node=agent.devices_per_node,
            seed=agent.seed,
            start=datetime.now(UTC),
            interval_s=agent.interval_s,
        )
        ticks = agent.ticks or 15

        async def publish() -> int:
            async with KafkaPublisher(bootstrap, topic_prefix=agent.topic_prefix) as pub:
                sent = await run_agent(
                    fleet,
                    pub,
                    ticks=ticks,
                    interval_s=agent.interval_s,
                    on_tick=lambda n, s: print(f"[demo] tick {n + 1}/{ticks}: {s} events acked"),
                )
                for topic, raw in MALFORMED:
                    await pub.publish_raw(topic, b"demo", raw)
                await pub.flush()
                return sent

        sent = asyncio.run(publish())
        print(f"[demo] agents published {sent} events and {len(MALFORMED)} malformed messages")
        db = agent.clickhouse_database
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = run_query(agent, SUMMARY_SQL.format(db=db, since=since)).rows
            stored = sum(int(r[1]) for r in rows if r[0] != "dead_letters")
            dead = sum(int(r[1]) for r in rows if r[0] == "dead_letters")
            if stored >= sent and dead >= len(MALFORMED):
                break
            time.sleep(1)
        print("\n[demo] ClickHouse (embedded chDB, owned by the worker):")
        print(format_table(run_query(agent, SUMMARY_SQL.format(db=db, since=since))))
        print("\n[demo] fleet by accelerator type:")
        print(format_table(run_query(agent, FLEET_SQL.format(db=db, since=since))))
        print("\n[demo] dead letters:")
        print(format_table(run_query(agent, DEAD_SQL.format(db=db, since=since))))
        print("\n[demo] worker metrics (Prometheus, excerpt):")
        with urllib.request.urlopen(agent.query_url + "/metrics", timeout=10) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(
                    (
                        "fleetloop_ingest_events_total",
                        "fleetloop_sink_rows_total",
                        "fleetloop_dead_letters_total",
                    )
                ):
                    print("  " + line)
        if keep_running:
            print(
                "\n[demo] the worker keeps serving; in another shell try\n"
                f"  .venv/bin/fleetloop sql 'SELECT count() FROM {db}.demand'\n"
                "[demo] Ctrl-C stops the worker; `fleetloop kafka down` stops the broker"
            )
            with contextlib.suppress(KeyboardInterrupt):
                worker.wait()
        return 0
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
        if broker is not None and not keep_running:
            broker.down()
            print("[demo] broker stopped")
