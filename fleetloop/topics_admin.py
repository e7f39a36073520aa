"""Create the registry's topics (with their partition counts and configs) if missing;
read a topic back whole (for evaluations and the demo's replay)."""

from __future__ import annotations

from datetime import UTC, datetime

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from schemas.topics import ALL_TOPICS, TopicSpec


async def ensure_topics(
    bootstrap: str,
    *,
    prefix: str = "",
    specs: tuple[TopicSpec, ...] = ALL_TOPICS,
    replication_factor: int = 1,
    log_append_time: bool = False,
) -> list[str]:
    """Create every topic in ``specs`` that does not exist yet; return the names created.
    ``log_append_time``: telemetry records carry the broker's time (production); without
    it, the producer's (a simulator is the clock of its world)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = [
            NewTopic(
                name=prefix + spec.name,
                num_partitions=spec.partitions,
                replication_factor=replication_factor,
                topic_configs=spec.config(log_append_time=log_append_time),
            )
            for spec in specs
            if prefix + spec.name not in existing
        ]
        if not wanted:
            return []
        response = await admin.create_topics(wanted, timeout_ms=30_000)
        created: list[str] = []
        for name, code, *rest in response.topic_errors:
            if code not in (0, TopicAlreadyExistsError.errno):
                message = rest[0] if rest else ""
                raise RuntimeError(f"creating topic {name} failed: error {code} {message}")
            created.append(name)
        return created
    finally:
        await admin.close()


async def read_topic(bootstrap: str, topic: str) -> list[tuple[bytes, datetime]]:
    """Every message on ``topic`` now, with its broker timestamp (oldest first per partition)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        [described] = await admin.describe_topics([topic])
    finally:
        await admin.close()
    tps = [TopicPartition(topic, p["partition"]) for p in described.get("partitions", [])]
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    out: list[tuple[bytes, datetime]] = []
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)

        async def behind() -> bool:
            return any([await consumer.position(tp) < end[tp] for tp in tps])

        while await behind():
            batches = await consumer.getmany(*tps, timeout_ms=1000, max_records=10_000)
            for records in batches.values():
                for r in records:
                    at = datetime.fromtimestamp(r.timestamp / 1000.0, UTC)
                    out.append((bytes(r.value or b""), at))
    finally:
        await consumer.stop()
    return out
