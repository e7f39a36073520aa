"""Consumer lag of the worker's group: messages on the broker not yet committed.

Read from the broker, not from faust's internals: the group's committed
offsets (admin API) against each partition's end offset. A partition the
group has never committed counts from its beginning offset, so a worker that
has not started reading shows its whole backlog.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient


def lag_by_topic(
    end: Mapping[TopicPartition, int],
    committed: Mapping[TopicPartition, int],
    beginning: Mapping[TopicPartition, int],
) -> dict[str, int]:
    """Sum over partitions of ``end - committed`` (``beginning`` when never committed)."""
    out: dict[str, int] = {}
    for tp, end_offset in end.items():
        done = committed.get(tp, beginning.get(tp, 0))
        out[tp.topic] = out.get(tp.topic, 0) + max(0, end_offset - done)
    return out


async def fetch_lag(bootstrap: str, group_id: str, topics: Iterable[str]) -> dict[str, int]:
    """Lag per topic of ``group_id`` on ``topics``, from the broker."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id=f"{group_id}-lag")
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, client_id=f"{group_id}-lag")
    await admin.start()
    try:
        await consumer.start()
        try:
            described = await admin.describe_topics(list(topics))
            tps = [
                TopicPartition(d["topic"], p["partition"])
                for d in described
                if d.get("error_code") == 0
                for p in d.get("partitions", [])
            ]
            if not tps:
                return {}
            end = await consumer.end_offsets(tps)
            beginning = await consumer.beginning_offsets(tps)
            offsets = await admin.list_consumer_group_offsets(group_id, partitions=tps)
            committed = {tp: meta.offset for tp, meta in offsets.items() if meta.offset >= 0}
            return lag_by_topic(end, committed, beginning)
        finally:
            await consumer.stop()
    finally:
        await admin.close()
