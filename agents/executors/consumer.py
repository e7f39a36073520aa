"""The command topics, consumed: at-least-once, committed after the results are out.

Offsets are committed only after the results of what was polled have been
acknowledged by the broker (or spooled to disk), so a crash redelivers the
commands and the gate answers each replay with ``duplicate`` instead of acting
twice; a result is never lost.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from schemas.topics import COMMAND_TOPICS, TopicSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ConsumedCommand:
    spec: TopicSpec
    value: bytes | None
    partition: int
    offset: int


class CommandConsumer:
    """Polls the command topics for one consumer group; use as ``async with``."""

    def __init__(
        self,
        bootstrap: str,
        *,
        group_id: str,
        topic_prefix: str = "",
        topics: tuple[TopicSpec, ...] = COMMAND_TOPICS,
        client_id: str = "fleetloop-executor",
        max_records: int = 500,
    ) -> None:
        self.by_name = {topic_prefix + t.name: t for t in topics}
        self.max_records = max_records
        self._consumer = AIOKafkaConsumer(
            *self.by_name,
            bootstrap_servers=bootstrap,
            group_id=group_id,
            client_id=client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",  # commands issued before our first run get results too
            isolation_level="read_committed",
        )
        self._positions: dict[TopicPartition, int] = {}

    async def __aenter__(self) -> CommandConsumer:
        try:
            await self._consumer.start()
        except BaseException:
            await self._consumer.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()

    async def poll(self, timeout_s: float = 0.0) -> list[ConsumedCommand]:
        batches = await self._consumer.getmany(
            timeout_ms=int(timeout_s * 1000), max_records=self.max_records
        )
        out = []
        for tp, messages in batches.items():
            spec = self.by_name[tp.topic]
            for m in messages:
                out.append(ConsumedCommand(spec, m.value, m.partition, m.offset))
                self._positions[tp] = m.offset + 1
        return out

    async def commit(self) -> bool:
        """Commit what was polled; False (logged) when the broker cannot take it now."""
        if not self._positions:
            return True
        try:
            await self._consumer.commit(dict(self._positions))
        except KafkaError as exc:  # redelivered after a restart; the gate makes that harmless
            log.warning("command offsets not committed (%s); they will be redelivered", exc)
            return False
        self._positions.clear()
        return True
