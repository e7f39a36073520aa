"""Every command an executor receives gets exactly one result, for every reason."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest

from agents.executors.gate import (
    CommandGate,
    PermanentActuatorError,
    SeenCommands,
    TransientActuatorError,
    execute,
)
from planning.issuing import COMMAND_TTL_S
from schemas.commands import (
    MAX_CLOCK_SKEW_S,
    ResultStatus,
    RouteAction,
    RouteCommand,
    Target,
    ThrottleCommand,
    WarmCommand,
)
from schemas.signing import sign
from tests.factories import START

KEYS = {"k-old": b"old-secret", "k-new": b"new-secret"}


def _command(*, ttl_s: float = 30.0, key_id: str = "k-new", number: int = 1) -> RouteCommand:
    unsigned = RouteCommand(
        command_id=uuid.UUID(int=number),
        issued_at=START,
        expires_at=START + timedelta(seconds=ttl_s),
        issuer="health",
        target=Target(node_id="node-1", device_uuid="node-1-gpu0"),
        reason="xid_fatal",
        action=RouteAction.DRAIN,
    )
    return sign(unsigned, key_id=key_id, key=KEYS.get(key_id, b"attacker"))


class Recorder:
    """An actuator that records what it was asked to do, and can be told to fail."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.applied: list[uuid.UUID] = []
        self.fail = fail

    def apply(self, command: RouteCommand, *, now: datetime) -> str:
        if self.fail is not None:
            raise self.fail
        self.applied.append(command.command_id)
        return f"{command.action.value} {command.target}"


def _run(command: RouteCommand, gate: CommandGate, actuator: Recorder, at_s: float = 1.0):  # type: ignore[no-untyped-def]
    now = START + timedelta(seconds=at_s)
    return execute(
        command,
        gate=gate,
        actuator=actuator,
        executor="node-exec",
        received_at=now,
        now=now,
        new_id=uuid.uuid4,
    )


@pytest.mark.parametrize(
    ("command", "at_s", "status", "detail"),
    [
        (_command(), 1.0, ResultStatus.APPLIED, "drain node-1"),
        (_command(key_id="k-old"), 1.0, ResultStatus.APPLIED, "drain"),  # keys rotate
        (_command(key_id="k-forged"), 1.0, ResultStatus.BAD_SIGNATURE, "unknown key id"),
        (
            _command().model_copy(update={"action": RouteAction.QUARANTINE}),
            1.0,
            ResultStatus.BAD_SIGNATURE,
            "does not match",
        ),
        (_command(ttl_s=5), 6.0, ResultStatus.EXPIRED, "expired 1.000s"),
        (_command(ttl_s=5), 5.0, ResultStatus.EXPIRED, "expired 0.000s"),  # the boundary
    ],
)
def test_one_command_one_result(
    command: RouteCommand, at_s: float, status: ResultStatus, detail: str
) -> None:
    actuator = Recorder()
    result = _run(command, CommandGate(keys=KEYS), actuator, at_s)
    assert result.status is status
    assert detail in result.detail
    assert result.command_id == command.command_id and result.executor == "node-exec"
    assert actuator.applied == ([command.command_id] if status is ResultStatus.APPLIED else [])


def test_a_replayed_command_is_applied_once() -> None:
    gate, actuator = CommandGate(keys=KEYS), Recorder()
    first, again = _run(_command(), gate, actuator), _run(_command(), gate, actuator, at_s=2.0)
    assert (first.status, again.status) == (ResultStatus.APPLIED, ResultStatus.DUPLICATE)
    assert actuator.applied == [uuid.UUID(int=1)]


def test_a_forged_copy_cannot_block_the_real_command() -> None:
    gate, actuator = CommandGate(keys=KEYS), Recorder()
    forged = _command(key_id="k-forged")
    assert _run(forged, gate, actuator).status is ResultStatus.BAD_SIGNATURE
    assert _run(_command(), gate, actuator).status is ResultStatus.APPLIED


def test_transient_failures_can_be_retried_permanent_ones_cannot() -> None:
    gate = CommandGate(keys=KEYS)
    flaky = Recorder(fail=TransientActuatorError("NVML busy", retry_after_s=2.5))
    result = _run(_command(number=7), gate, flaky)
    assert (result.status, result.retry_after_s) == (ResultStatus.FAILED_TRANSIENT, 2.5)
    assert _run(_command(number=7), gate, Recorder()).status is ResultStatus.APPLIED
    broken = Recorder(fail=PermanentActuatorError("no such device"))
    assert _run(_command(number=8), gate, broken).status is ResultStatus.FAILED_PERMANENT
    assert _run(_command(number=8), gate, Recorder()).status is ResultStatus.DUPLICATE


def test_a_buggy_actuator_still_yields_a_result() -> None:
    result = _run(_command(), CommandGate(keys=KEYS), Recorder(fail=KeyError("boom")))
    assert result.status is ResultStatus.FAILED_PERMANENT
    assert "KeyError" in result.detail


def test_replay_memory_is_bounded_by_expiry_and_survives_a_restart() -> None:
    gate, actuator = CommandGate(keys=KEYS), Recorder()
    for n in range(1, 4):
        _run(_command(number=n, ttl_s=10 * n), gate, actuator)
    assert gate.seen.prune(START + timedelta(seconds=15)) == 1  # command 1 expired at 10 s
    restored = CommandGate(keys=KEYS, seen=SeenCommands.from_json(gate.seen.to_json()))
    assert _run(_command(number=2, ttl_s=20), restored, actuator, at_s=16).status is (
        ResultStatus.DUPLICATE
    )
    assert len(restored.seen.until) == 2


def test_an_executor_without_keys_is_refused() -> None:
    with pytest.raises(ValueError, match="key"):
        CommandGate(keys={})


def _dated(*, issued_s: float, ttl_s: float, number: int = 9) -> RouteCommand:
    unsigned = _command(number=number).model_copy(
        update={
            "issued_at": START + timedelta(seconds=issued_s),
            "expires_at": START + timedelta(seconds=issued_s + ttl_s),
            "key_id": None,
            "signature": None,
        }
    )
    return sign(unsigned, key_id="k-new", key=KEYS["k-new"])


@pytest.mark.parametrize(
    ("issued_s", "ttl_s", "status"),
    [
        (1.0 + MAX_CLOCK_SKEW_S, 30.0, ResultStatus.APPLIED),  # at the skew bound: taken
        (1.0 + MAX_CLOCK_SKEW_S + 0.01, 30.0, ResultStatus.BAD_TIME),  # just past it
        (3600.0, 30.0, ResultStatus.BAD_TIME),  # dated an hour ahead, validly signed
        (0.0, RouteCommand.max_lifetime_s, ResultStatus.APPLIED),
        (0.0, RouteCommand.max_lifetime_s + 1, ResultStatus.BAD_TIME),
        (0.0, 900 * 365 * 86_400.0, ResultStatus.BAD_TIME),  # a 900-year command
    ],
)
def test_a_command_dated_ahead_or_living_too_long_is_refused(
    issued_s: float, ttl_s: float, status: ResultStatus
) -> None:
    actuator = Recorder()
    result = _run(_dated(issued_s=issued_s, ttl_s=ttl_s), CommandGate(keys=KEYS), actuator)
    assert result.status is status, result.detail
    assert actuator.applied == ([uuid.UUID(int=9)] if status is ResultStatus.APPLIED else [])


def test_every_command_type_has_a_lifetime_bound_above_the_issuers_ttl() -> None:
    for kind in (RouteCommand, ThrottleCommand, WarmCommand):
        assert COMMAND_TTL_S < kind.max_lifetime_s <= 900.0, kind.__name__
