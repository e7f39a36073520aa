"""JSON codec for every contract (never pickle).

``decode`` either returns a validated model or raises :class:`DecodeError`
whose ``kind`` says why, so bad input can become a dead letter with a reason
an SRE can group by. Nothing else escapes it: whatever a validator raises
(pydantic wraps only ``ValueError`` and ``AssertionError``; an ``OverflowError``
or a ``RecursionError`` would pass through) is a ``schema`` error too, so a
caller that handles ``DecodeError`` has handled every bad message.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from pydantic import ValidationError

from schemas.base import SCHEMA_VERSION, Contract

M = TypeVar("M", bound=Contract)


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


def encode(value: Contract) -> bytes:
    """Serialise a contract to UTF-8 JSON."""
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


def decode(raw: bytes | None, value_type: type[M]) -> M:
    """Parse and validate ``raw`` as ``value_type``; raise :class:`DecodeError` otherwise."""
    if raw is None:
        raise DecodeError(DecodeErrorKind.BAD_JSON, "empty message (tombstone)")
    if len(raw) > MAX_MESSAGE_BYTES:
        raise DecodeError(DecodeErrorKind.TOO_LARGE, f"{len(raw)} bytes > {MAX_MESSAGE_BYTES}")
    try:
        return value_type.model_validate_json(raw)
    except ValidationError as exc:
        raise _classify(exc) from None
    except Exception as exc:  # a validator failing in a way pydantic does not wrap
        raise DecodeError(DecodeErrorKind.SCHEMA, f"{type(exc).__name__}: {exc}"[:2000]) from None
