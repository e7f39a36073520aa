"""What every controller processor shares when it turns a decision into a command.

:class:`IssuerWiring` holds the settings a controller needs to issue commands
(topic prefix, signing key, its name as issuer, how long a command lives);
each processor's wiring extends it. :func:`issue` builds and signs a command's
header the one way every controller does: a fresh id, issued at the decision's
instant, expiring ``command_ttl_s`` later, carrying its decision's id. Without
a signing key the controller is advisory and :func:`issue` returns ``None``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from schemas.commands import Command
from schemas.signing import sign

C = TypeVar("C", bound=Command)


@dataclass(frozen=True, slots=True)
class IssuerWiring:
    topic_prefix: str = ""
    signing_key: tuple[str, bytes] | None = None  # None: advisory, decisions only
    issuer: str = "controller"
    command_ttl_s: float = 60.0


def issue(
    cls: type[C],
    w: IssuerWiring,
    *,
    at: datetime,
    decision_id: uuid.UUID,
    new_id: Callable[[], uuid.UUID] = uuid.uuid4,
    **fields: Any,
) -> C | None:
    """The signed command of a decision made at ``at``, or None when ``w`` has no key."""
    if w.signing_key is None:
        return None
    kid, key = w.signing_key
    command = cls(
        command_id=new_id(),
        issued_at=at,
        expires_at=at + timedelta(seconds=w.command_ttl_s),
        issuer=w.issuer,
        decision_id=decision_id,
        **fields,
    )
    return sign(command, key_id=kid, key=key)
