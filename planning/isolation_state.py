"""The isolation ladder's durable state: what to write after each step, what to resume from.

:class:`IsolationJournal` sits beside the ladder. After every batch of verdicts
(or tick) the processor hands it the outputs it is about to publish; the
journal answers with the records of ``state.isolation.v1``
(:mod:`schemas.state`) that changed, which the processor writes, and has
acknowledged, before it sends a command. :func:`resume` rebuilds a ladder and
its guardrail from the records a previous process left, with the commands that
may not have left before it stopped.

What is kept, and why only that:

- a device off the bottom rung (its rung, when it got there, its probation,
  its last refusal, the verdict behind it and its last command); a restored
  device is kept until its restore command expires (so a crash before the
  restore went out sends it again), then deleted (a tombstone);
- the guardrail: isolated set, isolating actions (the rate limit's and the
  lockout's history), the lockout, and the fleet's size by pool and rack.

A device in service with no pending command carries nothing a fresh ladder
would not relearn from its next verdict (verdicts repeat at least every
``verdict_interval_s``), so it is not written: the state stays as small as the
isolated set, not the fleet.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from controllers.guardrail import GuardrailState, Sizes
from controllers.isolation import IsolationLadder, LadderState, Rung
from planning.isolation import HealthTuning, ladder
from planning.issuing import Output
from schemas.codec import encode
from schemas.commands import RouteCommand
from schemas.state import (
    DEVICE_KEY_PREFIX,
    GUARDRAIL_KEY,
    GuardrailEntry,
    IsolationRecord,
    LadderEntry,
)
from schemas.verdicts import Level

SIZES_EVERY_S = 30.0
"""A fleet that only grew (new devices, no decision) is written at most this often."""

Change = tuple[str, IsolationRecord | None]
"""A record to write: its key and value (``None``: delete the key)."""


def device_key(device_uuid: str) -> str:
    return DEVICE_KEY_PREFIX + device_uuid


class IsolationJournal:
    """Remembers what was last written per key, and turns the ladder's state into the
    records that differ from it."""

    def __init__(self) -> None:
        self._written: dict[str, bytes] = {}  # key -> the bytes last written
        self._commands: dict[str, RouteCommand] = {}  # device -> its last command
        self._core = b""  # the guardrail as last written, without the fleet's sizes
        self._sizes_at: datetime | None = None

    def changes(
        self,
        ladder: IsolationLadder,
        *,
        touched: Iterable[str],
        outputs: Iterable[Output[RouteCommand]],
        now: datetime,
    ) -> list[Change]:
        """The records to write (before ``outputs`` are sent) for the devices ``touched``
        since the last call and the devices ``outputs`` name, and the guardrail."""
        devices = set(touched)
        for o in outputs:
            devices.add(o.decision.target)
            if o.command is not None:
                self._commands[o.decision.target] = o.command
        devices |= {d for d, c in self._commands.items() if c.expires_at <= now}  # to drop
        out: list[Change] = []
        for device_uuid in sorted(devices):
            state = ladder.state(device_uuid)
            entry = None if state is None else self._entry(device_uuid, state, now)
            out += self._changed(device_key(device_uuid), entry)
        guard = ladder.guard
        core = GuardrailEntry(
            isolated=tuple(sorted(guard.state.isolated)),
            lost=tuple(sorted(guard.state.lost)),
            actions=tuple(guard.state.actions),
            locked_out=guard.state.locked_out,
        )
        due = self._sizes_at is None or (now - self._sizes_at).total_seconds() >= SIZES_EVERY_S
        core_bytes = encode(core)  # the sizes left at their defaults: what decisions change
        if core_bytes != self._core or due:  # a decision at once; a grown fleet now and then
            sizes = guard.sizes()
            full = core.model_copy(
                update={"devices": sizes.devices, "pool_sizes": sizes.pools,
                        "rack_sizes": sizes.racks},
            )  # fmt: skip
            record = IsolationRecord(key=GUARDRAIL_KEY, guardrail=full)
            self._core, self._sizes_at = core_bytes, now
            out += self._changed(GUARDRAIL_KEY, record)
        return out

    def _entry(self, device_uuid: str, state: LadderState, now: datetime) -> IsolationRecord | None:
        command = self._commands.get(device_uuid)
        if command is not None and command.expires_at <= now:
            del self._commands[device_uuid]
            command = None
        if state.rung is Rung.ACTIVE and command is None:
            return None
        entry = LadderEntry(
            rung=int(state.rung),
            rung_at=state.rung_at,
            healthy_since=state.healthy_since,
            refused_at=state.refused_at,
            refused_for=state.refused_for,
            verdict=state.verdict,
            command=command,
        )
        return IsolationRecord(key=device_key(device_uuid), device=entry)

    def _changed(self, key: str, record: IsolationRecord | None) -> list[Change]:
        if record is None:
            if key not in self._written:
                return []
            del self._written[key]
            return [(key, None)]
        data = encode(record)
        if self._written.get(key) == data:
            return []
        self._written[key] = data
        return [(key, record)]

    def pending(self, now: datetime) -> list[RouteCommand]:
        """Commands a previous process issued that may not have reached the fleet (every
        unexpired last command: an executor drops the copy it already applied)."""
        return [c for c in self._commands.values() if c.expires_at > now]

    def adopt(self, records: Iterable[IsolationRecord]) -> None:
        """Know ``records`` as written (a resumed process does not write them again)."""
        for r in records:
            self._written[r.key] = encode(r)
            if r.guardrail is not None:
                g = r.guardrail
                core = GuardrailEntry(
                    isolated=g.isolated, lost=g.lost, actions=g.actions, locked_out=g.locked_out
                )
                self._core = encode(core)
            if r.device is not None and r.device.command is not None:
                self._commands[r.key.removeprefix(DEVICE_KEY_PREFIX)] = r.device.command


def resume(
    tuning: HealthTuning, records: Iterable[IsolationRecord]
) -> tuple[IsolationLadder, IsolationJournal]:
    """A ladder (and guardrail) from the records a previous process wrote, and its journal,
    which knows those records and the commands they carry (:meth:`IsolationJournal.pending`)."""
    resumed = ladder(tuning)
    journal = IsolationJournal()
    kept = list(records)
    for r in kept:
        if r.guardrail is not None:
            g = r.guardrail
            state = GuardrailState(
                isolated=set(g.isolated),
                lost=set(g.lost),
                actions=list(g.actions),
                locked_out=g.locked_out,
            )
            resumed.guard.resume(state, Sizes(g.devices, dict(g.pool_sizes), dict(g.rack_sizes)))
    for r in kept:
        if r.device is not None:
            e = r.device
            uuid = r.key.removeprefix(DEVICE_KEY_PREFIX)
            resumed.adopt(
                uuid,
                LadderState(
                    e.verdict,
                    rung=Rung(e.rung),
                    rung_at=e.rung_at,
                    healthy_since=e.healthy_since,
                    refused_at=e.refused_at,
                    refused_for=e.refused_for,
                ),
            )
            if e.rung > Rung.ACTIVE and e.verdict.level is Level.DEVICE:
                # an isolated device counts, whatever the guardrail said (a node's devices
                # are in the guardrail's own record)
                resumed.guard.state.isolated.add(uuid)
    journal.adopt(kept)
    return resumed, journal
