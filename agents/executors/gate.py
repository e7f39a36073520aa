"""Admission of a command at an executor, and the result for every command.

Checks run in a fixed order: the signature first (a forged command must not
enter the replay memory), then its times (``issued_at`` no further ahead of the
executor's clock than :data:`~schemas.commands.MAX_CLOCK_SKEW_S`, a lifetime
within its type's ``max_lifetime_s``), then expiry, then replay. An admitted command goes
to the actuator; whatever happens, the executor gets back exactly one
:class:`~schemas.commands.CommandResult`.

Pure: time is an argument, ids come from an injected factory, no IO.

Example::

    gate = CommandGate(keys={"k1": secret})
    result = execute(command, gate=gate, actuator=router, executor="router-0",
                     received_at=now, now=now, new_id=uuid.uuid4)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, TypeVar
from uuid import UUID

from schemas.commands import MAX_CLOCK_SKEW_S, Command, CommandResult, ResultStatus
from schemas.signing import verify

C_contra = TypeVar("C_contra", bound=Command, contravariant=True)


class TransientActuatorError(RuntimeError):
    """The action may succeed if retried after ``retry_after_s``."""

    retriable = True

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PermanentActuatorError(RuntimeError):
    """The action cannot succeed as asked (unknown target, value out of range...)."""

    retriable = False


class Actuator(Protocol[C_contra]):
    """Does what a command says; returns a one-line detail for the result."""

    def apply(self, command: C_contra, *, now: datetime) -> str: ...


@dataclass(slots=True)
class SeenCommands:
    """Ids of commands already handled, each kept until its command expires.

    An expired command is refused before the replay check, so forgetting an id
    after its ``expires_at`` never lets a replay through; memory stays bounded
    by the commands alive at once. Serialisable, so an executor can keep it
    across restarts.
    """

    until: dict[UUID, datetime] = field(default_factory=dict)

    def __contains__(self, command_id: object) -> bool:
        return command_id in self.until

    def remember(self, command: Command) -> None:
        self.until[command.command_id] = command.expires_at

    def prune(self, now: datetime) -> int:
        gone = [cid for cid, expires_at in self.until.items() if expires_at <= now]
        for cid in gone:
            del self.until[cid]
        return len(gone)

    def to_json(self) -> str:
        return json.dumps({str(k): v.isoformat() for k, v in self.until.items()}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SeenCommands:
        return cls({UUID(k): datetime.fromisoformat(v) for k, v in json.loads(text).items()})


class CommandGate:
    """Signature, times, expiry and replay checks, in that order.

    Every executor of one process shares one replay memory (``seen``), so a command
    is applied once however many executors could take it.
    """

    def __init__(
        self,
        *,
        keys: Mapping[str, bytes],
        seen: SeenCommands | None = None,
        max_skew_s: float = MAX_CLOCK_SKEW_S,
    ) -> None:
        if not keys:
            raise ValueError("an executor needs at least one verification key")
        if not max_skew_s >= 0:
            raise ValueError("max_skew_s is >= 0")
        self.keys = dict(keys)
        self.seen = seen if seen is not None else SeenCommands()
        self.max_skew_s = max_skew_s

    def refuse(
        self, command: Command, *, now: datetime, payload: Mapping[str, Any] | None = None
    ) -> tuple[ResultStatus, str] | None:
        """Why ``command`` must not run, or None when it may. ``payload``: the command's JSON
        object as it arrived (the signature is checked over it), when there is one."""
        if not verify(command, keys=self.keys, payload=payload):
            known = command.key_id in self.keys
            why = "signature does not match" if known else f"unknown key id {command.key_id!r}"
            return ResultStatus.BAD_SIGNATURE, why
        ahead_s = (command.issued_at - now).total_seconds()
        if ahead_s > self.max_skew_s:
            return ResultStatus.BAD_TIME, (
                f"issued {ahead_s:.3f}s ahead of this executor's clock "
                f"(at most {self.max_skew_s:g}s of skew)"
            )
        lifetime_s = (command.expires_at - command.issued_at).total_seconds()
        if lifetime_s > command.max_lifetime_s:
            return ResultStatus.BAD_TIME, (
                f"lives {lifetime_s:g}s; a {type(command).__name__} may live at most "
                f"{command.max_lifetime_s:g}s"
            )
        if now >= command.expires_at:
            late_s = (now - command.expires_at).total_seconds()
            return ResultStatus.EXPIRED, f"expired {late_s:.3f}s before it arrived"
        if command.command_id in self.seen:
            return ResultStatus.DUPLICATE, "already handled; not applied again"
        return None


def execute(
    command: C_contra,
    *,
    gate: CommandGate,
    actuator: Actuator[C_contra],
    executor: str,
    received_at: datetime,
    now: datetime,
    new_id: Callable[[], UUID],
    payload: Mapping[str, Any] | None = None,
) -> CommandResult:
    """Gate, act and account: exactly one result per command, never an exception."""
    status: ResultStatus
    retry_after_s: float | None = None
    try:
        refusal = gate.refuse(command, now=now, payload=payload)
    except Exception as exc:  # a check that cannot run refuses: never act on an unchecked command
        refusal = ResultStatus.FAILED_PERMANENT, f"not checked: {type(exc).__name__}: {exc}"
    if refusal is not None:
        status, detail = refusal
    else:
        try:
            detail = actuator.apply(command, now=now)
            status = ResultStatus.APPLIED
            gate.seen.remember(command)
        except TransientActuatorError as exc:
            status, detail, retry_after_s = (
                ResultStatus.FAILED_TRANSIENT,
                str(exc),
                exc.retry_after_s,
            )
        except Exception as exc:  # permanent, or a bug in the actuator: still one result
            status, detail = ResultStatus.FAILED_PERMANENT, f"{type(exc).__name__}: {exc}"
            gate.seen.remember(command)  # retrying the same command cannot help
    return CommandResult(
        result_id=new_id(),
        command_id=command.command_id,
        command_type=type(command).__name__,
        executor=executor,
        status=status,
        detail=detail[:1024],
        received_at=received_at,
        completed_at=now,
        retry_after_s=retry_after_s,
    )
