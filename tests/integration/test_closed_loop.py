"""The closed loop on the real broker: a command reaches its executor, the simulated fleet
acts on it, its telemetry shows it, and the command and its result are in ClickHouse.

`fleetloop sim` (the simulated fleet with its node, router and warmer executors) and
`fleetloop worker` run as their own processes, exactly as deployed.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

from agents.publisher import KafkaPublisher
from fleetloop.kafka_broker import free_port
from fleetloop.settings import REPO_ROOT
from fleetloop.topics_admin import ensure_topics
from schemas.base import Contract
from schemas.codec import encode
from schemas.commands import RouteAction, RouteCommand, Target, WarmAction, WarmCommand
from schemas.topics import ROUTE_COMMANDS, WARM_COMMANDS, TopicSpec
from tests.factories import COMMAND_KEYS, signed_command
from tests.integration.worker_proc import WorkerProcess

DEVICE = "node-00000-gpu0"
T = TypeVar("T")


class SimProcess:
    def __init__(self, *, bootstrap: str, prefix: str, home: Path, web_port: int) -> None:
        self.url = f"http://127.0.0.1:{web_port}"
        self.log_path = home / "sim.log"
        self.args = [
            sys.executable,
            "-m",
            "fleetloop",
            "sim",
            "--kafka-bootstrap",
            bootstrap,
            "--topic-prefix",
            prefix,
            "--nodes",
            "4",
            "--speed",
            "1",
            "--web-port",
            str(web_port),
            "--group-id",
            prefix + "executors",
            "--truth-file",
            str(home / "truth.jsonl"),
            "--spool-dir",
            str(home / "spool"),
        ]
        keys = ",".join(f"{k}={v.decode()}" for k, v in COMMAND_KEYS.items())
        self.env = dict(os.environ, FLEETLOOP_COMMAND_KEYS=keys, PYTHONUNBUFFERED="1")
        self.env.pop("KAFKA_BOOTSTRAP", None)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> SimProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=REPO_ROOT,
                env=self.env,
            )
        _until(lambda: self.get("/healthz"), what="the simulator's web port", proc=self)
        return self

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            return json.loads(response.read())

    def now(self) -> datetime:
        return datetime.fromisoformat(self.get("/healthz")["source_time"])

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def log_tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-40:])


def _until(
    probe: Callable[[], T | None], *, what: str, proc: Any = None, timeout_s: float = 90
) -> T:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.proc is not None and proc.proc.poll() is not None:
            raise AssertionError(f"{what}: process exited\n{proc.log_tail()}")
        try:
            value = probe()
            if value:
                return value
        except OSError as exc:
            last = exc
        time.sleep(0.5)
    tail = proc.log_tail() if proc is not None else ""
    raise AssertionError(f"timed out waiting for {what} ({last})\n{tail}")


def _at_least(
    rows: list[Any], n: int, *, count: Callable[[list[Any]], int] = len
) -> list[Any] | None:
    return rows if count(rows) >= n else None


async def _send(bootstrap: str, prefix: str, messages: list[tuple[TopicSpec, Contract]]) -> None:
    async with KafkaPublisher(bootstrap, topic_prefix=prefix) as publisher:
        for spec, value in messages:  # raw, so a replay is the very same bytes
            await publisher.publish_raw(spec.name, spec.key_for(value), encode(value))
        await publisher.flush()


@pytest.fixture
def loop(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> Iterator[tuple[SimProcess, WorkerProcess]]:
    asyncio.run(ensure_topics(kafka_bootstrap, prefix=topic_prefix))
    worker = WorkerProcess(
        bootstrap=kafka_bootstrap,
        prefix=topic_prefix,
        home=tmp_path / "w",
        web_port=free_port(),
        extra=("--batch-within-s", "0.3"),
    )
    sim = SimProcess(
        bootstrap=kafka_bootstrap, prefix=topic_prefix, home=tmp_path, web_port=free_port()
    )
    try:
        worker.start()
        sim.start()
        yield sim, worker
    finally:
        sim.stop()
        worker.stop()


def test_drain_reaches_the_device_and_forged_expired_replayed_commands_are_answered(
    loop: tuple[SimProcess, WorkerProcess], kafka_bootstrap: str, topic_prefix: str
) -> None:
    sim, worker = loop
    util_sql = (
        "SELECT count(), avg(gpu_util_ratio) FROM fleetloop.accelerator_telemetry "
        f"WHERE device_uuid = '{DEVICE}' AND src_topic LIKE '{topic_prefix}%'"
    )
    _until(lambda: int(worker.sql(util_sql)[0][0]) >= 5, what="telemetry from the device", proc=sim)
    assert float(worker.sql(util_sql)[0][1]) > 0.1  # it is serving

    now = sim.now()
    drain = signed_command(
        RouteCommand,
        issued_at=now,
        ttl_s=300,
        target=Target(device_uuid=DEVICE),
        action=RouteAction.DRAIN,
        reason="e2e_drain",
    )
    forged = signed_command(
        RouteCommand,
        issued_at=now,
        ttl_s=300,
        target=Target(device_uuid="node-00001-gpu0"),
        action=RouteAction.DRAIN,
        key=b"an-attacker-who-knows-the-key-id",
    )
    expired = signed_command(
        RouteCommand,
        issued_at=now - timedelta(minutes=10),
        ttl_s=60,
        target=Target(device_uuid="node-00002-gpu0"),
        action=RouteAction.DRAIN,
    )
    warm = signed_command(
        WarmCommand,
        issued_at=now,
        ttl_s=300,
        target=Target(pool="us-east-h100"),
        action=WarmAction.WARM,
        model="gemma-27b",
    )
    asyncio.run(
        _send(
            kafka_bootstrap,
            topic_prefix,
            [
                (ROUTE_COMMANDS, drain),
                (ROUTE_COMMANDS, forged),
                (ROUTE_COMMANDS, expired),
                (ROUTE_COMMANDS, drain),
                (WARM_COMMANDS, warm),
            ],
        )
    )

    results_sql = (
        "SELECT toString(command_id), executor, status, detail FROM fleetloop.command_results "
        f"WHERE src_topic LIKE '{topic_prefix}%' ORDER BY src_offset"
    )
    rows = _until(
        lambda: _at_least(worker.sql(results_sql), 5),
        what="five command results in ClickHouse",
        proc=sim,
    )
    by_command: dict[str, list[str]] = {}
    for command_id, _executor, status, _detail in rows:
        by_command.setdefault(command_id, []).append(status)
    assert by_command[str(drain.command_id)] == ["applied", "duplicate"]  # replay applied once
    assert by_command[str(forged.command_id)] == ["bad_signature"]
    assert by_command[str(expired.command_id)] == ["expired"]
    assert by_command[str(warm.command_id)] == ["applied"]
    executors = {r[0]: r[1] for r in rows}
    assert executors[str(drain.command_id)] == "node-executor"
    assert executors[str(warm.command_id)] == "warmer"

    # The command itself is in the audit table, once per message on the topic.
    audit = worker.sql(
        "SELECT count(), any(action), any(reason) FROM fleetloop.commands "
        f"WHERE command_id = '{drain.command_id}' AND src_topic LIKE '{topic_prefix}%'"
    )
    assert audit == [[2, "drain", "e2e_drain"]]

    # The router stopped sending it work, and its telemetry shows it idle.
    route = next(e for e in sim.get("/routes")["routes"]["llama-70b"] if e["device_uuid"] == DEVICE)
    assert route["weight"] == 0 and route["host_state"] == "draining"
    applied_at = worker.sql(
        "SELECT toString(completed_at) FROM fleetloop.command_results "
        f"WHERE command_id = '{drain.command_id}' AND status = 'applied'"
    )[0][0]
    after_sql = (
        "SELECT count(), max(gpu_util_ratio) FROM fleetloop.accelerator_telemetry "
        f"WHERE device_uuid = '{DEVICE}' AND src_topic LIKE '{topic_prefix}%' "
        f"AND observed_at > toDateTime64('{applied_at}', 3, 'UTC') + INTERVAL 2 SECOND"
    )
    count, peak = _until(
        lambda: _at_least(worker.sql(after_sql)[0], 3, count=lambda row: int(row[0])),
        what="telemetry after the drain",
        proc=sim,
    )
    assert float(peak) == 0.0, f"{count} samples after the drain, peak utilisation {peak}"
    served_sql = (
        "SELECT sum(requests) FROM fleetloop.serving_metrics "
        f"WHERE replica_id LIKE '{DEVICE}/%' AND src_topic LIKE '{topic_prefix}%' "
        f"AND observed_at > toDateTime64('{applied_at}', 3, 'UTC') + INTERVAL 2 SECOND"
    )
    assert int(worker.sql(served_sql)[0][0]) == 0
    others = (
        "SELECT max(gpu_util_ratio) FROM fleetloop.accelerator_telemetry "
        f"WHERE device_uuid = 'node-00000-gpu3' AND src_topic LIKE '{topic_prefix}%' "
        f"AND observed_at > toDateTime64('{applied_at}', 3, 'UTC')"
    )
    assert float(worker.sql(others)[0][0]) > 0.1  # the rest of the fleet keeps serving

    # SIGTERM stops the simulator at a tick boundary, with everything flushed and committed.
    assert sim.stop() == 0, sim.log_tail()
    assert "command results" in sim.log_tail()
