"""The suite passes on any date: the ClickHouse tests, with their dates months in the past.

Retention in ClickHouse (``TTL ingested_at + INTERVAL 30 DAY``) is judged on the engine's
own clock, so a test that wrote fixed ingestion times passed for a month and failed after.
Here the sink and SRE-question tests run with every event time they build moved 61 days
before the clock (``FLEETLOOP_TEST_START``), the same as running them 61 days after their
fixed dates.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_clickhouse_tests_pass_with_the_clock_61_days_after_their_dates() -> None:
    start = (datetime.now(UTC) - timedelta(days=61)).replace(microsecond=0)
    env = {**os.environ, "FLEETLOOP_TEST_START": start.isoformat()}
    tests = ["tests/unit/test_sink.py", "tests/unit/test_questions.py"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout
