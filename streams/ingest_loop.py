"""The ingest hot path: an aiokafka ``getmany`` loop into ClickHouse, beside faust.

faust spends about three event-loop turns and four tasks on every message
(``python -m bench.ingest_throughput``), which capped the worker's ingest at a
few thousand messages a second whatever the message carried. Ingest needs none
of what faust adds (tables, agents, joins): it decodes, dead-letters, writes and
commits. So it runs as its own consumer group, ``<app id>.ingest``, inside the
worker's process (embedded ClickHouse is owned by one process), on raw fetches:

- one batch is decoded and encoded for ClickHouse (Python) while the previous
  one is inserted (chDB parses with the GIL released, on the store's thread), so
  the two overlap on two cores;
- the batches that wait while a write runs go in together at the next, one
  insert per table (group commit): an insert costs ClickHouse a part per table
  and view whatever its size (about 30 ms for an envelope table and its views
  on the development machine, as much as 10,000 rows), so a writer that falls
  behind writes fewer, bigger parts, while a quiet one writes each batch as soon
  as it is fetched;
- offsets are committed only after the write returns and the dead letters are
  acknowledged, in batch order, at most every ``commit_interval_s`` (and on every
  revocation and stop): at-least-once, and the sink's per-partition watermarks
  and dedup tokens make what a crash replays add nothing;
- on an assignment the new partitions' watermarks are read from ClickHouse, one
  query per table, before their first batch (read then, a partition's first
  batch would wait for its query behind the insert in flight);
- on a revocation the write in flight finishes and commits before the partitions
  go, records fetched for partitions this process no longer owns are not
  written, and the sink forgets their watermarks (the next owner reads them from
  ClickHouse);
- a write that fails after the sink's retries ends the process (``on_fatal``)
  rather than skip rows: the restarted worker reads from the last commit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from prometheus_client import Counter, Gauge

from schemas.codec import encode
from schemas.commands import DeadLetter
from schemas.topics import TopicSpec
from streams.ingest import RawMessage, split
from streams.role_loop import commit, raw_consumer
from streams.rows import Coordinates
from streams.sink import ClickHouseSink, Insert, combined, is_resent

log = logging.getLogger(__name__)


QUEUE_DEPTH = 2
"""Batches decoded and encoded ahead of the one being written: enough to keep chDB busy
while the next is fetched, few enough that a revocation waits for little."""


@dataclass(frozen=True, slots=True)
class IngestSettings:
    bootstrap: str
    group_id: str
    topics: Mapping[str, TopicSpec]  # topic name (with any prefix) -> its spec
    dlq_names: Mapping[str, str]  # topic name -> its dead letter topic's name
    batch_max: int = 10_000
    batch_within_s: float = 1.0
    session_timeout_s: float = 10.0
    commit_interval_s: float = 2.8


@dataclass(slots=True)
class _Batch:
    records: list[tuple[Any, Coordinates]]
    offsets: dict[TopicPartition, int]  # next offset to commit per partition
    valid: dict[str, int]  # per topic: messages kept (an envelope with a bad sample too)
    refused: dict[str, int]  # per topic: messages refused whole
    generation: int  # the assignment it was fetched under
    fetched_at: datetime
    messages: int = 0  # Kafka messages it holds, envelopes and dead letters alike


@dataclass(slots=True)
class _Ready:
    """A batch with its dead letters and its inserts encoded, waiting for its turn."""

    batch: _Batch
    letters: list[tuple[DeadLetter, Coordinates]]
    inserts: list[Insert]
    generation: int


def _add(into: dict[str, int], counts: Mapping[str, int]) -> None:
    for topic, count in counts.items():
        into[topic] = into.get(topic, 0) + count


def _together(waiting: list[_Ready]) -> _Ready:
    """Prepared batches (in fetch order, of one generation) as one: their records, the
    last offset of each partition, their counts, one insert per table."""
    if len(waiting) == 1:
        return waiting[0]
    first = waiting[0].batch
    batch = _Batch([], {}, {}, {}, first.generation, first.fetched_at)
    for ready in waiting:
        batch.records += ready.batch.records
        batch.offsets.update(ready.batch.offsets)
        batch.messages += ready.batch.messages
        _add(batch.valid, ready.batch.valid)
        _add(batch.refused, ready.batch.refused)
    letters = [letter for ready in waiting for letter in ready.letters]
    inserts = combined([ready.inserts for ready in waiting])
    return _Ready(batch, letters, inserts, waiting[0].generation)


class _Revocations(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, loop: IngestLoop) -> None:
        self.loop = loop

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.loop.revoked(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info("ingest assigned %d partitions", len(assigned))
        await self.loop.assigned(assigned)


class IngestLoop:
    """Consume every ingested topic, write it to ClickHouse, commit after the write."""

    def __init__(
        self,
        settings: IngestSettings,
        sink: ClickHouseSink,
        *,
        events: Counter,
        dead_letters: Counter,
        errors: Counter,
        on_fatal: Callable[[str, BaseException], None],
        uncommitted: Gauge | None = None,
    ) -> None:
        self.settings = settings
        self.uncommitted = uncommitted  # messages written whose offsets are not committed
        self.sink = sink
        self.events = events
        self.dead_letters = dead_letters
        self.errors = errors.labels("ingest")
        self.on_fatal = on_fatal
        self.generation = 0
        self._queue: asyncio.Queue[_Ready] = asyncio.Queue(maxsize=QUEUE_DEPTH)
        self._writer: asyncio.Task[None] | None = None
        self._uncommitted: dict[TopicPartition, int] = {}  # written, not yet committed
        self._committed_at = time.monotonic()
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None

    async def run(self) -> None:
        s = self.settings
        self._consumer = raw_consumer(
            s.bootstrap, s.group_id, batch_max=s.batch_max, session_timeout_s=s.session_timeout_s
        )
        self._producer = AIOKafkaProducer(
            bootstrap_servers=s.bootstrap, acks="all", enable_idempotence=True, linger_ms=5
        )
        self._consumer.subscribe(list(s.topics), listener=_Revocations(self))
        await self._producer.start()
        await self._consumer.start()
        self._writer = asyncio.create_task(self._write_in_order())
        try:
            while True:
                batch = await self._fetch(s.batch_within_s)
                if batch is None:  # idle: what is written is committed, not left for later
                    if self._uncommitted and self._queue.empty():
                        await self._commit()
                    continue
                ready = await self._prepare(batch)  # Python, while chDB parses the last ones
                put = asyncio.ensure_future(self._queue.put(ready))
                await asyncio.wait({put, self._writer}, return_when=asyncio.FIRST_COMPLETED)
                if self._writer.done():  # it failed (on_fatal returned): never go on past it
                    put.cancel()
                    self._writer.result()
        finally:
            try:
                await self._settle()
                await self._commit()
            finally:
                self._writer.cancel()
                await asyncio.gather(self._writer, return_exceptions=True)
                await self._consumer.stop()
                await self._producer.stop()

    async def _write_in_order(self) -> None:
        """Write the prepared batches one after another (their commits stay in order),
        every batch waiting by then in the same write."""
        while True:
            waiting = [await self._queue.get()]
            while not self._queue.empty():
                waiting.append(self._queue.get_nowait())
            try:
                if all(ready.generation == self.generation for ready in waiting):
                    await self._write(_together(waiting))
                else:  # a rebalance since: each is filtered to what we own, in order
                    for ready in waiting:
                        await self._write(ready)
            finally:
                for _ in waiting:
                    self._queue.task_done()

    async def _fetch(self, within_s: float) -> _Batch | None:
        assert self._consumer is not None
        s = self.settings
        fetched = await self._consumer.getmany(
            timeout_ms=int(within_s * 1000), max_records=s.batch_max
        )
        if not fetched:
            return None
        now = datetime.now(UTC)
        batch = _Batch([], {}, {}, {}, self.generation, now)
        for tp, messages in fetched.items():
            spec = s.topics[tp.topic]
            topic, partition = tp.topic, tp.partition
            raw = [
                RawMessage(
                    Coordinates(topic, partition, m.offset, is_resent(m.headers)),
                    m.key,
                    m.value,
                )
                for m in messages
            ]
            result = split(raw, spec.value_type, now=now)
            batch.records += result.valid
            batch.records += result.dead
            batch.offsets[tp] = messages[-1].offset + 1
            batch.messages += len(messages)
            whole = sum(1 for letter, _ in result.dead if letter.source_index is None)
            _add(batch.valid, {tp.topic: len(result.valid)})
            _add(batch.refused, {tp.topic: whole})
        return batch

    async def _prepare(self, batch: _Batch, *, in_flight: bool = True) -> _Ready:
        """Drop what this process no longer owns or ClickHouse already holds; encode the rest.
        A batch with records an agent sent again waits for the write in flight first
        (``in_flight``): the copies are looked up in ClickHouse, so what they copy must be
        there."""
        assert self._consumer is not None
        if in_flight and any(at.resent for _, at in batch.records):
            await self._settle()
        generation = self.generation
        if batch.generation != generation:  # fetched before a rebalance
            owned = self._consumer.assignment()
            batch.records = [
                r for r in batch.records if TopicPartition(r[1].topic, r[1].partition) in owned
            ]
            batch.offsets = {tp: o for tp, o in batch.offsets.items() if tp in owned}
        fresh = await self.sink.unseen(batch.records)  # what a replay re-read is dropped
        letters = [(letter, at) for letter, at in fresh if isinstance(letter, DeadLetter)]
        inserts = self.sink.prepare(fresh, now=batch.fetched_at)
        return _Ready(batch, letters, inserts, generation)

    async def _write(self, ready: _Ready) -> None:
        assert self._producer is not None
        if ready.generation != self.generation:  # a rebalance since it was encoded: again
            ready.batch.generation = -1
            ready = await self._prepare(ready.batch, in_flight=False)  # we are the one
        batch = ready.batch
        try:
            sends = []
            for letter, at in ready.letters:
                key = (letter.source_key or "").encode()
                topic = self.settings.dlq_names[at.topic]
                sends.append(await self._producer.send(topic, encode(letter), key=key))
                self.dead_letters.labels(at.topic, letter.error_kind).inc()
            await asyncio.gather(*sends)  # dead letters are durable before offsets move
            await self.sink.insert(ready.inserts)
        except Exception as exc:
            self.errors.inc()
            self.on_fatal("ingest", exc)
            raise  # on_fatal ends the process; if it ever returns, commit nothing
        for topic, count in batch.valid.items():
            self.events.labels(topic, "valid").inc(count)
            self.events.labels(topic, "dead_letter").inc(batch.refused[topic])
        self._uncommitted.update(batch.offsets)
        if self.uncommitted is not None:
            self.uncommitted.inc(batch.messages)
        if time.monotonic() - self._committed_at >= self.settings.commit_interval_s:
            await self._commit()

    async def _commit(self) -> None:
        assert self._consumer is not None
        offsets, self._uncommitted = self._uncommitted, {}
        self._committed_at = time.monotonic()
        if not offsets:
            return
        # refused after a rebalance: the rows are stored, and the next owner's replay of
        # them is dropped by the watermarks
        kept = await commit(self._consumer, offsets, "ingest")
        for tp, offset in kept.items():
            self._uncommitted[tp] = max(offset, self._uncommitted.get(tp, offset))
        if self.uncommitted is not None and not kept:
            self.uncommitted.set(0)  # one the broker did not answer leaves them counted

    async def _settle(self) -> None:
        """Wait until every prepared batch is written (or the writer failed)."""
        writer = self._writer
        if writer is None or writer.done():
            if writer is not None and not writer.cancelled():
                writer.result()
            return
        drained = asyncio.ensure_future(self._queue.join())
        await asyncio.wait({drained, writer}, return_when=asyncio.FIRST_COMPLETED)
        if not drained.done():
            drained.cancel()
            writer.result()

    async def assigned(self, assigned: list[TopicPartition]) -> None:
        """Read the new partitions' watermarks before their first batch. One that fails is
        read again when its first batch is written (:meth:`ClickHouseSink.unseen`)."""
        topics = self.settings.topics
        try:
            await self.sink.load_marks(
                (topics[tp.topic].value_type, tp.topic, tp.partition) for tp in assigned
            )
        except Exception:
            log.warning("ingest could not read the watermarks on assignment", exc_info=True)

    async def revoked(self, revoked: list[TopicPartition]) -> None:
        """Write and commit every prepared batch before the partitions go."""
        await self._settle()  # still ours until this returns: written and committed
        await self._commit()
        self.generation += 1  # what was fetched before is filtered to what we own after
        self.sink.marks.forget((tp.topic, tp.partition) for tp in revoked)
