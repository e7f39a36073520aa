"""Health detection scales out: workers with the same app id split the telemetry
partitions, and when a third joins, the partitions move with no device left unwatched
once the rebalance settles and none ever watched (so judged) by two workers at once.

Real broker, `fleetloop sim` publishing node-tick envelopes for 24 nodes, and
`fleetloop worker --processors health` processes, as deployed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.integration.scale_out import NODES, fleet_and_workers
from tests.integration.worker_proc import WorkerProcess

pytestmark = pytest.mark.integration
DEVICES = NODES * 8


def _watched(workers: list[WorkerProcess]) -> list[set[str]]:
    out = []
    for worker in workers:
        try:
            out.append(set(json.loads(worker.get("/health/devices"))["devices"]))
        except OSError:  # between a start and its first page
            out.append(set())
    return out


def test_health_workers_split_the_fleet_and_rebalance_without_gaps_or_twins(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    sim, workers = fleet_and_workers(kafka_bootstrap, topic_prefix, tmp_path, "health")
    twins: list[tuple[float, set[str]]] = []  # any sample where two workers held a device

    def settle(running: list[WorkerProcess], timeout_s: float) -> float:
        """Seconds until every device is watched by exactly one of ``running`` (each
        holding some), sampling twice a second; twins are recorded whenever seen."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            sets = _watched(running)
            for i, mine in enumerate(sets):
                for theirs in sets[i + 1 :]:
                    if mine & theirs:
                        twins.append((time.monotonic() - started, mine & theirs))
            union = set().union(*sets)
            if len(union) == DEVICES and all(sets) and sum(map(len, sets)) == DEVICES:
                return time.monotonic() - started
            time.sleep(0.5)
        raise AssertionError(f"not settled in {timeout_s} s: {[len(s) for s in _watched(running)]}")

    try:
        workers[0].start()
        workers[1].start()
        sim.start()
        first = settle(workers[:2], timeout_s=120)
        workers[2].start()
        joined = settle(workers, timeout_s=120)
        stable_until = time.monotonic() + 20  # and it stays so
        while time.monotonic() < stable_until:
            sets = _watched(workers)
            assert sum(map(len, sets)) == DEVICES == len(set().union(*sets)), [len(s) for s in sets]
            time.sleep(0.5)
        print(
            f"2 workers: every device watched once after {first:.1f} s; "
            f"a third joined: settled again after {joined:.1f} s; per worker "
            f"{[len(s) for s in _watched(workers)]} devices"
        )
        assert twins == [], f"devices watched by two workers at once: {twins[:3]}"
    finally:
        sim.stop()
        for worker in workers:
            worker.stop()
