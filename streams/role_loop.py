"""The controller roles' hot paths on raw fetches, beside faust, as ingest runs.

faust spends about three event-loop turns and four tasks on every message
(``python -m bench.faust_noop``); at the design point the roles read about
37,000 envelopes a second, and that overhead, not the detectors, was most of
their cost (``python -m bench.design_point``). A role's hot processor (the one
that reads telemetry) therefore runs as a :class:`RoleLoop`: its own consumer
group, ``<app id>.<processor>`` (:func:`role_group`), on ``getmany`` batches,
in the worker's process and event loop. What stays on faust reads little (the
verdicts, the dead-letter census) or is not a stream (timers, pages, the
producer the outputs go through).

Guarantees, the same as the faust agents they replace, made explicit:

- at least once: a batch's offsets are committed only after its handler
  returned and the producer flushed what it sent (the outputs are on the
  broker before the input is marked read), at most every ``commit_interval_s``
  and on every revocation, idle fetch and stop;
- a handler that raises ends the process (``on_fatal``): the restarted worker
  reads from the last commit instead of going on past a batch it never finished;
- on a revocation the batch in hand finishes, its outputs are flushed and its
  offsets committed before the partitions go, then the processor's own hook
  runs (a detector hands its devices' memory on); a batch fetched before the
  revocation and handled after it keeps only the partitions still owned, so no
  device is judged by two processes;
- partitions that arrive go to the processor's own hook before anything is
  fetched from them (Kafka runs every member's revocation first), which may
  read back what their previous owner kept and seek them to replay from it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from schemas.codec import DecodeError, decode

log = logging.getLogger(__name__)

Record = Any
"""An aiokafka ``ConsumerRecord``: ``topic``, ``partition``, ``offset``, ``timestamp`` (ms,
the broker's append time on our topics), ``key``, ``value``."""

T = TypeVar("T")

Handler = Callable[[list[Record]], Awaitable[None]]
Revoked = Callable[[set[TopicPartition]], Awaitable[None]]
Assigned = Callable[[AIOKafkaConsumer, set[TopicPartition]], Awaitable[None]]


def decode_own(record: Record, value_type: type[T], unreadable: Callable[[], None]) -> T | None:
    """A record of one of the pipeline's own topics, decoded; or None, counted
    (``unreadable``) and logged with its coordinates: its stages write these, so only a
    contract version moved between them makes one unreadable, and it must not pass
    silently."""
    try:
        return decode(record.value, value_type)
    except DecodeError as exc:
        unreadable()
        log.warning("unreadable %s at %s/%d@%d: %s", value_type.__name__,
                    record.topic, record.partition, record.offset, exc)  # fmt: skip
        return None


def role_group(app_id: str, processor: str) -> str:
    """The consumer group of a role's hot processor in the worker ``app_id``."""
    return f"{app_id}.{processor}"


def raw_consumer(
    bootstrap: str,
    group_id: str,
    *,
    batch_max: int,
    session_timeout_s: float,
    co_partitioned: bool = False,
) -> AIOKafkaConsumer:
    """A consumer for a raw-fetch loop: offsets committed by hand, large fetches.
    ``co_partitioned``: the same partition number of every topic it reads goes to the same
    member (Kafka's range assignment; topics with one key and one partition count)."""
    strategy = RangePartitionAssignor if co_partitioned else RoundRobinPartitionAssignor
    return AIOKafkaConsumer(
        partition_assignment_strategy=(strategy,),
        bootstrap_servers=bootstrap,
        group_id=group_id,
        client_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=batch_max,
        fetch_max_bytes=64 * 1024 * 1024,
        max_partition_fetch_bytes=8 * 1024 * 1024,
        session_timeout_ms=int(session_timeout_s * 1000),
        heartbeat_interval_ms=int(min(3.0, session_timeout_s / 3) * 1000),
    )


async def commit(
    consumer: AIOKafkaConsumer, offsets: dict[TopicPartition, int], name: str
) -> dict[TopicPartition, int]:
    """Commit ``offsets``; return those to carry into the next commit (the broker was away).
    A commit refused after a rebalance is dropped: the partitions moved, and their next
    owner reads those records again (at least once)."""
    try:
        await consumer.commit(offsets)
    except (CommitFailedError, IllegalStateError) as exc:
        log.warning("%s commit refused after a rebalance: %r", name, exc)
    except KafkaError as exc:
        log.warning("%s commit failed, kept for the next one: %r", name, exc)
        return offsets
    return {}


BATCH_MAX = 1_000
"""Messages per fetch: about 8,000 samples, a quarter of a second of the detector's work.
A batch is handled without a break, so this bounds what a message fetched with it can
wait behind (its outputs go out as it is handled); per-fetch costs are small beside it."""


@dataclass(frozen=True, slots=True)
class LoopSettings:
    bootstrap: str
    group_id: str
    topics: tuple[str, ...]
    batch_max: int = BATCH_MAX
    batch_within_s: float = 1.0
    session_timeout_s: float = 10.0
    commit_interval_s: float = 2.8
    co_partitioned: bool = False  # see raw_consumer


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, loop: RoleLoop) -> None:
        self.loop = loop

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.loop.revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info("%s assigned %d partitions", self.loop.name, len(assigned))
        await self.loop.assigned(set(assigned))


class RoleLoop:
    """Fetch, hand each batch to ``handle``, flush, commit; see the module's guarantees."""

    def __init__(
        self,
        name: str,
        settings: LoopSettings,
        handle: Handler,
        *,
        flush: Callable[[], Awaitable[Any]],
        on_revoked: Revoked | None = None,
        on_assigned: Assigned | None = None,
    ) -> None:
        self.name = name
        self.settings = settings
        self.handle = handle
        self.flush = flush
        self.on_revoked = on_revoked
        self.on_assigned = on_assigned
        self.generation = 0  # bumped by every revocation
        self._lock = asyncio.Lock()  # a batch in hand, or a revocation: one at a time
        self._uncommitted: dict[TopicPartition, int] = {}
        self._committed_at = time.monotonic()
        self._consumer: AIOKafkaConsumer | None = None

    async def run(self) -> None:
        s = self.settings
        self._consumer = consumer = raw_consumer(
            s.bootstrap, s.group_id, batch_max=s.batch_max,
            session_timeout_s=s.session_timeout_s, co_partitioned=s.co_partitioned,
        )  # fmt: skip
        consumer.subscribe(list(s.topics), listener=_Listener(self))
        await consumer.start()
        try:
            while True:
                generation = self.generation
                fetched = await consumer.getmany(
                    timeout_ms=int(s.batch_within_s * 1000), max_records=s.batch_max
                )
                async with self._lock:
                    if fetched and generation != self.generation:  # a revocation in between
                        owned = consumer.assignment()
                        fetched = {tp: rs for tp, rs in fetched.items() if tp in owned}
                    if fetched:
                        await self.handle([r for records in fetched.values() for r in records])
                        for tp, records in fetched.items():
                            self._uncommitted[tp] = records[-1].offset + 1
                    due = time.monotonic() - self._committed_at >= s.commit_interval_s
                    if self._uncommitted and (due or not fetched):
                        await self._commit()
        finally:
            try:
                async with self._lock:
                    await self._commit()
            finally:
                await consumer.stop()

    async def revoked(self, revoked: set[TopicPartition]) -> None:
        """Finish the batch in hand, make its outputs and offsets durable, then hand over."""
        async with self._lock:
            await self._commit()
            self.generation += 1
            if self.on_revoked is not None:
                await self.on_revoked(revoked)

    async def assigned(self, assigned: set[TopicPartition]) -> None:
        """Partitions arrive (every previous owner has handed them over): the processor's
        own hook runs before anything is fetched from them, and may seek them (to replay
        from the memory it read back)."""
        if self.on_assigned is not None and self._consumer is not None:
            async with self._lock:
                await self.on_assigned(self._consumer, assigned)

    async def drained(self, partitions: Iterable[TopicPartition]) -> set[TopicPartition]:
        """Of ``partitions``, the ones this loop owns and has read to their end on the broker
        now (its position at the log end offset): nothing appended there is unread. Called
        from within a batch, whose records are all handed over by then."""
        consumer = self._consumer
        if consumer is None:
            return set()
        owned = consumer.assignment()
        asked = [tp for tp in partitions if tp in owned]
        if not asked:
            return set()
        try:
            ends = await consumer.end_offsets(asked)
            return {tp for tp in asked if await consumer.position(tp) >= ends[tp]}
        except (KafkaError, IllegalStateError) as exc:  # unknown: as if not asked
            log.warning("%s: log end offsets of %d partitions unknown: %r", self.name,
                        len(asked), exc)  # fmt: skip
            return set()

    def paused(self) -> asyncio.Lock:
        """Held, no batch is handled nor any partition handed over (``async with``)."""
        return self._lock

    async def _commit(self) -> None:
        assert self._consumer is not None
        offsets, self._uncommitted = self._uncommitted, {}
        self._committed_at = time.monotonic()
        if not offsets:
            return
        await self.flush()  # what the batches sent is on the broker before they count as read
        kept = await commit(self._consumer, offsets, self.name)
        for tp, offset in kept.items():
            self._uncommitted[tp] = max(offset, self._uncommitted.get(tp, offset))


class RoleLoops:
    """The role loops a worker runs: each registered as a faust task (so it starts and stops
    with the worker, on its event loop) under its own consumer group."""

    def __init__(
        self,
        app: Any,
        *,
        app_id: str,
        topic_prefix: str,
        bootstrap: str,
        session_timeout_s: float,
        commit_interval_s: float,
        on_fatal: Callable[[str, BaseException], None],
    ) -> None:
        self.app = app
        self.app_id = app_id
        self.topic_prefix = topic_prefix
        self.bootstrap = bootstrap
        self.session_timeout_s = session_timeout_s
        self.commit_interval_s = commit_interval_s
        self.on_fatal = on_fatal
        self.groups: dict[str, list[Any]] = {}  # group -> the topic specs it reads

    def add(
        self,
        processor: str,
        specs: Sequence[Any],
        handle: Handler,
        *,
        batch_within_s: float,
        on_revoked: Revoked | None = None,
        on_assigned: Assigned | None = None,
        co_partitioned: bool = False,
    ) -> RoleLoop:
        """Run ``handle`` over the topics of ``specs`` (with the prefix) as ``processor``;
        ``co_partitioned`` for topics that share a key and a partition count, whose
        partitions must meet in one process (see :func:`raw_consumer`)."""
        group = role_group(self.app_id, processor)
        settings = LoopSettings(
            bootstrap=self.bootstrap,
            group_id=group,
            topics=tuple(self.topic_prefix + spec.name for spec in specs),
            batch_within_s=batch_within_s,
            session_timeout_s=self.session_timeout_s,
            commit_interval_s=self.commit_interval_s,
            co_partitioned=co_partitioned,
        )
        loop = RoleLoop(
            processor, settings, handle, flush=self._flush, on_revoked=on_revoked,
            on_assigned=on_assigned,
        )  # fmt: skip
        self.groups[group] = list(specs)
        on_fatal = self.on_fatal

        async def run() -> None:
            try:
                await loop.run()
            except asyncio.CancelledError:
                raise  # the worker is stopping: the batch in hand was finished and committed
            except Exception as exc:  # never go on past a batch the processor did not finish
                on_fatal(processor, exc)
                raise

        run.__name__ = run.__qualname__ = processor  # what faust logs
        self.app.task(run)
        return loop

    async def _flush(self) -> None:
        await self.app.producer.flush()
