"""HMAC-SHA256 signatures over a command's canonical payload.

The canonical payload is the command's JSON with ``signature`` removed, keys
sorted and no insignificant whitespace, so executors in other languages can
recompute it. Keys are looked up by ``key_id`` so they can rotate.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import TypeVar

from schemas.commands import Command

C = TypeVar("C", bound=Command)


def canonical_bytes(command: Command) -> bytes:
    """Bytes that the signature covers."""
    payload = command.model_dump(mode="json", exclude={"signature"})
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def sign(command: C, *, key_id: str, key: bytes) -> C:
    """Return a copy of ``command`` carrying ``key_id`` and its signature."""
    unsigned = command.model_copy(update={"key_id": key_id, "signature": None})
    digest = hmac.new(key, canonical_bytes(unsigned), hashlib.sha256).hexdigest()
    return unsigned.model_copy(update={"signature": digest})


def verify(command: Command, *, keys: Mapping[str, bytes]) -> bool:
    """True when the signature matches the key named by ``key_id``."""
    if command.key_id is None or command.signature is None:
        return False
    key = keys.get(command.key_id)
    if key is None:
        return False
    expected = hmac.new(key, canonical_bytes(command), hashlib.sha256).hexdigest()
    # as bytes: compare_digest refuses str with non-ASCII characters (a TypeError, not False)
    return hmac.compare_digest(expected.encode(), command.signature.encode())
