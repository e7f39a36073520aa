"""The ingest step, pure: raw Kafka messages -> valid events | dead letters.

Bad input is data, not a crash: every message that does not decode to its
topic's contract becomes a :class:`~schemas.commands.DeadLetter` with its
coordinates, the reason and the raw bytes. Inside a good node-tick envelope, a
bad sample is dead-lettered alone (with its index and its own bytes) and the
envelope goes on with the others.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from schemas.codec import DecodeError, TickDecode, decode, decode_tick
from schemas.commands import DeadLetter
from schemas.envelopes import HEADS
from streams.rows import Coordinates


class RawMessage(NamedTuple):
    """One consumed message, as bytes, with where it came from (a named tuple, as
    :class:`~streams.rows.Coordinates` is: one is made per message)."""

    at: Coordinates
    key: bytes | None
    value: bytes | None


@dataclass(slots=True)
class Split:
    """The outcome of decoding one batch."""

    valid: list[tuple[Any, Coordinates]] = field(default_factory=list)
    dead: list[tuple[DeadLetter, Coordinates]] = field(default_factory=list)


MAX_DEAD_LETTER_RAW_BYTES = 64 * 1024
"""Raw bytes kept per dead letter: enough to debug, small enough that the dead
letter itself always fits in a Kafka message."""


def dead_letter(
    message: RawMessage,
    error: DecodeError,
    *,
    now: datetime,
    index: int | None = None,
    raw: bytes | None = None,
) -> DeadLetter:
    """The dead letter for ``message`` that failed with ``error`` (or for its sample at
    ``index``, whose bytes are ``raw``)."""
    key = None if message.key is None else message.key.decode("utf-8", "backslashreplace")
    raw = (message.value or b"") if raw is None else raw
    return DeadLetter(
        source_topic=message.at.topic,
        source_partition=message.at.partition,
        source_offset=message.at.offset,
        source_index=index,
        source_key=key[:1024] if key is not None else None,
        error_kind=error.kind.value,
        error=error.message[:4096],
        raw_base64=base64.b64encode(raw[:MAX_DEAD_LETTER_RAW_BYTES]).decode(),
        raw_size_bytes=len(raw),
        received_at=now,
    )


def split(messages: Iterable[RawMessage], value_type: type[Any], *, now: datetime) -> Split:
    """Decode each message as ``value_type`` (a contract or an envelope); failures become
    dead letters."""
    out = Split()
    if value_type in HEADS:
        for message in messages:
            try:
                result: TickDecode[Any] = decode_tick(message.value, value_type)
            except DecodeError as exc:
                out.dead.append((dead_letter(message, exc, now=now), message.at))
                continue
            if result.tick is not None:
                out.valid.append((result.tick, message.at))
            for index, error, raw in result.bad:
                letter = dead_letter(message, error, now=now, index=index, raw=raw)
                out.dead.append((letter, message.at))
        return out
    for message in messages:
        try:
            out.valid.append((decode(message.value, value_type), message.at))
        except DecodeError as exc:
            out.dead.append((dead_letter(message, exc, now=now), message.at))
    return out
