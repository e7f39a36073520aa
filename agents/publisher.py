"""Publishes contracts to Kafka without losing them.

aiokafka's defaults (acks=1, no idempotence) can drop or duplicate events on a
leader change; this producer uses ``acks='all'`` and idempotence. ``publish``
returns once the event is queued; ``flush`` returns once every queued event is
acknowledged or, when the broker did not acknowledge it within
``send_timeout_s``, is safe in the disk spool (without a spool, ``flush``
raises). ``drain_spool`` sends spooled segments, oldest first, once the broker
answers again.

aiokafka retries buffered events forever while the broker is away, so a
spooled segment whose events aiokafka still holds is insurance: each record's
own delivery is awaited, the delivered ones are dropped from it, and only the
rest are sent again (never while aiokafka may still deliver the original).
Delivery is at least once: a record whose acknowledgement was lost, or a
segment an agent restarted with, can reach the broker twice. Every record sent
again carries the header ``fleetloop-resent``, so the ingest sink looks those
(and only those) up by ``event_id`` and stores each event once; nothing is lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path

from aiokafka import AIOKafkaProducer
from msgspec import Struct
from prometheus_client import CollectorRegistry, Counter, Gauge

from agents.spool import AppendReport, DiskSpool, SpooledRecord
from schemas.base import Contract
from schemas.codec import encode
from schemas.topics import RESENT_HEADER, TopicSpec

log = logging.getLogger(__name__)


_RESENT = [(RESENT_HEADER, b"1")]


class PublishError(RuntimeError):
    """The broker did not acknowledge some events and there is no spool. Retriable."""

    retriable = True


class PublisherMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.published = Counter(
            "fleetloop_agent_events_published_total",
            "Events acknowledged by the broker",
            ["topic"],
            registry=registry,
        )
        self.errors = Counter(
            "fleetloop_agent_publish_errors_total",
            "Events the broker did not acknowledge",
            ["topic"],
            registry=registry,
        )
        self.bytes = Counter(
            "fleetloop_agent_published_bytes_total",
            "Payload bytes acknowledged",
            ["topic"],
            registry=registry,
        )
        self.spooled = Counter(
            "fleetloop_agent_spooled_events_total",
            "Events written to the disk spool",
            registry=registry,
        )
        self.respooled = Counter(
            "fleetloop_agent_spool_drained_events_total",
            "Spooled events later acknowledged by the broker",
            registry=registry,
        )
        self.spool_dropped = Counter(
            "fleetloop_agent_spool_dropped_events_total",
            "Spooled events dropped because the spool was full (oldest first)",
            registry=registry,
        )
        self.spool_bytes = Gauge(
            "fleetloop_agent_spool_bytes", "Bytes waiting in the disk spool", registry=registry
        )


class KafkaPublisher:
    """An idempotent, acks=all producer of our contracts; use as ``async with``."""

    def __init__(
        self,
        bootstrap: str,
        *,
        topic_prefix: str = "",
        registry: CollectorRegistry | None = None,
        spool: DiskSpool | None = None,
        send_timeout_s: float = 30.0,
        linger_ms: int = 5,
        client_id: str = "fleetloop-agent",
        compression_type: str | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.topic_prefix = topic_prefix
        self.metrics = PublisherMetrics(registry or CollectorRegistry())
        self.spool = spool
        self.send_timeout_s = send_timeout_s
        # the record timestamp: None leaves it to the producer (CreateTime) or the broker
        # (LogAppendTime, production); a simulator passes its own clock, the world's time
        self.clock = clock
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=linger_ms,
            max_batch_size=256 * 1024,
            compression_type=compression_type,
            client_id=client_id,
            request_timeout_ms=int(send_timeout_s * 1000),
        )
        self._pending: list[tuple[SpooledRecord, asyncio.Future[object]]] = []
        # segment -> each of its records' delivery by aiokafka (failed ones are sent again)
        self._insured: dict[Path, list[asyncio.Future[object]]] = {}
        self._per_topic: dict[str, tuple[Counter, Counter]] = {}
        if spool is not None:
            self.metrics.spool_bytes.set(spool.bytes_used())

    async def __aenter__(self) -> KafkaPublisher:
        try:
            await self._producer.start()
        except BaseException:
            await self._producer.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                await self.flush()
        finally:
            try:  # stop() waits for aiokafka's buffer, which an absent broker never drains
                await asyncio.wait_for(self._producer.stop(), timeout=self.send_timeout_s)
            except TimeoutError:
                log.warning(
                    "producer did not stop within %gs; its unacknowledged events are in the spool",
                    self.send_timeout_s,
                )

    def _record(self, spec: TopicSpec, value: Contract | Struct) -> SpooledRecord:
        """The message for ``value``: its topic, keyed by the registry's key fields."""
        return SpooledRecord(self.topic_prefix + spec.name, spec.key_for(value), encode(value))

    async def publish(self, spec: TopicSpec, value: Contract | Struct) -> None:
        """Queue one event on its topic, keyed by the registry's key fields."""
        await self._send(self._record(spec, value))

    async def publish_raw(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Queue raw bytes (tests use this for malformed input)."""
        await self._send(SpooledRecord(self.topic_prefix + topic, key, value))

    def _timestamp_ms(self) -> int | None:
        return None if self.clock is None else int(self.clock().timestamp() * 1000)

    async def _send(self, record: SpooledRecord) -> None:
        future = await self._producer.send(
            record.topic, value=record.value, key=record.key, timestamp_ms=self._timestamp_ms()
        )
        self._pending.append((record, future))

    async def publish_all(self, events: Iterable[tuple[TopicSpec, Contract | Struct]]) -> int:
        count = 0
        for spec, value in events:
            await self.publish(spec, value)
            count += 1
        return count

    async def _settle(self, futures: list[asyncio.Future[object]]) -> list[object]:
        """Outcomes of ``futures``; an exception for any not acknowledged in time.

        aiokafka retries a batch for a known leader forever, so an unreachable
        broker never fails the future: the deadline is ours.
        """
        if not futures:
            return []
        await asyncio.wait(futures, timeout=self.send_timeout_s)
        timeout = TimeoutError(f"no acknowledgement within {self.send_timeout_s:g}s")
        return [
            (f.exception() or f.result()) if f.done() and not f.cancelled() else timeout
            for f in futures
        ]

    async def flush(self) -> int:
        """Wait for every queued event; return how many the broker acknowledged."""
        pending, self._pending = self._pending, []
        results = await self._settle([f for _, f in pending])
        failed: list[SpooledRecord] = []
        in_flight: list[asyncio.Future[object]] = []
        first_error: BaseException | None = None
        for (record, future), outcome in zip(pending, results, strict=True):
            if isinstance(outcome, BaseException):
                self.metrics.errors.labels(record.topic).inc()
                failed.append(record)
                first_error = first_error or outcome
                in_flight.append(future)
            else:
                self._count_acked(record)
        if failed:
            if self.spool is None:
                raise PublishError(
                    f"{len(failed)} of {len(pending)} events not acknowledged: {first_error!r}"
                )
            report = self._spool(failed)
            if report.segment is not None and not all(f.done() for f in in_flight):
                # aiokafka still holds some and will retry them: until it is done with them,
                # the segment is insurance, and then only what it failed to deliver is sent.
                self._insured[report.segment] = in_flight
            log.warning(
                "broker did not acknowledge %d events (%r): spooled", len(failed), first_error
            )
        return len(pending) - len(failed)

    @property
    def backlog(self) -> bool:
        """True while spooled events wait for the broker."""
        return self.spool is not None and bool(self.spool.segments())

    def spool_now(self, events: Iterable[tuple[TopicSpec, Contract | Struct]]) -> int:
        """Spool events without trying the broker (it just failed us); keeps their order."""
        if self.spool is None:
            raise PublishError("no spool configured")
        return self._spool([self._record(spec, value) for spec, value in events]).written

    def _spool(self, records: list[SpooledRecord]) -> AppendReport:
        assert self.spool is not None
        report = self.spool.append(records)
        self.metrics.spooled.inc(report.written)
        self.metrics.spool_dropped.inc(report.dropped_records)
        self.metrics.spool_bytes.set(self.spool.bytes_used())
        return report

    async def drain_spool(self) -> int:
        """Send spooled segments oldest first; stop at the first that fails. Return sent.

        A record aiokafka is still retrying is not sent again (that would only
        queue a copy behind it); draining waits until its retries end, and sends
        only the records they did not deliver, each with the resent header.
        """
        if self.spool is None:
            return 0
        sent = 0
        for segment in self.spool.segments():
            records = self.spool.load(segment)
            deliveries = self._insured.get(segment)
            if deliveries is not None and not all(f.done() for f in deliveries):
                break  # the broker has not answered aiokafka's retries yet
            self._insured.pop(segment, None)
            todo = (
                list(range(len(records)))  # a send that failed outright, or a past life's
                if deliveries is None
                else [i for i, f in enumerate(deliveries) if not _delivered(f)]
            )
            futures = {
                i: await self._producer.send(
                    records[i].topic, value=records[i].value, key=records[i].key,
                    headers=_RESENT, timestamp_ms=self._timestamp_ms(),
                )
                for i in todo
            }  # fmt: skip
            results = await self._settle(list(futures.values()))
            if any(isinstance(r, BaseException) for r in results):
                done = deliveries or []
                self._insured[segment] = [futures.get(i) or done[i] for i in range(len(records))]
                break  # keep the segment; what aiokafka does not deliver is sent again
            self.spool.remove(segment)
            self._count_drained(records)
            sent += len(records)
        self.metrics.spool_bytes.set(self.spool.bytes_used())
        return sent

    def _count_acked(self, record: SpooledRecord) -> None:
        children = self._per_topic.get(record.topic)
        if children is None:  # labelled children are cached: .labels() costs ~4 us a call
            children = self._per_topic[record.topic] = (
                self.metrics.published.labels(record.topic),
                self.metrics.bytes.labels(record.topic),
            )
        children[0].inc()
        children[1].inc(len(record.value))

    def _count_drained(self, records: list[SpooledRecord]) -> None:
        for record in records:
            self._count_acked(record)
        self.metrics.respooled.inc(len(records))


def _delivered(future: asyncio.Future[object]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None
