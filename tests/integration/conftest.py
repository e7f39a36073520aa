"""A real Kafka broker for the integration tests; never a mock.

Order of preference:
1. ``KAFKA_BOOTSTRAP`` names an existing broker or cluster;
2. testcontainers (Kafka in KRaft mode) when a Docker engine answers, or when
   ``FLEETLOOP_TEST_KAFKA=testcontainers``;
3. otherwise the project's own broker from Maven Central jars
   (``FLEETLOOP_TEST_KAFKA=local`` forces it).
If the chosen broker cannot start, every test that needs it fails (no skip).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetloop.kafka_broker import BrokerError, LocalKafkaBroker, free_port
from fleetloop.settings import REPO_ROOT, BrokerSettings
from fleetloop.topics_admin import ensure_topics
from tests.factories import COMMAND_KEYS_SETTING
from tests.integration.sim_proc import SimProcess
from tests.integration.worker_proc import WorkerProcess


def docker_engine_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    existing = os.environ.get("KAFKA_BOOTSTRAP")
    if existing:
        yield existing
        return
    mode = os.environ.get("FLEETLOOP_TEST_KAFKA", "auto")
    if mode == "testcontainers" or (mode == "auto" and docker_engine_answers()):
        from testcontainers.community.kafka import KafkaContainer

        with KafkaContainer("confluentinc/cp-kafka:7.7.1").with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    jar_dir = Path(os.environ.get("FLEETLOOP_JAR_DIR", REPO_ROOT / ".cache" / "kafka"))
    broker = LocalKafkaBroker(
        BrokerSettings(
            broker_dir=tmp_path_factory.mktemp("kafka"),
            jar_dir=jar_dir,
            port=free_port(),
            controller_port=free_port(),
        )
    )
    try:
        broker.up()
    except BrokerError as exc:
        pytest.fail(f"the test broker could not start: {exc}", pytrace=False)
    try:
        yield broker.bootstrap
    finally:
        broker.down()


@pytest.fixture
def topic_prefix() -> str:
    """Unique topic namespace per test."""
    return f"it-{uuid.uuid4().hex[:10]}."


def run_loop(
    bootstrap: str,
    prefix: str,
    home: Path,
    *,
    worker_extra: tuple[str, ...] = (),
    worker_env: dict[str, str] | None = None,
    scenario: Path | None = None,
    speed: float = 1.0,
    nodes: int | None = 4,
) -> Iterator[tuple[SimProcess, WorkerProcess]]:
    """A stream worker and the simulated fleet, each its own process, on fresh topics
    (``nodes`` of them; None: the scenario's own count)."""
    asyncio.run(ensure_topics(bootstrap, prefix=prefix))
    worker = WorkerProcess(
        bootstrap=bootstrap,
        prefix=prefix,
        home=home / "w",
        web_port=free_port(),
        extra=("--batch-within-s", "0.3", *worker_extra),
        env=worker_env,
    )
    sim = SimProcess(
        bootstrap=bootstrap,
        prefix=prefix,
        home=home,
        web_port=free_port(),
        scenario=scenario,
        speed=speed,
        nodes=nodes,
    )
    try:
        worker.start()
        sim.start()
        yield sim, worker
    finally:
        sim.stop()
        worker.stop()


def run_signed_scenario(
    bootstrap: str,
    prefix: str,
    home: Path,
    scenario_yaml: str,
    *,
    worker_extra: tuple[str, ...] = (),
    speed: float = 2.0,
    nodes: int | None = 4,
) -> Iterator[tuple[SimProcess, WorkerProcess]]:
    """:func:`run_loop` on a scenario given as YAML, the worker signing its commands."""
    scenario = home / "scenario.yaml"
    scenario.write_text(scenario_yaml)
    yield from run_loop(
        bootstrap,
        prefix,
        home,
        worker_extra=worker_extra,
        worker_env={"FLEETLOOP_COMMAND_KEYS": COMMAND_KEYS_SETTING},
        scenario=scenario,
        speed=speed,
        nodes=nodes,
    )


@pytest.fixture
def closed_loop(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> Iterator[tuple[SimProcess, WorkerProcess]]:
    yield from run_loop(
        kafka_bootstrap, topic_prefix, tmp_path, worker_extra=("--lag-interval-s", "1")
    )


@pytest.fixture(scope="session")
def clickhouse_url() -> Iterator[str]:
    """A ClickHouse server: ``CLICKHOUSE_URL``, else testcontainers when Docker answers.

    Without either, server mode cannot be exercised on this machine; the
    embedded engine (same code path) is covered by the unit tests.
    """
    existing = os.environ.get("CLICKHOUSE_URL")
    if existing:
        yield existing
        return
    if not docker_engine_answers():
        pytest.skip("no ClickHouse server here: set CLICKHOUSE_URL or run a Docker engine")
    from testcontainers.community.clickhouse import ClickHouseContainer

    with ClickHouseContainer("clickhouse/clickhouse-server:25.8.9.20") as server:
        host = server.get_container_host_ip()
        port = server.get_exposed_port(8123)
        yield f"http://{server.username}:{server.password}@{host}:{port}"
