"""Publishes contracts to Kafka without losing them.

aiokafka's defaults (acks=1, no idempotence) can drop or duplicate events on a
leader change; this producer uses ``acks='all'`` and idempotence. ``publish``
returns once the event is queued; ``flush`` returns once every queued event is
acknowledged by the broker, raising if any failed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from aiokafka import AIOKafkaProducer
from prometheus_client import CollectorRegistry, Counter

from schemas.base import Contract
from schemas.codec import encode
from schemas.topics import TopicSpec


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


class KafkaPublisher:
    """An idempotent, acks=all producer of our contracts; use as ``async with``."""

    def __init__(
        self,
        bootstrap: str,
        *,
        topic_prefix: str = "",
        registry: CollectorRegistry | None = None,
        linger_ms: int = 5,
        client_id: str = "fleetloop-agent",
        compression_type: str | None = None,
    ) -> None:
        self.topic_prefix = topic_prefix
        self.metrics = PublisherMetrics(registry or CollectorRegistry())
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=linger_ms,
            max_batch_size=256 * 1024,
            compression_type=compression_type,
            client_id=client_id,
        )
        self._pending: list[tuple[str, int, asyncio.Future[object]]] = []

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
            await self._producer.stop()

    async def publish(self, spec: TopicSpec, value: Contract) -> None:
        """Queue one event on its topic, keyed by the registry's key fields."""
        await self.publish_raw(spec.name, spec.key_for(value), encode(value))

    async def publish_raw(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Queue raw bytes (tests use this for malformed input)."""
        name = self.topic_prefix + topic
        future = await self._producer.send(name, value=value, key=key)
        self._pending.append((name, len(value), future))

    async def publish_all(self, events: Iterable[tuple[TopicSpec, Contract]]) -> int:
        count = 0
        for spec, value in events:
            await self.publish(spec, value)
            count += 1
        return count

    async def flush(self) -> int:
        """Wait for every queued event; return how many were acknowledged."""
        pending, self._pending = self._pending, []
        results = await asyncio.gather(*(f for _, _, f in pending), return_exceptions=True)
        failures: list[BaseException] = []
        for (topic, size, _), outcome in zip(pending, results, strict=True):
            if isinstance(outcome, BaseException):
                self.metrics.errors.labels(topic).inc()
                failures.append(outcome)
            else:
                self.metrics.published.labels(topic).inc()
                self.metrics.bytes.labels(topic).inc(size)
        if failures:
            raise RuntimeError(
                f"{len(failures)} of {len(pending)} events not acknowledged: {failures[0]!r}"
            )
        return len(pending)
