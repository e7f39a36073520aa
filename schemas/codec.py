"""JSON codec for every contract (never pickle).

``decode`` either returns a validated model or raises :class:`DecodeError`
whose ``kind`` says why, so bad input can become a dead letter with a reason
an SRE can group by. Nothing else escapes it: whatever a validator raises
(pydantic wraps only ``ValueError`` and ``AssertionError``; an ``OverflowError``
or a ``RecursionError`` would pass through) is a ``schema`` error too, so a
caller that handles ``DecodeError`` has handled every bad message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar

import msgspec
from pydantic import ValidationError

from schemas.base import SCHEMA_VERSION, Contract
from schemas.envelopes import (
    ENVELOPE_VERSION,
    HEADS,
    AcceleratorTick,
    ServingTick,
    accelerator_samples,
    serving_samples,
)

M = TypeVar("M")  # a contract (pydantic) or an envelope (msgspec)
T = TypeVar("T", AcceleratorTick, ServingTick)


class DecodeErrorKind(StrEnum):
    BAD_JSON = "bad_json"
    NOT_AN_OBJECT = "not_an_object"
    UNKNOWN_VERSION = "unknown_version"
    NON_FINITE = "non_finite"
    SCHEMA = "schema"
    TOO_LARGE = "too_large"


class DecodeError(ValueError):
    """A payload that is not a valid instance of the expected contract. Never retriable."""

    retriable = False

    def __init__(self, kind: DecodeErrorKind, message: str) -> None:
        super().__init__(f"{kind.value}: {message}")
        self.kind = kind
        self.message = message


MAX_MESSAGE_BYTES = 1_000_000


_ENCODER = msgspec.json.Encoder()


def encode(value: Contract | msgspec.Struct) -> bytes:
    """Serialise a contract (v1, pydantic) or an envelope (v2, msgspec) to UTF-8 JSON."""
    if isinstance(value, msgspec.Struct):
        return _ENCODER.encode(value)
    return value.model_dump_json().encode()


def _classify(exc: ValidationError) -> DecodeError:
    errors = exc.errors(include_url=False, include_input=False)
    types = {e["type"] for e in errors}
    if types & {"json_invalid", "json_type"}:
        return DecodeError(DecodeErrorKind.BAD_JSON, errors[0]["msg"])
    if "model_type" in types and errors[0]["loc"] == ():
        return DecodeError(DecodeErrorKind.NOT_AN_OBJECT, errors[0]["msg"])
    for e in errors:
        if e["loc"] == ("schema_version",):
            return DecodeError(
                DecodeErrorKind.UNKNOWN_VERSION,
                f"schema_version must be {SCHEMA_VERSION}: {e['msg']}",
            )
    if "finite_number" in types:
        where = next(".".join(map(str, e["loc"])) for e in errors if e["type"] == "finite_number")
        return DecodeError(DecodeErrorKind.NON_FINITE, f"non-finite number at {where}")
    summary = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in errors)
    return DecodeError(DecodeErrorKind.SCHEMA, summary[:2000])


def decode(raw: bytes | None, value_type: type[M], *, max_bytes: int = MAX_MESSAGE_BYTES) -> M:
    """Parse and validate ``raw`` as ``value_type``; raise :class:`DecodeError` otherwise.
    An envelope is valid here only when every sample is (:func:`decode_tick` keeps the
    valid samples of one that is not). ``max_bytes``: the largest message taken (a state
    record, which the pipeline writes itself, may be larger than any event)."""
    if value_type in HEADS:
        return _strict_tick(raw, value_type)  # type: ignore[no-any-return]
    if raw is None:
        raise DecodeError(DecodeErrorKind.BAD_JSON, "empty message (tombstone)")
    if len(raw) > max_bytes:
        raise DecodeError(DecodeErrorKind.TOO_LARGE, f"{len(raw)} bytes > {max_bytes}")
    try:
        return value_type.model_validate_json(raw)  # type: ignore[attr-defined, no-any-return]
    except ValidationError as exc:
        raise _classify(exc) from None
    except Exception as exc:  # a validator failing in a way pydantic does not wrap
        raise DecodeError(DecodeErrorKind.SCHEMA, f"{type(exc).__name__}: {exc}"[:2000]) from None


_DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def _decoder(value_type: type[Any]) -> msgspec.json.Decoder[Any]:
    found = _DECODERS.get(value_type)
    if found is None:
        found = _DECODERS[value_type] = msgspec.json.Decoder(value_type)
    return found


_AT_BYTE = re.compile(r"\(byte (\d+)\)$")


def _classify_msgspec(exc: Exception, raw: bytes = b"") -> DecodeError:
    text = str(exc)
    if isinstance(exc, msgspec.DecodeError) and not isinstance(exc, msgspec.ValidationError):
        at = _AT_BYTE.search(text)  # NaN and Infinity are not JSON: say which it was
        if at and raw[int(at.group(1)) :].lstrip(b"-")[:3] in (b"NaN", b"Inf"):
            return DecodeError(DecodeErrorKind.NON_FINITE, f"non-finite number: {text}")
        return DecodeError(DecodeErrorKind.BAD_JSON, text)
    if text.startswith("Expected `object`") and " - at `" not in text:
        return DecodeError(DecodeErrorKind.NOT_AN_OBJECT, text)
    if text.endswith("- at `$.schema_version`"):
        return DecodeError(
            DecodeErrorKind.UNKNOWN_VERSION, f"schema_version must be {ENVELOPE_VERSION}: {text}"
        )
    if text.startswith("Number out of range"):
        return DecodeError(DecodeErrorKind.NON_FINITE, f"non-finite number: {text}")
    return DecodeError(DecodeErrorKind.SCHEMA, text[:2000])


@dataclass(slots=True)
class TickDecode(Generic[T]):
    """An envelope decoded sample by sample: ``tick`` holds its valid samples (``None`` when
    none is); ``bad`` each invalid one's index, error and bytes."""

    tick: T | None
    bad: list[tuple[int, DecodeError, bytes]] = field(default_factory=list)


def decode_tick(raw: bytes | None, tick_type: type[T]) -> TickDecode[T]:
    """Parse and validate a node-tick envelope. A bad envelope (its JSON, its head) raises
    :class:`DecodeError`; a bad sample inside a good one is reported alone, with its index,
    and the envelope keeps the others."""
    if raw is None:
        raise DecodeError(DecodeErrorKind.BAD_JSON, "empty message (tombstone)")
    if len(raw) > MAX_MESSAGE_BYTES:
        raise DecodeError(DecodeErrorKind.TOO_LARGE, f"{len(raw)} bytes > {MAX_MESSAGE_BYTES}")
    try:
        return TickDecode(_decoder(tick_type).decode(raw))
    except Exception as whole:  # msgspec's, or a __post_init__'s; never anything else out
        failed = _classify_msgspec(whole, raw)
    head_type, sample_type = HEADS[tick_type]
    try:
        head = _decoder(head_type).decode(raw)
    except Exception:
        raise failed from None  # the envelope itself is bad: one dead letter for all of it
    good: list[Any] = []
    bad: list[tuple[int, DecodeError, bytes]] = []
    for index, sample in enumerate(head.samples):
        try:
            good.append(_decoder(sample_type).decode(sample))
        except Exception as exc:
            where = _classify_msgspec(exc)
            message = where.message.replace("`$", f"`$.samples[{index}]")
            if " - at `" not in message:
                message += f" - at `$.samples[{index}]`"
            bad.append((index, DecodeError(where.kind, message), bytes(sample)))
    if not bad:
        raise failed  # not a sample's fault after all
    if not good:
        return TickDecode(None, bad)
    fields = {f: getattr(head, f) for f in head_type.__struct_fields__ if f != "samples"}
    return TickDecode(tick_type(**fields, samples=tuple(good)), bad)


def _strict_tick(raw: bytes | None, tick_type: Any) -> Any:
    result = decode_tick(raw, tick_type)
    if result.bad:
        raise result.bad[0][1]
    return result.tick


def decode_samples(raw: bytes | None, value_type: type[Any]) -> list[Any]:
    """What a detector or planner reads from one message: its one v1 contract, or each
    valid sample of a v2 envelope as a flat view (the invalid ones are ingest's to
    dead-letter). Raises :class:`DecodeError` for a message with nothing valid in it."""
    if value_type is AcceleratorTick:
        tick = decode_tick(raw, AcceleratorTick).tick
        return [] if tick is None else accelerator_samples(tick)
    if value_type is ServingTick:
        served = decode_tick(raw, ServingTick).tick
        return [] if served is None else serving_samples(served)
    return [decode(raw, value_type)]
