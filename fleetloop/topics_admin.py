"""Create the registry's topics (with their partition counts and configs) if missing."""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from schemas.topics import ALL_TOPICS, TopicSpec


async def ensure_topics(
    bootstrap: str,
    *,
    prefix: str = "",
    specs: tuple[TopicSpec, ...] = ALL_TOPICS,
    replication_factor: int = 1,
) -> list[str]:
    """Create every topic in ``specs`` that does not exist yet; return the names created."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = [
            NewTopic(
                name=prefix + spec.name,
                num_partitions=spec.partitions,
                replication_factor=replication_factor,
                topic_configs=spec.config(),
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
