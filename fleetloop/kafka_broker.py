"""A real single-node Kafka broker (KRaft) run from Maven Central jars.

``fetch`` resolves ``infra/kafka/pom.xml`` into a jar cache; ``up`` renders the
config, formats storage once, starts the JVM detached and returns only when a
metadata request succeeds, failing fast with the log tail if the JVM dies;
``down`` stops it. Used by the demo, the test suite and CI; production points
``KAFKA_BOOTSTRAP`` at a real cluster instead.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from string import Template

from aiokafka.admin import AIOKafkaAdminClient

from fleetloop.settings import INFRA_DIR, BrokerSettings

KAFKA_INFRA = INFRA_DIR / "kafka"


class BrokerError(RuntimeError):
    """The local broker could not be fetched, started or reached."""


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    pid: int | None
    running: bool
    reachable: bool
    bootstrap: str

    def describe(self) -> str:
        state = (
            "up" if self.running and self.reachable else ("starting" if self.running else "down")
        )
        return f"kafka {state}: bootstrap={self.bootstrap} pid={self.pid or '-'}"


def _kafka_version() -> str:
    text = (KAFKA_INFRA / "pom.xml").read_text()
    start = text.index("<kafka.version>") + len("<kafka.version>")
    return text[start : text.index("</kafka.version>", start)].strip()


class LocalKafkaBroker:
    """Lifecycle of one local broker, all state under ``settings.broker_dir``."""

    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.version = _kafka_version()
        self.libs_dir = settings.jar_dir / self.version / "libs"
        self.dir = settings.broker_dir
        self.pid_file = self.dir / "broker.pid"
        self.log_dir = self.dir / "logs"
        self.data_dir = self.dir / "data"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.settings.port}"

    # -- jars ---------------------------------------------------------------
    def fetch(self) -> Path:
        """Resolve the broker jars from Maven Central once; return the libs dir."""
        marker = self.libs_dir / ".complete"
        manifest = hashlib.sha256((KAFKA_INFRA / "pom.xml").read_bytes()).hexdigest()[:16]
        if marker.exists() and marker.read_text().split() == [self.version, manifest]:
            return self.libs_dir  # resolved from this very manifest
        if shutil.which(self.settings.mvn) is None:
            raise BrokerError(f"maven ({self.settings.mvn!r}) not found; install maven and Java 17")
        self.libs_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            self.settings.mvn,
            "-q",
            "-B",
            "-f",
            str(KAFKA_INFRA / "pom.xml"),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={self.libs_dir.resolve()}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BrokerError(
                f"resolving Kafka {self.version} jars failed:\n{proc.stdout}{proc.stderr}"
            )
        marker.write_text(f"{self.version} {manifest}\n")
        return self.libs_dir

    # -- lifecycle ----------------------------------------------------------
    def _render_config(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        template = Template((KAFKA_INFRA / "server.properties.template").read_text())
        config = template.substitute(
            port=self.settings.port,
            controller_port=self.settings.controller_port,
            log_dir=self.data_dir.resolve(),
        )
        path = self.dir / "server.properties"
        path.write_text(config)
        return path

    def _java(self, main: str, *args: str) -> list[str]:
        return [
            self.settings.java,
            *self.settings.heap.split(),
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{(KAFKA_INFRA / 'log4j.properties').resolve()}",
            f"-Dkafka.logs.dir={self.log_dir.resolve()}",
            "-cp",
            f"{self.libs_dir.resolve()}/*",
            main,
            *args,
        ]

    def _format(self, config: Path) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        cluster_id = new_cluster_id()
        proc = subprocess.run(
            self._java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config)),
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise BrokerError(f"formatting broker storage failed:\n{proc.stdout}{proc.stderr}")

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        try:
            # A broker we started ourselves lingers as a zombie until reaped.
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return None
        except ChildProcessError:
            pass  # not our child: another process started it
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        return pid

    def up(self) -> BrokerStatus:
        """Start the broker (idempotent) and wait until it answers metadata requests."""
        self.fetch()
        if self.pid() is not None:
            self._wait_ready(None)
            return self.status()
        if _port_open(self.settings.port):
            raise BrokerError(f"port {self.settings.port} is taken by another process")
        config = self._render_config()
        self._format(config)
        out = (self.log_dir / "stdout.log").open("ab")
        proc = subprocess.Popen(
            self._java("kafka.Kafka", str(config)),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.pid_file.write_text(f"{proc.pid}\n")
        self._wait_ready(proc)
        return self.status()

    def _wait_ready(self, proc: subprocess.Popen[bytes] | None) -> None:
        deadline = time.monotonic() + self.settings.start_timeout_s
        last_error = "port closed"
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise BrokerError(
                    f"broker exited with code {proc.returncode} while starting:\n{self.log_tail()}"
                )
            if _port_open(self.settings.port):
                try:
                    asyncio.run(metadata_ok(self.bootstrap, timeout_s=5.0))
                    return
                except Exception as exc:  # broker still electing itself
                    last_error = repr(exc)
            time.sleep(0.3)
        raise BrokerError(
            f"broker not ready after {self.settings.start_timeout_s:.0f}s ({last_error}):\n"
            f"{self.log_tail()}"
        )

    def status(self) -> BrokerStatus:
        pid = self.pid()
        reachable = False
        if _port_open(self.settings.port):
            try:
                asyncio.run(metadata_ok(self.bootstrap, timeout_s=5.0))
                reachable = True
            except Exception:
                reachable = False
        return BrokerStatus(pid, pid is not None, reachable, self.bootstrap)

    def down(self, *, timeout_s: float = 30.0) -> None:
        """Stop the broker: SIGTERM, then SIGKILL after ``timeout_s``."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.pid() is not None:
            time.sleep(0.2)
        if self.pid() is not None:
            os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)

    def kill(self, *, timeout_s: float = 30.0) -> None:
        """SIGKILL the broker, as a power cut or the OOM killer would: no clean shutdown,
        so the next :meth:`up` recovers its logs. Returns once the process is gone."""
        pid = self.pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.pid() is not None:
            time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)

    def log_tail(self, lines: int = 40) -> str:
        chunks: list[str] = []
        for name in ("stdout.log", "server.log"):
            path = self.log_dir / name
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                chunks.append(f"--- {name} ---\n" + "\n".join(tail))
        return "\n".join(chunks) or "(no broker log yet)"


def new_cluster_id() -> str:
    """22-character base64url of 16 random bytes, never starting with '-'.

    The storage tool's argument parser reads a leading '-' as an option (Kafka's
    own ``random-uuid`` avoids such ids for the same reason).
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (for brokers and workers)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


async def metadata_ok(bootstrap: str, *, timeout_s: float) -> None:
    """Raise unless a metadata request to ``bootstrap`` succeeds."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000)
    )
    await asyncio.wait_for(admin.start(), timeout_s)
    try:
        await asyncio.wait_for(admin.describe_cluster(), timeout_s)
    finally:
        await admin.close()
