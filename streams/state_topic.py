"""A compacted topic that holds a processor's durable state, one record per key.

:meth:`StateTopic.write` sends records and returns once the broker has every
one of them (``acks=all``, the worker's producer), so a caller that writes
before it acts never acts on state a crash could lose. :meth:`StateTopic.load`
reads the topic from its beginning to the end offset it finds when it starts
(the newest record per key; a null value deletes the key), with a consumer of
its own outside every group, so reading it moves no committed offset.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TypeVar

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition

from schemas.base import Contract
from schemas.codec import decode, encode
from schemas.topics import STATE_RECORD_BYTES

T = TypeVar("T", bound=Contract)


def bootstrap_of(app: faust.App) -> str:
    """The app's brokers as ``host:port,...`` (what a plain Kafka client wants)."""
    return ",".join(f"{url.host}:{url.port or 9092}" for url in app.conf.broker)


class StateTopic:
    """Reads and writes one compacted state topic."""

    def __init__(self, app: faust.App, name: str, *, partitions: int) -> None:
        self.name = name
        self.partitions = partitions
        self.app = app
        self.topic = app.topic(name, value_type=bytes, key_type=bytes)

    async def write(
        self, records: Iterable[tuple[str, Contract | None]], *, partition: int | None = None
    ) -> int:
        """Send each (key, value or ``None`` to delete it), to ``partition`` when given (else
        the key's); return when all are on the broker."""
        sent = []
        for key, value in records:
            payload = None if value is None else encode(value)
            sent.append(await self.topic.send(key=key.encode(), value=payload, partition=partition))
        await asyncio.gather(*sent)
        return len(sent)

    async def load(
        self, value_type: type[T], *, only: Iterable[int] | None = None, timeout_s: float = 60.0
    ) -> dict[str, T]:
        """Every key's newest value now on the topic (deleted keys left out), in the
        partitions ``only`` names when given. A record that does not decode raises: a
        process must not decide on state it could not read."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap_of(self.app),
            enable_auto_commit=False,
            isolation_level="read_committed",
            # a fetch returns whole batches: room for the largest record a state topic takes
            max_partition_fetch_bytes=STATE_RECORD_BYTES + 1024 * 1024,
        )
        await consumer.start()
        out: dict[str, T] = {}
        try:
            wanted = range(self.partitions) if only is None else sorted(set(only))
            tps = [TopicPartition(self.name, p) for p in wanted]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            end = await consumer.end_offsets(tps)
            async with asyncio.timeout(timeout_s):
                while any([await consumer.position(tp) < end[tp] for tp in tps]):
                    batches = await consumer.getmany(*tps, timeout_ms=500, max_records=10_000)
                    for records in batches.values():
                        for r in records:
                            key = bytes(r.key or b"").decode()
                            if r.value is None:
                                out.pop(key, None)
                            else:
                                out[key] = decode(
                                    bytes(r.value), value_type, max_bytes=STATE_RECORD_BYTES
                                )
        finally:
            await consumer.stop()
        return out
