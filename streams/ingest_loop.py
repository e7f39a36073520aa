"""The ingest hot path: an aiokafka ``getmany`` loop into ClickHouse, beside faust.

faust spends about three event-loop turns and four tasks on every message
(``python -m bench.ingest_throughput``), which capped the worker's ingest at a
few thousand messages a second whatever the message carried. Ingest needs none
of what faust adds (tables, agents, joins): it decodes, dead-letters, writes and
commits. So it runs as its own consumer group, ``<app id>.ingest``, inside the
worker's process (embedded ClickHouse is owned by one process), on raw fetches:

- one batch is decoded (Python) while the previous one is written (chDB parses
  with the GIL released, on the store's thread), so the two overlap on two cores;
- offsets are committed only after the write returns and the dead letters are
  acknowledged, in batch order, at most every ``commit_interval_s`` (and on every
  revocation and stop): at-least-once, and the sink's per-partition watermarks
  and dedup tokens make what a crash replays add nothing;
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
from aiokafka.errors import CommitFailedError, IllegalStateError
from prometheus_client import Counter

from schemas.codec import encode
from schemas.commands import DeadLetter
from schemas.topics import TopicSpec
from streams.ingest import RawMessage, split
from streams.rows import Coordinates
from streams.sink import ClickHouseSink, is_resent

log = logging.getLogger(__name__)


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


class _Revocations(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, loop: IngestLoop) -> None:
        self.loop = loop

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.loop.revoked(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info("ingest assigned %d partitions", len(assigned))


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
    ) -> None:
        self.settings = settings
        self.sink = sink
        self.events = events
        self.dead_letters = dead_letters
        self.errors = errors.labels("ingest")
        self.on_fatal = on_fatal
        self.generation = 0
        self._in_flight: asyncio.Task[None] | None = None
        self._uncommitted: dict[TopicPartition, int] = {}  # written, not yet committed
        self._committed_at = time.monotonic()
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None

    async def run(self) -> None:
        s = self.settings
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=s.bootstrap,
            group_id=s.group_id,
            client_id=s.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=s.batch_max,
            fetch_max_bytes=64 * 1024 * 1024,
            max_partition_fetch_bytes=8 * 1024 * 1024,
            session_timeout_ms=int(s.session_timeout_s * 1000),
            heartbeat_interval_ms=int(min(3.0, s.session_timeout_s / 3) * 1000),
        )
        self._producer = AIOKafkaProducer(
            bootstrap_servers=s.bootstrap, acks="all", enable_idempotence=True, linger_ms=5
        )
        self._consumer.subscribe(list(s.topics), listener=_Revocations(self))
        await self._producer.start()
        await self._consumer.start()
        try:
            while True:
                batch = await self._fetch()
                if batch is None:
                    continue
                await self._settle()  # one write in flight: commits stay in order
                self._in_flight = asyncio.create_task(self._write(batch))
        finally:
            try:
                await self._settle()
                await self._commit()
            finally:
                await self._consumer.stop()
                await self._producer.stop()

    async def _fetch(self) -> _Batch | None:
        assert self._consumer is not None
        s = self.settings
        fetched = await self._consumer.getmany(
            timeout_ms=int(s.batch_within_s * 1000), max_records=s.batch_max
        )
        if not fetched:
            return None
        now = datetime.now(UTC)
        batch = _Batch([], {}, {}, {}, self.generation, now)
        for tp, messages in fetched.items():
            spec = s.topics[tp.topic]
            raw = [
                RawMessage(
                    Coordinates(m.topic, m.partition, m.offset, resent=is_resent(m.headers)),
                    m.key,
                    m.value,
                )
                for m in messages
            ]
            result = split(raw, spec.value_type, now=now)
            batch.records += result.valid
            batch.records += result.dead
            batch.offsets[tp] = messages[-1].offset + 1
            whole = sum(1 for letter, _ in result.dead if letter.source_index is None)
            batch.valid[tp.topic] = batch.valid.get(tp.topic, 0) + len(result.valid)
            batch.refused[tp.topic] = batch.refused.get(tp.topic, 0) + whole
        return batch

    async def _write(self, batch: _Batch) -> None:
        assert self._consumer is not None and self._producer is not None
        try:
            if batch.generation != self.generation:  # fetched before a rebalance
                owned = self._consumer.assignment()
                batch.records = [
                    r for r in batch.records if TopicPartition(r[1].topic, r[1].partition) in owned
                ]
                batch.offsets = {tp: o for tp, o in batch.offsets.items() if tp in owned}
            fresh = await self.sink.unseen(batch.records)  # what a replay re-read is dropped
            sends = []
            for letter, at in fresh:
                if isinstance(letter, DeadLetter):
                    key = (letter.source_key or "").encode()
                    topic = self.settings.dlq_names[at.topic]
                    sends.append(await self._producer.send(topic, encode(letter), key=key))
                    self.dead_letters.labels(at.topic, letter.error_kind).inc()
            await asyncio.gather(*sends)  # dead letters are durable before offsets move
            await self.sink.write_unseen(fresh, now=batch.fetched_at)
        except Exception as exc:
            self.errors.inc()
            self.on_fatal("ingest", exc)
            raise  # on_fatal ends the process; if it ever returns, commit nothing
        for topic, count in batch.valid.items():
            self.events.labels(topic, "valid").inc(count)
            self.events.labels(topic, "dead_letter").inc(batch.refused[topic])
        self._uncommitted.update(batch.offsets)
        if time.monotonic() - self._committed_at >= self.settings.commit_interval_s:
            await self._commit()

    async def _commit(self) -> None:
        assert self._consumer is not None
        offsets, self._uncommitted = self._uncommitted, {}
        self._committed_at = time.monotonic()
        if not offsets:
            return
        try:
            await self._consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError) as exc:
            # the partitions moved; the rows are stored, and the next owner's replay of
            # them is dropped by the watermarks
            log.warning("ingest commit refused after a rebalance: %r", exc)

    async def _settle(self) -> None:
        task, self._in_flight = self._in_flight, None
        if task is not None:
            await task

    async def revoked(self, revoked: list[TopicPartition]) -> None:
        """Finish and commit the write in flight before the partitions go."""
        self.generation += 1
        await self._settle()
        await self._commit()
        self.sink.marks.forget((tp.topic, tp.partition) for tp in revoked)
