"""HMAC-SHA256 signatures over a command's canonical payload.

The rule, for an executor in any language: take the command's JSON object as it
arrived on the topic, remove its ``signature`` member, write what is left as
RFC 8785 canonical JSON (:mod:`schemas.canonical`), and compute HMAC-SHA256 over
those bytes with the key named by ``key_id``; the lowercase hex digest must equal
``signature``. The payload names its own type (``command_type``), so a signature
made for one command type never verifies as another. Keys are looked up by
``key_id`` so they can rotate. ``schemas/signing_vectors.json`` holds published
test vectors.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any, TypeVar

from schemas.canonical import canonical
from schemas.commands import Command

C = TypeVar("C", bound=Command)


def canonical_bytes(command: Command | Mapping[str, Any]) -> bytes:
    """Bytes the signature covers: the payload without ``signature``, canonical. Give the
    JSON object as received (a mapping) to verify what arrived, not our re-reading of it."""
    payload = (
        command.model_dump(mode="json", exclude={"signature"})
        if isinstance(command, Command)
        else {k: v for k, v in command.items() if k != "signature"}
    )
    return canonical(payload)


def sign(command: C, *, key_id: str, key: bytes) -> C:
    """Return a copy of ``command`` carrying ``key_id`` and its signature."""
    unsigned = command.model_copy(update={"key_id": key_id, "signature": None})
    digest = hmac.new(key, canonical_bytes(unsigned), hashlib.sha256).hexdigest()
    return unsigned.model_copy(update={"signature": digest})


def verify(
    command: Command, *, keys: Mapping[str, bytes], payload: Mapping[str, Any] | None = None
) -> bool:
    """True when the signature matches the key named by ``key_id``, over ``payload`` (the
    JSON object as it arrived, when there is one) or else over ``command``'s own JSON."""
    if command.key_id is None or command.signature is None:
        return False
    key = keys.get(command.key_id)
    if key is None:
        return False
    try:
        signed = canonical_bytes(command if payload is None else payload)
    except (TypeError, ValueError):  # not canonical JSON (a huge integer, say): not signed
        return False
    expected = hmac.new(key, signed, hashlib.sha256).hexdigest()
    # as bytes: compare_digest refuses str with non-ASCII characters (a TypeError, not False)
    return hmac.compare_digest(expected.encode(), command.signature.encode())
