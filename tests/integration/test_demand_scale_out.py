"""Demand planning scales out: workers with the same app id split the serving telemetry
(keyed by node) and the demand (keyed by model and region), and the repartition between
them (``demand.serving-steps.v1``) brings every serving partition's part of a model to the
one worker that plans it. With two workers, then three: every (model, region) is planned
by exactly one worker, never by two at once, and each step it closed counted every
replica that served in it, wherever its node's partition was read.

A key that moves goes on with what its planner had learned (``state.demand.v1``): handed
over on a rebalance, or replayed from its last memory when its worker is killed.

Real broker, `fleetloop sim` publishing for 24 nodes, and `fleetloop worker --processors
demand` processes, as deployed; the truth is read off the serving topic itself.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from schemas.codec import decode, decode_samples
from schemas.events import Demand
from schemas.topics import DEMAND, SERVING_TICKS
from tests.integration.scale_out import fleet_and_workers
from tests.integration.worker_proc import WorkerProcess

pytestmark = pytest.mark.integration
STEP_S = 5.0

Key = tuple[str, str]


def _planned(workers: list[WorkerProcess]) -> list[dict[Key, dict[str, Any]]]:
    out = []
    for worker in workers:
        try:
            keys = json.loads(worker.get("/demand/keys"))["keys"]
        except OSError:  # between a start and its first page
            keys = []
        out.append({(k["model"], k["region"]): k for k in keys})
    return out


async def _read(bootstrap: str, topic: str, partitions: int) -> list[Any]:
    """Every record of ``topic`` up to its end now."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        records: list[Any] = []
        while [tp for tp in parts if await consumer.position(tp) < ends[tp]]:
            for batch in (await consumer.getmany(timeout_ms=1000)).values():
                records += batch
        return records
    finally:
        await consumer.stop()


def _truth(bootstrap: str, prefix: str) -> tuple[set[Key], dict[tuple[Key, int], dict[str, int]]]:
    """The (model, region) keys with demand, and per key and step the replicas of each pool
    that served a request in it, from the topics themselves."""
    demand = asyncio.run(_read(bootstrap, prefix + DEMAND.name, DEMAND.partitions))
    keys = {(d.model, d.region) for d in (decode(r.value, Demand) for r in demand)}
    served: dict[tuple[Key, int], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for r in asyncio.run(_read(bootstrap, prefix + SERVING_TICKS.name, SERVING_TICKS.partitions)):
        for s in decode_samples(r.value, SERVING_TICKS.value_type):
            if s.requests > 0:
                step = int(s.observed_at.timestamp() // STEP_S)
                served[((s.model, s.region), step)][s.pool].add(s.replica_id)
    counts = {k: {p: len(r) for p, r in pools.items()} for k, pools in served.items()}
    return keys, counts


def test_demand_workers_split_the_models_and_count_every_replica_across_partitions(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    sim, workers = fleet_and_workers(
        kafka_bootstrap, topic_prefix, tmp_path, "demand", "--demand.step-s", str(STEP_S),
        "--demand.memory-every-s", "2",
    )  # fmt: skip
    twins: list[tuple[str, set[Key]]] = []  # any page read where two workers planned a key
    owners: dict[Key, tuple[int, int, int]] = {}  # key -> (worker, learned, closed), last read
    # a key that moved: (worker, learned, closed step) before; judged once its new owner
    # has closed that step too (after a kill it replays from its memory up to there first)
    moving: dict[Key, tuple[int, int, int]] = {}
    moves: list[tuple[Key, int, int]] = []  # (key, learned before the move, after)

    def settle(
        running: list[WorkerProcess], timeout_s: float, each_plans: bool = False
    ) -> tuple[float, dict[Key, Any]]:
        """Seconds until every key with demand is planned by exactly one of ``running``,
        each having closed a step since (and, with ``each_plans``, every worker planning
        some, in the same read); twins are recorded whenever seen."""
        started = time.monotonic()
        expected: set[Key] = set()
        while time.monotonic() - started < timeout_s:
            pages = _planned(running)
            for i, page in enumerate(pages):
                for key, planned in page.items():
                    before = owners.get(key)
                    if before is not None and before[0] != i:
                        moving[key] = before
                    now = (i, planned["learned"], planned["closed_step"])
                    owners[key] = now
                    was = moving.get(key)
                    if was is not None and now[0] != was[0] and now[2] >= was[2]:
                        moves.append((key, was[1], now[1]))
                        del moving[key]
            for i, mine in enumerate(pages):
                for theirs in pages[i + 1 :]:
                    if set(mine) & set(theirs):
                        twins.append((f"{len(running)} workers", set(mine) & set(theirs)))
            owner = {k: v for page in pages for k, v in page.items()}
            if not expected or len(owner) > len(expected):
                expected, _ = _truth(kafka_bootstrap, topic_prefix)
            closed = all(owner.get(k, {}).get("closed_step", -1) >= 0 for k in expected)
            once = expected and set(owner) == expected and sum(map(len, pages)) == len(expected)
            if once and closed and (all(pages) or not each_plans):
                return time.monotonic() - started, owner
            time.sleep(0.5)
        raise AssertionError(f"not settled in {timeout_s} s: {[list(p) for p in pages]}")

    def caught_up(running: list[WorkerProcess]) -> None:
        """Poll until every moved key's new owner has closed the step its old owner had (a
        move is recorded then, and only by a poll: one left to the next phase would be
        overwritten by that phase's own move of the key)."""
        deadline = time.monotonic() + 60
        while moving and time.monotonic() < deadline:
            settle(running, timeout_s=60)
            time.sleep(0.5)

    def counted_every_replica(owner: dict[Key, Any]) -> int:
        """Each key's last closed step, as its planner counted it, against the topic once
        it holds two steps more (the simulator publishes its ticks in order)."""
        last = max(page["closed_step"] for page in owner.values())
        deadline = time.monotonic() + 60
        while True:
            _, truth = _truth(kafka_bootstrap, topic_prefix)
            if max(step for _, step in truth) >= last + 2:
                break
            assert time.monotonic() < deadline, "the simulator stopped publishing"
            time.sleep(0.5)
        checked = 0
        for key, page in owner.items():
            step = page["closed_step"]
            if step < 0:
                continue
            assert page["ready"] == truth.get((key, step), {}), (key, step, page)
            checked += 1
        return checked

    try:
        workers[0].start()
        workers[1].start()
        sim.start()
        first, owner = settle(workers[:2], timeout_s=120)
        split = [len(p) for p in _planned(workers[:2])]
        checked = counted_every_replica(owner)
        workers[2].start()
        # settled once the newcomer plans some and every key has closed a step again, read
        # in one poll: a newcomer seen planning only after a settled read taken before the
        # rebalance would leave its keys' move unrecorded
        joined, owner = settle(workers, timeout_s=120, each_plans=True)
        checked += counted_every_replica(owner)
        caught_up(workers)  # the keys the newcomer took count as moved once it closed a step
        handed = len(moves)
        # the newcomer is killed: its keys are replayed from their last memory elsewhere
        workers[2].kill()
        killed, owner = settle(workers[:2], timeout_s=120)
        checked += counted_every_replica(owner)
        caught_up(workers[:2])
        print(
            f"2 workers: every key planned once after {first:.1f} s, split {split}; a third "
            f"joined: settled again after {joined:.1f} s; killed: settled after {killed:.1f} "
            f"s, split {[len(p) for p in _planned(workers[:2])]}; {checked} closed steps "
            f"counted exactly; moves (key, steps learned before, after): {moves}"
        )
        assert twins == [], f"keys planned by two workers at once: {twins[:3]}"
        assert handed > 0 and len(moves) > handed, (moves, moving)
        assert not moving, f"moved keys whose new owner never caught up: {moving}"
        assert [m for m in moves if m[2] < m[1]] == [], "a key forgot what it had learned"
    finally:
        sim.stop()
        for worker in workers:
            worker.stop()
