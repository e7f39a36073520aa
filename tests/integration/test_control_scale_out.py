"""Control scales out by region: workers with the same app id split the telemetry (keyed
by node) between their ``control.route`` loops, which forward it keyed by region, and the
region-keyed twins between their ``control.plan`` loops. With two workers, then three:
every region is planned by exactly one worker, never by two at once; no pool's decision
is made twice; each worker hears the other workers' pools' claims on the fleet's
optional-work limit; and a region whose worker is killed is taken over with what its
levers held.

Real broker, `fleetloop sim` publishing for 24 nodes (three pods in two regions), and
`fleetloop worker --processors control` processes, as deployed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from schemas.codec import decode
from schemas.topics import DECISIONS
from schemas.verdicts import Decision
from tests.integration.scale_out import fleet_and_workers
from tests.integration.test_demand_scale_out import _read
from tests.integration.worker_proc import WorkerProcess

pytestmark = pytest.mark.integration
REGIONS = {"us-east", "eu-west"}
LIMIT = 4.0
PERIOD = timedelta(seconds=2)


def _pages(workers: list[WorkerProcess]) -> list[dict[str, Any]]:
    out = []
    for worker in workers:
        try:
            out.append(json.loads(worker.get("/control/regions")))
        except OSError:  # between a start and its first page
            out.append({"regions": [], "budget": {"held": {}, "claimed_elsewhere": {}}})
    return out


def _planned(page: dict[str, Any]) -> set[str]:
    return {r["region"] for r in page["regions"]}


def test_control_workers_split_the_regions_and_share_the_limit(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    sim, workers = fleet_and_workers(
        kafka_bootstrap, topic_prefix, tmp_path, "control",
        "--control.period-s", str(PERIOD.total_seconds()),
        "--control.global-budget-devices", str(LIMIT),
    )  # fmt: skip
    twins: list[tuple[int, set[str]]] = []
    most = 0.0

    def settle(running: list[WorkerProcess], timeout_s: float) -> list[set[str]]:
        """Wait until every region is planned by exactly one of ``running``, two workers
        plan one each (the regions hash to partitions apart) and each worker has heard every
        other's pools' claims; the regions each plans."""
        nonlocal most
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            pages = _pages(running)
            planned = [_planned(p) for p in pages]
            for i, mine in enumerate(planned):
                for theirs in planned[i + 1 :]:
                    if mine & theirs:
                        twins.append((len(running), mine & theirs))
            held = [p["budget"]["held"] for p in pages]
            most = max(most, sum(c["units"] for h in held for c in h.values()))
            heard = all(
                set(held[j]) <= set(page["budget"]["claimed_elsewhere"])
                for i, page in enumerate(pages)
                for j in range(len(pages))
                if j != i
            )
            once = set().union(*planned) == REGIONS and sum(map(len, planned)) == len(REGIONS)
            if once and heard and sum(1 for p in planned if p) == len(REGIONS):
                return planned
            time.sleep(0.5)
        raise AssertionError(f"not settled in {timeout_s} s: {pages}")

    def periods_planned(running: list[WorkerProcess], periods: int) -> None:
        """Wait until the pools' grants have moved ``periods`` control periods on (each
        pool is granted its share at every period's end it is planned)."""

        def newest() -> datetime | None:
            held = [c for p in _pages(running) for c in p["budget"]["held"].values()]
            return max((datetime.fromisoformat(c["at"]) for c in held), default=None)

        deadline = time.monotonic() + 60
        start = newest()
        while (now := newest()) is None or start is None or now - start < periods * PERIOD:
            start = start or now
            assert time.monotonic() < deadline, f"{periods} periods not planned in 60 s"
            time.sleep(0.5)

    try:
        workers[0].start()
        workers[1].start()
        started = time.monotonic()
        sim.start()
        settle(workers[:2], timeout_s=120)
        first = time.monotonic() - started
        split = [_planned(p) for p in _pages(workers[:2])]
        assert all(split), f"two workers, two regions: one each ({split})"
        workers[2].start()
        started = time.monotonic()
        while True:  # settled once the newcomer forwards its share of the telemetry
            settle(workers, timeout_s=120)
            if workers[2].metric("fleetloop_control_forwarded_total") > 0:
                break
            assert time.monotonic() - started < 120, "the third worker never joined"
            time.sleep(1.0)
        joined = time.monotonic() - started
        periods_planned(workers, 3)  # three periods planned by three workers
        after = settle(workers, timeout_s=60)
        decisions = [
            decode(r.value, Decision)
            for r in asyncio.run(
                _read(kafka_bootstrap, topic_prefix + DECISIONS.name, DECISIONS.partitions)
            )
        ]
        made = Counter((d.controller, d.target, d.decided_at) for d in decisions)
        # the worker planning us-east is killed: the one that takes the region over adopts
        # what its levers held (state.control.v1) before it plans it
        east = next(i for i, planned in enumerate(after) if "us-east" in planned)
        adopted = [w.metric("fleetloop_control_levers_adopted_total") for w in workers]
        workers[east].kill()
        alive = [w for i, w in enumerate(workers) if i != east]
        started = time.monotonic()
        while "us-east" not in set().union(*(_planned(p) for p in _pages(alive))):
            assert time.monotonic() - started < 120, "us-east never taken over"
            time.sleep(0.5)
        moved = time.monotonic() - started
        took = [i for i, w in enumerate(workers) if i != east
                and w.metric("fleetloop_control_levers_adopted_total") > adopted[i]]  # fmt: skip
        assert took, "the region was taken over without what its levers held"
        print(
            f"2 workers: each region planned once after {first:.1f} s, split {split}; a third "
            f"joined: settled again after {joined:.1f} s, split {after}; us-east taken over "
            f"{moved:.1f} s after its worker was killed; {len(decisions)} "
            f"decisions; most optional work held at once {most:.2f} of {LIMIT}"
        )
        assert decisions, "no decision at all: nothing was planned"
        assert twins == [], f"regions planned by two workers at once: {twins[:3]}"
        assert [k for k, n in made.items() if n > 1] == [], "a decision made twice"
    finally:
        sim.stop()
        for worker in workers:
            worker.stop()
