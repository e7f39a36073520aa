"""Child processes of the one-command jobs (`demo`, `eval faults`): start, wait, stop."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path


def get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return dict(json.loads(response.read()))


def wait_for(
    probe: Callable[[], object],
    procs: dict[str, subprocess.Popen[bytes]],
    what: str,
    timeout_s: float,
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode} (see {name}.log)")
        with contextlib.suppress(OSError):
            if probe():
                return
        time.sleep(0.5)
    raise RuntimeError(f"timed out waiting for {what}")


def spawn(
    name: str, args: list[str], env: dict[str, str], log_dir: Path = Path("var")
) -> subprocess.Popen[bytes]:
    log = log_dir / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "fleetloop", *args],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )


def stop_all(procs: dict[str, subprocess.Popen[bytes]], timeout_s: float = 30.0) -> None:
    """SIGTERM each still running process, newest first; kill what does not stop."""
    for proc in reversed(list(procs.values())):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
