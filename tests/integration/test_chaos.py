"""Chaos on the ingest path, on a broker of the test's own (so it can be killed): SIGKILL
the broker under a publishing agent, the agent while its spool holds a backlog, and the
ingest worker, each several times; then every event acknowledged is in ClickHouse once.

Processes, as deployed: ``fleetloop agent`` (a simulated fleet with a disk spool), the
broker from Maven Central jars, and ``fleetloop worker --processors ingest`` writing to
embedded ClickHouse. Every wait is a condition (rows grew, the spool filled or emptied),
never a fixed sleep. What is compared at the end, without ``FINAL``:
``count() == uniqExact(event_id)`` per table, their sum == the distinct event ids on the
broker's topics, and that sum >= every event an agent's life reported acknowledged.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

from fleetloop.kafka_broker import LocalKafkaBroker, free_port
from fleetloop.settings import REPO_ROOT, BrokerSettings
from fleetloop.topics_admin import ensure_topics, read_topic
from schemas.topics import TELEMETRY_TOPICS
from tests.integration.sim_proc import until
from tests.integration.worker_proc import WorkerProcess

JAR_DIR = Path(os.environ.get("FLEETLOOP_JAR_DIR", REPO_ROOT / ".cache" / "kafka"))
PREFIX = "chaos."


class Agent:
    """``fleetloop agent`` in its own process; each life's acknowledged count is read from
    its metrics (the last value seen before a SIGKILL, the total it prints on a clean end)."""

    def __init__(self, bootstrap: str, home: Path) -> None:
        self.bootstrap, self.home = bootstrap, home
        self.spool = home / "spool"
        self.acknowledged: list[float] = []  # one figure per finished life
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self) -> None:
        self.port = free_port()
        self.home.mkdir(parents=True, exist_ok=True)
        args = [
            sys.executable, "-m", "fleetloop", "agent", "--kafka-bootstrap", self.bootstrap,
            "--topic-prefix", PREFIX, "--nodes", "4", "--devices-per-node", "4",
            "--interval-s", "0.2", "--spool-dir", str(self.spool), "--send-timeout-s", "2",
            "--metrics-port", str(self.port),
        ]  # fmt: skip
        with (self.home / "agent.log").open("ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )  # fmt: skip
        until(
            lambda: self.metric("fleetloop_agent_events_published_total") >= 0,
            what="the agent",
            timeout_s=180,
        )

    def metric(self, name: str) -> float:
        """A metric summed over its label sets."""
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            lines = response.read().decode().splitlines()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in lines
            if line.startswith((name + " ", name + "{"))
        )

    def spooled(self) -> int:
        return len(list(self.spool.glob("*.jsonl"))) if self.spool.exists() else 0

    def kill(self) -> None:
        assert self.proc is not None
        self.acknowledged.append(self.metric("fleetloop_agent_events_published_total"))
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        assert self.proc is not None
        self.acknowledged.append(self.metric("fleetloop_agent_events_published_total"))
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def test_nothing_lost_nothing_doubled_through_repeated_sigkills(tmp_path: Path) -> None:
    broker = LocalKafkaBroker(
        BrokerSettings(
            broker_dir=tmp_path / "kafka", jar_dir=JAR_DIR, port=free_port(),
            controller_port=free_port(),
        )
    )  # fmt: skip
    broker.up()
    agent = Agent(broker.bootstrap, tmp_path / "agent")
    worker = WorkerProcess(
        bootstrap=broker.bootstrap, prefix=PREFIX, home=tmp_path / "worker",
        web_port=free_port(), extra=("--processors", "ingest", "--batch-within-s", "0.3"),
    )  # fmt: skip
    tables = sorted({s.table for s in TELEMETRY_TOPICS})
    per_sample = {s.table for s in TELEMETRY_TOPICS if s.envelope}  # rows of envelopes

    def rows() -> int:
        union = " + ".join(f"(SELECT count() FROM fleetloop.{t})" for t in tables)
        return int(worker.sql(f"SELECT {union}")[0][0])

    def grew(by: int) -> Callable[[], bool]:
        start = rows()
        return lambda: rows() >= start + by

    try:
        asyncio.run(ensure_topics(broker.bootstrap, prefix=PREFIX))
        worker.start()
        agent.start()
        kills = {"broker": 0, "agent": 0, "worker": 0}
        for _ in range(3):  # the broker, under a publishing agent
            until(grew(500), what="rows to grow", timeout_s=180)
            broker.kill()
            until(lambda: agent.spooled() >= 2, what="the agent to spool", timeout_s=180)
            broker.up()
            kills["broker"] += 1
        for _ in range(2):  # the agent, while its spool holds a backlog
            until(grew(500), what="rows to grow", timeout_s=180)
            broker.kill()
            until(lambda: agent.spooled() >= 5, what="a backlog in the spool", timeout_s=180)
            agent.kill()
            broker.up()
            agent.start()  # the next life sends the spool first
            kills["broker"] += 1
            kills["agent"] += 1
        for _ in range(3):  # the ingest worker, mid-batch
            until(grew(500), what="rows to grow", timeout_s=180)
            worker.kill()
            worker.start()
            kills["worker"] += 1
        until(grew(500), what="rows to grow after the last kill", timeout_s=180)
        agent.stop()
        until(lambda: agent.spooled() == 0, what="the spool empty", timeout_s=5)

        async def on_broker() -> tuple[int, int, int]:
            """Records, distinct events (messages) and distinct samples (rows) on the broker."""
            ids: list[str] = []
            samples: set[tuple[str, int]] = set()
            for spec in TELEMETRY_TOPICS:
                for value, _ in await read_topic(broker.bootstrap, PREFIX + spec.name):
                    doc = json.loads(value)
                    ids.append(doc["event_id"])
                    count = len(doc["samples"]) if spec.envelope else 1
                    samples |= {(doc["event_id"], i) for i in range(count)}
            return len(ids), len(set(ids)), len(samples)

        records, messages, distinct = asyncio.run(on_broker())
        until(lambda: rows() >= distinct, what="every event in ClickHouse", timeout_s=120)
        per_table = {
            t: worker.sql(
                f"SELECT count(), uniqExact(event_id{', sample_index' if t in per_sample else ''})"
                f" FROM fleetloop.{t}"
            )[0]
            for t in tables
        }
        acknowledged = sum(agent.acknowledged)
        stored = sum(int(c) for c, _ in per_table.values())
        print(
            f"kills {kills}; acknowledged {acknowledged:.0f}; on the broker {records} records, "
            f"{messages} distinct ({distinct} samples); in ClickHouse {stored} rows; per table "
            f"{per_table}"
        )
        for table, (count, unique) in per_table.items():
            assert int(count) == int(unique), (table, count, unique)  # nothing doubled
        assert stored == distinct  # every event the broker holds, once
        assert messages >= acknowledged > 0  # nothing acknowledged was lost
        assert worker.sql("SELECT count() FROM fleetloop.dead_letters") == [
            [0]
        ]  # and none of it was refused
    finally:
        if agent.proc is not None and agent.proc.poll() is None:
            agent.proc.kill()
        worker.stop()
        broker.down()
