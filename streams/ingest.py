"""The ingest step, pure: raw Kafka messages -> valid events | dead letters.

Bad input is data, not a crash: every message that does not decode to its
topic's contract becomes a :class:`~schemas.commands.DeadLetter` with its
coordinates, the reason and the raw bytes.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from schemas.base import Contract
from schemas.codec import DecodeError, decode
from schemas.commands import DeadLetter
from streams.rows import Coordinates


@dataclass(frozen=True, slots=True)
class RawMessage:
    """One consumed message, as bytes, with where it came from."""

    at: Coordinates
    key: bytes | None
    value: bytes | None


@dataclass(slots=True)
class Split:
    """The outcome of decoding one batch."""

    valid: list[tuple[Contract, Coordinates]] = field(default_factory=list)
    dead: list[tuple[DeadLetter, Coordinates]] = field(default_factory=list)


MAX_DEAD_LETTER_RAW_BYTES = 64 * 1024
"""Raw bytes kept per dead letter: enough to debug, small enough that the dead
letter itself always fits in a Kafka message."""


def dead_letter(message: RawMessage, error: DecodeError, *, now: datetime) -> DeadLetter:
    """The dead letter for ``message`` that failed with ``error``."""
    key = None if message.key is None else message.key.decode("utf-8", "backslashreplace")
    raw = message.value or b""
    return DeadLetter(
        source_topic=message.at.topic,
        source_partition=message.at.partition,
        source_offset=message.at.offset,
        source_key=key[:1024] if key is not None else None,
        error_kind=error.kind.value,
        error=error.message[:4096],
        raw_base64=base64.b64encode(raw[:MAX_DEAD_LETTER_RAW_BYTES]).decode(),
        raw_size_bytes=len(raw),
        received_at=now,
    )


def split(messages: Iterable[RawMessage], value_type: type[Contract], *, now: datetime) -> Split:
    """Decode each message as ``value_type``; failures become dead letters."""
    out = Split()
    for message in messages:
        try:
            out.valid.append((decode(message.value, value_type), message.at))
        except DecodeError as exc:
            out.dead.append((dead_letter(message, exc, now=now), message.at))
    return out
