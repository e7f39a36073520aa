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
from typing import Any, Generic, TypeVar

from planning.registry import Controller
from schemas.commands import Command
from schemas.signing import sign
from schemas.verdicts import Decision

C = TypeVar("C", bound=Command)
K = TypeVar("K", bound=Command, covariant=True)


@dataclass(frozen=True, slots=True)
class IssuerWiring:
    topic_prefix: str = ""
    signing_key: tuple[str, bytes] | None = None  # None: advisory, decisions only
    command_ttl_s: float = 60.0


@dataclass(frozen=True, slots=True)
class Output(Generic[K]):
    """A controller's decision and, when it issued one, the signed command it sent."""

    decision: Decision
    command: K | None = None


def issue(
    cls: type[C],
    w: IssuerWiring,
    *,
    by: Controller,
    at: datetime,
    decision_id: uuid.UUID,
    new_id: Callable[[], uuid.UUID] = uuid.uuid4,
    **fields: Any,
) -> C | None:
    """The signed command ``by`` issues for a decision made at ``at``, or None when ``w``
    has no key."""
    if w.signing_key is None:
        return None
    if not issubclass(cls, by.command):
        raise TypeError(f"{by.name} issues {by.command.__name__}, not {cls.__name__}")
    kid, key = w.signing_key
    command = cls(
        command_id=new_id(),
        issued_at=at,
        expires_at=at + timedelta(seconds=w.command_ttl_s),
        issuer=by.name,
        decision_id=decision_id,
        **fields,
    )
    return sign(command, key_id=kid, key=key)
