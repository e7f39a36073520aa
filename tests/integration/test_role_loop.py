"""A role loop on the real broker: offsets move only after the handler returned and the
outputs were flushed; a handler that fails leaves its batch uncommitted."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from fleetloop.topics_admin import ensure_topics
from schemas.topics import PDU
from streams.role_loop import LoopSettings, RoleLoop

MESSAGES = 300


async def _produce(bootstrap: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(MESSAGES):
            await producer.send(topic, f"m{i}".encode(), key=f"k{i % 7}".encode())
        await producer.flush()
    finally:
        await producer.stop()


async def _committed(bootstrap: str, group: str, topic: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PDU.partitions)]
        offsets = await admin.list_consumer_group_offsets(group, partitions=tps)
        return sum(max(0, meta.offset) for meta in offsets.values())
    finally:
        await admin.close()


def _settings(bootstrap: str, group: str, topic: str) -> LoopSettings:
    return LoopSettings(
        bootstrap=bootstrap, group_id=group, topics=(topic,), batch_max=50, batch_within_s=0.2,
        session_timeout_s=6.0, commit_interval_s=0.0,
    )  # fmt: skip


def test_offsets_follow_the_handler_and_the_flush(kafka_bootstrap: str, topic_prefix: str) -> None:
    topic = topic_prefix + PDU.name
    group = f"{topic_prefix}role-loop"
    asyncio.run(ensure_topics(kafka_bootstrap, prefix=topic_prefix, specs=(PDU,)))
    asyncio.run(_produce(kafka_bootstrap, topic))
    seen: list[bytes] = []
    events: list[str] = []

    async def handle(records: list[object]) -> None:
        seen.extend(r.value for r in records)  # type: ignore[attr-defined]
        events.append("handled")

    async def flush() -> None:
        events.append("flushed")

    async def run() -> int:
        loop = RoleLoop("test.ok", _settings(kafka_bootstrap, group, topic), handle, flush=flush)
        task = asyncio.create_task(loop.run())
        deadline = asyncio.get_running_loop().time() + 60
        while len(seen) < MESSAGES:  # a condition with a deadline, polled
            assert not task.done(), task
            assert asyncio.get_running_loop().time() < deadline, f"{len(seen)} of {MESSAGES}"
            await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return await _committed(kafka_bootstrap, group, topic)

    committed = asyncio.run(run())
    assert sorted(seen) == sorted(f"m{i}".encode() for i in range(MESSAGES))  # each once
    assert committed == MESSAGES
    assert events[0] == "handled" and "flushed" in events  # a commit follows a flush


def test_a_failing_handler_ends_the_loop_and_commits_nothing_of_its_batch(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic = topic_prefix + PDU.name
    group = f"{topic_prefix}role-loop-fails"
    asyncio.run(ensure_topics(kafka_bootstrap, prefix=topic_prefix, specs=(PDU,)))
    asyncio.run(_produce(kafka_bootstrap, topic))
    handled: list[int] = []

    async def handle(records: list[object]) -> None:
        if handled:  # the second batch fails
            raise RuntimeError("the detector broke")
        handled.append(len(records))

    async def flush() -> None:
        return None

    async def run() -> tuple[BaseException | None, int]:
        loop = RoleLoop("test.fails", _settings(kafka_bootstrap, group, topic), handle, flush=flush)
        try:
            await asyncio.wait_for(loop.run(), timeout=60)
        except RuntimeError as exc:
            return exc, await _committed(kafka_bootstrap, group, topic)
        return None, await _committed(kafka_bootstrap, group, topic)

    error, committed = asyncio.run(run())
    assert isinstance(error, RuntimeError)
    assert committed == handled[0] < MESSAGES  # the first batch, and nothing of the one that failed


def test_drained_names_only_partitions_read_to_their_end(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """The broker's log end offsets against the loop's position, asked from within a batch:
    a partition is drained only once every record appended to it was handed over (what
    tells a node alone on its partition and silent from one whose records are unread)."""
    topic = topic_prefix + PDU.name
    asyncio.run(ensure_topics(kafka_bootstrap, prefix=topic_prefix, specs=(PDU,)))
    asyncio.run(_produce(kafka_bootstrap, topic))
    every = [TopicPartition(topic, p) for p in range(PDU.partitions)]
    handed: dict[int, int] = {}
    calls: list[tuple[dict[int, int], set[int]]] = []  # (handed so far, drained) per batch
    holder: list[RoleLoop] = []

    async def handle(records: list[object]) -> None:
        for r in records:
            p = r.partition  # type: ignore[attr-defined]
            handed[p] = handed.get(p, 0) + 1
        drained = await holder[0].drained(every)
        calls.append((dict(handed), {tp.partition for tp in drained}))

    async def flush() -> None:
        return None

    async def run() -> None:
        settings = _settings(kafka_bootstrap, f"{topic_prefix}drained", topic)
        holder.append(RoleLoop("test.drained", settings, handle, flush=flush))
        task = asyncio.create_task(holder[0].run())
        deadline = asyncio.get_running_loop().time() + 60
        while sum(handed.values()) < MESSAGES:
            assert not task.done(), task
            assert asyncio.get_running_loop().time() < deadline, f"{handed} of {MESSAGES}"
            await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())
    total = calls[-1][0]
    assert calls[-1][1] == set(range(PDU.partitions))  # all read: every partition drained
    for so_far, drained in calls:
        for p in drained:
            assert so_far.get(p, 0) == total.get(p, 0), (p, so_far, total)
    # batches of 50 over 300 records: some batch left a partition with records unread
    assert any(so_far.get(p, 0) < n for so_far, _ in calls for p, n in total.items())
