"""The simulated fleet with its executors in its own process (`fleetloop sim`), as deployed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from fleetloop.settings import REPO_ROOT
from tests.factories import COMMAND_KEYS_SETTING

T = TypeVar("T")


class SimProcess:
    def __init__(
        self,
        *,
        bootstrap: str,
        prefix: str,
        home: Path,
        web_port: int,
        scenario: Path | None = None,
        speed: float = 1.0,
        nodes: int | None = 4,  # None: the scenario's own
    ) -> None:
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
            *(["--nodes", str(nodes)] if nodes is not None else []),
            "--speed",
            str(speed),
            *(["--scenario", str(scenario)] if scenario else []),
            "--web-port",
            str(web_port),
            "--group-id",
            prefix + "executors",
            "--truth-file",
            str(home / "truth.jsonl"),
            "--spool-dir",
            str(home / "spool"),
            "--seen-file",
            str(home / "seen-commands.json"),
        ]
        self.env = dict(
            os.environ, FLEETLOOP_COMMAND_KEYS=COMMAND_KEYS_SETTING, PYTHONUNBUFFERED="1"
        )
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
        until(lambda: self.get("/healthz"), what="the simulator's web port", proc=self)
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


def until(
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


def at_least(
    rows: list[Any], minimum: int, *, count: Callable[[list[Any]], int] = len
) -> list[Any] | None:
    return rows if count(rows) >= minimum else None
