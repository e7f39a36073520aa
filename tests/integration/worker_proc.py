"""A stream worker in its own process, as it runs in production (so it can be SIGKILLed)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from fleetloop.settings import REPO_ROOT


class WorkerProcess:
    def __init__(
        self,
        *,
        bootstrap: str,
        prefix: str,
        home: Path,
        web_port: int,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.bootstrap, self.prefix = bootstrap, prefix
        self.token = secrets.token_urlsafe(24)  # the pages' token (/sql, guardrail reset)
        self.extra_env = {
            "FLEETLOOP_PAGE_TOKEN": self.token,
            "FLEETLOOP_TOPIC_TIMESTAMPS": "create",  # a simulated world: its clock stamps
            **(env or {}),
        }
        self.url = f"http://127.0.0.1:{web_port}"
        self.log_path = home / "worker.log"
        self.args = [
            sys.executable,
            "-m",
            "fleetloop",
            "worker",
            "--kafka-bootstrap",
            bootstrap,
            "--topic-prefix",
            prefix,
            "--app-id",
            prefix.rstrip("."),
            "--worker-dir",
            str(home / "faust"),
            "--clickhouse-dir",
            str(home / "clickhouse"),
            "--web-port",
            str(web_port),
            "--session-timeout-s",
            "6",
            *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 90.0) -> WorkerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.extra_env)
        env.pop("KAFKA_BOOTSTRAP", None)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=REPO_ROOT,
                env=env,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.get("/healthz")
                return self
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"worker did not come up:\n{self.log_tail()}")

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            return bytes(response.read())

    def post(self, path: str, body: dict[str, Any], *, timeout_s: float = 30.0) -> Any:
        """A guarded page, as an operator's tool calls it: JSON and the bearer token."""
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"},
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())

    def sql(self, query: str) -> list[list[Any]]:
        return list(self.post("/sql", {"sql": query})["rows"])

    def issued(self, device: str, *, prefix: str) -> list[str]:
        """The actions issued for ``device`` on ``prefix``'s topics, oldest first."""
        rows = self.sql(
            f"SELECT action FROM fleetloop.decisions WHERE src_topic LIKE '{prefix}%' "
            f"AND target = '{device}' AND outcome = 'issued' ORDER BY decided_at"
        )
        return [r[0] for r in rows]

    @property
    def app_id(self) -> str:
        """Its app id (the last ``--app-id`` it is given wins), its groups' prefix."""
        at = len(self.args) - 1 - self.args[::-1].index("--app-id")
        return self.args[at + 1]

    def series(self) -> list[tuple[str, float]]:
        """One scrape of its metrics: each series (name and labels) with its value."""
        out = []
        for line in self.get("/metrics").decode().splitlines():
            if line and not line.startswith("#"):
                series, value = line.rsplit(" ", 1)
                out.append((series, float(value)))
        return out

    def metric(self, name: str) -> float:
        """A metric summed over its label sets."""
        return sum(v for s, v in self.series() if s == name or s.startswith(name + "{"))

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
