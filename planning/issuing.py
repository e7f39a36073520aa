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
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from planning.registry import Controller
from schemas.commands import Command
from schemas.signing import sign
from schemas.verdicts import Decision

C = TypeVar("C", bound=Command)
K = TypeVar("K", bound=Command, covariant=True)
W = TypeVar("W", bound="IssuerWiring")


COMMAND_TTL_S = 60.0
"""How long a command lives by default, every controller's alike (``command_ttl_s``)."""


@dataclass(frozen=True)
class IssuerWiring:
    """What a controller needs to issue commands, from the process's settings (not a
    controller's tuning): the topic prefix, the signing key, a command's lifetime."""

    topic_prefix: str = ""
    signing_key: tuple[str, bytes] | None = None  # None: advisory, decisions only
    command_ttl_s: float = COMMAND_TTL_S


def wire(cls: type[W], tuning: Any, issuing: IssuerWiring) -> W:
    """A processor's wiring: its tuning (a settings group) with the issuing settings."""
    given = {f.name: getattr(tuning, f.name) for f in fields(tuning)}
    return cls(**given, **{f.name: getattr(issuing, f.name) for f in fields(IssuerWiring)})


@dataclass(frozen=True, slots=True)
class Output(Generic[K]):
    """A controller's decision and, when it issued one, the signed command it sent."""

    decision: Decision
    command: K | None = None


def issue(
    cls: type[C],
    wiring: IssuerWiring,
    *,
    by: Controller,
    at: datetime,
    decision_id: uuid.UUID,
    new_id: Callable[[], uuid.UUID] = uuid.uuid4,
    **fields: Any,
) -> C | None:
    """The signed command ``by`` issues for a decision made at ``at``, or None when ``wiring``
    has no key."""
    if wiring.signing_key is None:
        return None
    if not issubclass(cls, by.command):
        raise TypeError(f"{by.name} issues {by.command.__name__}, not {cls.__name__}")
    kid, key = wiring.signing_key
    command = cls(
        command_id=new_id(),
        issued_at=at,
        expires_at=at + timedelta(seconds=wiring.command_ttl_s),
        issuer=by.name,
        decision_id=decision_id,
        **fields,
    )
    return sign(command, key_id=kid, key=key)
