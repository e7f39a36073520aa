"""The project's own broker: lifecycle through the CLI, and failing fast."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fleetloop.kafka_broker import BrokerError, LocalKafkaBroker, free_port
from fleetloop.settings import REPO_ROOT, BrokerSettings

pytestmark = pytest.mark.integration
JAR_DIR = Path(os.environ.get("FLEETLOOP_JAR_DIR", REPO_ROOT / ".cache" / "kafka"))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetloop", "kafka", *args, "--jar-dir", str(JAR_DIR)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=REPO_ROOT,
    )


def test_up_status_down_through_the_cli(tmp_path: Path) -> None:
    flags = (
        "--broker-dir",
        str(tmp_path),
        "--port",
        str(free_port()),
        "--controller-port",
        str(free_port()),
    )
    up = _cli("up", *flags)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "kafka up" in up.stdout
        again = _cli("up", *flags)  # idempotent: finds the running broker
        assert again.returncode == 0 and "kafka up" in again.stdout
        status = _cli("status", *flags)
        assert status.returncode == 0 and "kafka up" in status.stdout
    finally:
        down = _cli("down", *flags)
    assert down.returncode == 0
    status = _cli("status", *flags)
    assert status.returncode == 3 and "kafka down" in status.stdout


def test_a_broker_that_dies_while_starting_fails_fast_with_its_log(tmp_path: Path) -> None:
    # Someone else holds the controller port: the JVM starts, cannot bind, and exits.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        broker = LocalKafkaBroker(
            BrokerSettings(
                broker_dir=tmp_path,
                jar_dir=JAR_DIR,
                port=free_port(),
                controller_port=taken,
                start_timeout_s=300,
            )
        )
        with pytest.raises(BrokerError) as info:
            broker.up()
    message = str(info.value)
    assert "exited with code" in message, message  # not "not ready after 300s"
    assert "server.log" in message or "stdout.log" in message
    assert str(taken) in message  # the log tail names the port it could not bind
    broker.down()
