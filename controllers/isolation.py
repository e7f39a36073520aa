"""The isolation ladder: how far to take a device out of service, one rung at a time.

Rungs, mildest first: de-weight (``deweight_ratio`` of its traffic), stop new
sessions, drain, quarantine. What a verdict asks for:

- ``failed`` (a hard fault) -> quarantine at once: there is nothing to wait for.
  Only evidence the device reported of itself and a second sample confirmed
  (:data:`~schemas.verdicts.HARD_CONFIRMED`: a double-bit ECC error, a fatal
  XID, a failed probe) takes no healthy capacity with it and skips the
  guardrail's blast-radius caps and rate limit; silence, and a single sample,
  pass them like any isolation (fail-static and the lockout apply to all). A
  node gone silent as a whole (its heartbeat lost) is quarantined as one unit,
  every device of it at once, so it is its pool's spare node rather than a cap
  filled device by device, and past the caps up to the pool's panic share: it
  serves nothing now, and traffic sent to it fails;
- ``dying`` -> drain, one rung up per ``step_dwell_s`` (hysteresis: the
  evidence must hold while the device is already lightened). A step the
  guardrail refused waits, asked again every ``retry_s``; when room comes it is
  taken only if its evidence has not receded meanwhile: a step held back by the
  caps does not land as its cause ends (a node whose cooling is fixed, drained
  as its temperature falls back). Receded: every measured signal over its
  threshold now has fallen more than its threshold below its highest while the
  step waited (the threshold is the detector's own noise scale; a count such as
  slow probes in a row never recedes). Such a step is refused with reason
  ``receded`` and asked again while the evidence holds; the device stays where it
  is;
- ``suspect`` -> hold where it is; ``healthy`` -> once healthy for
  ``probation_s`` without a relapse, restore.

A node's verdict (:class:`~schemas.verdicts.Level` ``node``: most of its devices
deviate together, from a cause of the node's own such as its cooling) drains
the node as one unit when ``dying``, one proposal to the guardrail for all its
devices, and restores it after its probation. A rack's or a cohort's verdict
isolates nothing: a rollout or a rack's air is not fixed by taking chips away.

Every step up is a proposal to the shared :class:`~controllers.guardrail.Guardrail`
(blast radius, rate, lockout, fail-static); a refusal is a decision too,
retried no sooner than ``retry_s``. Restores are never refused.

Pure and synchronous: verdicts and ``now`` in, :class:`LadderDecision` out.
The caller turns decisions into signed commands and records them.

Example::

    ladder = IsolationLadder(LadderConfig(), Guardrail(GuardrailConfig(), devices={}))
    for decision in ladder.verdict(v, now=now):   # and ladder.tick(now) every second
        ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from enum import IntEnum, StrEnum

from controllers.guardrail import Guardrail, GuardReason, Proposal
from schemas.commands import RouteAction
from schemas.verdicts import (
    COUNTED_SIGNALS,
    HARD_CONFIRMED,
    SILENCE_SIGNALS,
    HealthStatus,
    Level,
    Verdict,
)

NODE_LOST = SILENCE_SIGNALS[0]  # the node's heartbeat lost: every device of it silent


class Rung(IntEnum):
    ACTIVE = 0
    DEWEIGHTED = 1
    NO_NEW_SESSIONS = 2
    DRAINED = 3
    QUARANTINED = 4


ACTION: dict[Rung, RouteAction] = {
    Rung.ACTIVE: RouteAction.RESTORE,
    Rung.DEWEIGHTED: RouteAction.DEWEIGHT,
    Rung.NO_NEW_SESSIONS: RouteAction.STOP_NEW_SESSIONS,
    Rung.DRAINED: RouteAction.DRAIN,
    Rung.QUARANTINED: RouteAction.QUARANTINE,
}
TARGET: dict[HealthStatus, Rung] = {
    HealthStatus.FAILED: Rung.QUARANTINED,
    HealthStatus.DYING: Rung.DRAINED,
}


class LadderReason(StrEnum):
    HARD_FAULT = "hard_fault"
    DEGRADING = "degrading"
    RECOVERED = "recovered"
    COMMON_MODE = "common_mode"  # a group's devices deviate together: no device isolated
    NODE_FAULT = "node_fault"  # a node's devices deviate together: the node drained as one
    RECEDED = "receded"  # a refused step's evidence fell back while it waited: not taken


@dataclass(frozen=True, slots=True)
class LadderConfig:
    deweight_ratio: float = 0.5
    step_dwell_s: float = 10.0
    probation_s: float = 120.0
    retry_s: float = 30.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.deweight_ratio) and 0.0 <= self.deweight_ratio < 1.0):
            raise ValueError(f"deweight_ratio must be in [0, 1), not {self.deweight_ratio!r}")
        for name in ("step_dwell_s", "probation_s", "retry_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a non-negative number of seconds")


@dataclass(frozen=True, slots=True)
class LadderDecision:
    """One proposed step for one device, and whether the guardrail let it through."""

    device_uuid: str
    action: RouteAction
    rung: Rung
    allowed: bool
    reason: str  # a LadderReason when allowed, the GuardReason when refused
    message: str
    verdict: Verdict
    weight_ratio: float | None = None
    unit: Level = Level.DEVICE  # NODE: device_uuid names a node, stepped as one unit


@dataclass(slots=True)
class LadderState:
    """Where one device stands: its rung since when, its probation, its last refusal, and
    while a refused step waits, each measured signal's highest value since (not kept across
    a restart: a resumed ladder starts the wait afresh from the verdict it sees)."""

    verdict: Verdict
    rung: Rung = Rung.ACTIVE
    rung_at: datetime | None = None
    healthy_since: datetime | None = None
    refused_at: datetime | None = None
    refused_for: str = ""
    waited_peak: dict[str, float] = field(default_factory=dict)


class IsolationLadder:
    """Steps each device up and down the rungs (deweight, stop new sessions, drain,
    quarantine, restore) on its verdicts and dwell times, every step past the guardrail."""

    def __init__(self, config: LadderConfig, guard: Guardrail) -> None:
        self.config = config
        self.guard = guard
        self.devices: dict[str, LadderState] = {}
        self.nodes: dict[str, LadderState] = {}  # nodes judged as one unit (node verdicts)

    def rung(self, device_uuid: str) -> Rung:
        d = self.devices.get(device_uuid)
        return Rung.ACTIVE if d is None else d.rung

    def state(self, device_uuid: str) -> LadderState | None:
        """A device's (or a node unit's) place on the ladder (``None``: no verdict seen)."""
        return self.devices.get(device_uuid) or self.nodes.get(device_uuid)

    def adopt(self, device_uuid: str, state: LadderState) -> None:
        """Resume a device (or a node unit, by its verdict's level) where a previous process
        left it (from its durable state)."""
        if state.verdict.level is Level.NODE:
            self.nodes[device_uuid] = state
            return
        v = state.verdict  # its node, but no time: a record is not a verdict seen now
        self.guard.register(device_uuid, pool=v.pool, rack=v.rack_id, node=v.node_id)
        self.devices[device_uuid] = state

    def verdict(self, verdict: Verdict, *, now: datetime) -> list[LadderDecision]:
        """A new verdict arrived; returns the steps it causes (maybe none). A verdict older
        than the device's last one changes nothing. A node's verdict (its devices deviate
        together, from a cause of the node's own: its cooling, its inlet air, its host) drains
        the node as one unit (:meth:`_node_step`); a rack's or a cohort's moves no device
        (:func:`planning.isolation.attribute` records it)."""
        if verdict.level is Level.NODE:
            return self._node_verdict(verdict, now)
        if verdict.level is not Level.DEVICE:
            return []
        self.guard.register(
            verdict.device_uuid,
            pool=verdict.pool,
            rack=verdict.rack_id,
            node=verdict.node_id,
            at=verdict.observed_at,
        )
        self.guard.observe(verdict.observed_at)
        d = self._latest(self.devices, verdict.device_uuid, verdict)
        return [] if d is None else self._step(verdict.device_uuid, d, now)

    def _node_verdict(self, verdict: Verdict, now: datetime) -> list[LadderDecision]:
        node = verdict.scope or verdict.device_uuid
        self.guard.observe(verdict.observed_at)
        d = self._latest(self.nodes, node, verdict)
        return [] if d is None else self._node_step(node, d, now)

    def _probation_over(self, state: LadderState, now: datetime) -> bool:
        """Off the bottom rung and healthy for ``probation_s`` without a relapse."""
        if state.rung is Rung.ACTIVE or state.healthy_since is None:
            return False
        return (now - state.healthy_since).total_seconds() >= self.config.probation_s

    def _retry_pending(self, state: LadderState, now: datetime) -> bool:
        """Refused less than ``retry_s`` ago: not asked again yet."""
        if state.refused_at is None:
            return False
        return (now - state.refused_at).total_seconds() < self.config.retry_s

    @staticmethod
    def _latest(table: dict[str, LadderState], key: str, verdict: Verdict) -> LadderState | None:
        """``key``'s state with ``verdict`` taken as the latest word on it (probation,
        refusals to forget); None when the verdict is older than the one the ladder acted on
        (a replay after a restart): no news."""
        state = table.get(key)
        if state is None:
            state = table[key] = LadderState(verdict)
        elif verdict.observed_at < state.verdict.observed_at:
            return None
        worse = verdict.status is not HealthStatus.HEALTHY
        if worse:
            state.healthy_since = None
        elif state.healthy_since is None or state.verdict.status is not HealthStatus.HEALTHY:
            state.healthy_since = verdict.observed_at
        if (
            verdict.status is not state.verdict.status
            or confirmed(verdict) is not confirmed(state.verdict)
            or state.refused_for == GuardReason.STALE_TELEMETRY
        ):
            state.refused_at = None  # new or fresh evidence: a refused step may be asked again
        state.verdict = verdict
        if not worse:
            state.waited_peak.clear()  # healthy: nothing waits
        elif state.waited_peak:
            _remember(state.waited_peak, verdict)
        return state

    def tick(self, now: datetime) -> list[LadderDecision]:
        """Time passed: dwell times and probations may have run out."""
        out: list[LadderDecision] = []
        for device_uuid, d in self.devices.items():
            out.extend(self._step(device_uuid, d, now))
        for node, d in self.nodes.items():
            out.extend(self._node_step(node, d, now))
        return out

    def _node_step(self, node: str, state: LadderState, now: datetime) -> list[LadderDecision]:
        """A node whose devices deviate together: drained as one unit past the guardrail
        (one action for its rate limit, every device for its blast radius), restored after
        ``probation_s`` healthy. Its devices' own ladders go on beside it: a device isolated
        for its own fault stays isolated when the node comes back."""
        c, v = self.config, state.verdict
        members = self.guard.node_members(node)  # its devices, as their verdicts named them
        if v.status is HealthStatus.HEALTHY:
            if not self._probation_over(state, now):
                return []
            back = tuple(m for m in members if self.rung(m) is Rung.ACTIVE)
            if back:
                self.guard.check(Proposal(node, isolate=False, members=back), now=now)
            state.rung, state.rung_at = Rung.ACTIVE, now
            message = f"node healthy for {c.probation_s:g}s: restore its {len(back)} devices"
            return [
                LadderDecision(
                    node, RouteAction.RESTORE, Rung.ACTIVE, True, LadderReason.RECOVERED.value,
                    message, v, unit=Level.NODE,
                )
            ]  # fmt: skip
        if v.status is not HealthStatus.DYING or state.rung is not Rung.ACTIVE or not members:
            return []
        if self._retry_pending(state, now):
            return []
        drain = RouteAction.DRAIN
        held = _held(state, now)
        if held:
            return [
                LadderDecision(
                    node, drain, Rung.DRAINED, False, LadderReason.RECEDED.value, held, v,
                    unit=Level.NODE,
                )
            ]  # fmt: skip
        guard = self.guard.check(Proposal(node, isolate=True, members=members), now=now)
        if not guard.allowed:
            state.refused_at, state.refused_for = now, guard.reason.value
            _remember(state.waited_peak, v)
            return [
                LadderDecision(
                    node, drain, Rung.DRAINED, False, guard.reason.value, guard.message, v,
                    unit=Level.NODE,
                )
            ]  # fmt: skip
        state.rung, state.rung_at, state.refused_at = Rung.DRAINED, now, None
        state.waited_peak.clear()
        message = f"{v.attribution}; the node's {len(members)} devices drained as one unit"
        return [
            LadderDecision(
                node, drain, Rung.DRAINED, True, LadderReason.NODE_FAULT.value, message[:1024], v,
                unit=Level.NODE,
            )
        ]  # fmt: skip

    def _step(self, device_uuid: str, device: LadderState, now: datetime) -> list[LadderDecision]:
        c, v = self.config, device.verdict
        status = v.status
        if status is HealthStatus.HEALTHY:
            if not self._probation_over(device, now):
                return []
            guard = self.guard.check(Proposal(device_uuid, isolate=False), now=now)
            device.rung, device.rung_at = Rung.ACTIVE, now
            return [
                LadderDecision(
                    device_uuid,
                    RouteAction.RESTORE,
                    Rung.ACTIVE,
                    True,
                    LadderReason.RECOVERED.value,
                    f"healthy for {c.probation_s:g}s: restore ({guard.message})",
                    v,
                )
            ]
        target = TARGET.get(status)
        if target is None or device.rung >= target:
            return []  # suspect: hold; or already far enough up the ladder
        hard = status is HealthStatus.FAILED
        exempt = hard and confirmed(v)  # no healthy capacity lost, and not one message's word
        dwelling = (
            device.rung_at is not None and (now - device.rung_at).total_seconds() < c.step_dwell_s
        )
        if not hard and device.rung is not Rung.ACTIVE and dwelling:
            return []
        if self._retry_pending(device, now):
            return []
        if hard and device.refused_at is not None and latched(v):
            return []  # refused once; retried only while the device still reports it
        rung = target if hard else Rung(device.rung + 1)
        held = "" if hard else _held(device, now)
        if held:
            return [
                LadderDecision(
                    device_uuid, ACTION[rung], rung, False, LadderReason.RECEDED.value, held, v
                )
            ]
        members = self._lost_node(v)
        if members:
            proposal = Proposal(v.node_id, isolate=True, members=members, lost=True)
        else:
            proposal = Proposal(device_uuid, isolate=True, hard=exempt)
        guard = self.guard.check(proposal, now=now)
        if not guard.allowed:
            device.refused_at, device.refused_for = now, guard.reason.value
            if not hard:
                _remember(device.waited_peak, v)
            return [
                LadderDecision(
                    device_uuid, ACTION[rung], rung, False, guard.reason.value, guard.message, v
                )
            ]
        if members:
            return self._quarantine_node(device_uuid, members, v, now)
        device.rung, device.rung_at, device.refused_at = rung, now, None
        device.waited_peak.clear()
        reason = LadderReason.HARD_FAULT if hard else LadderReason.DEGRADING
        return [
            LadderDecision(
                device_uuid,
                ACTION[rung],
                rung,
                True,
                reason.value,
                f"{status.value}: {v.evidence}"[:1024],
                v,
                weight_ratio=c.deweight_ratio if rung is Rung.DEWEIGHTED else None,
            )
        ]

    def _lost_node(self, verdict: Verdict) -> tuple[str, ...]:
        """The devices of a node that went silent as a whole (its heartbeat lost), as the
        verdicts named them, when the verdict says so: taken out as one unit, so a crashed
        node is its pool's spare node (:mod:`controllers.guardrail`) instead of filling the
        pool's cap device by device, with its last devices refused and the node never
        whole; and, like a dead host a health check removes, past the pool's and rack's
        caps, up to the pool's panic share (``lost_max_ratio``): traffic sent to it now
        fails."""
        if verdict.status is not HealthStatus.FAILED:
            return ()
        if not any(s.name == NODE_LOST for s in verdict.signals):
            return ()
        members = self.guard.node_members(verdict.node_id)
        return members if verdict.device_uuid in members else ()

    def _quarantine_node(
        self, device_uuid: str, members: tuple[str, ...], verdict: Verdict, now: datetime
    ) -> list[LadderDecision]:
        """Every device of a lost node quarantined at once (each its own command), on the
        verdict of the first device whose silence showed it. The others' own verdicts,
        which follow, find them already there; each comes back on its own probation."""
        node = verdict.node_id
        message = (
            f"failed: node {node} lost ({verdict.evidence}); "
            f"its {len(members)} devices quarantined as one unit"
        )[:1024]
        out: list[LadderDecision] = []
        for member in members:
            state = self.devices[member]
            if state.rung >= Rung.QUARANTINED:
                continue
            state.rung, state.rung_at, state.refused_at = Rung.QUARANTINED, now, None
            if member != device_uuid:
                state.healthy_since = None  # no probation on a verdict from before the loss
            out.append(
                LadderDecision(
                    member, RouteAction.QUARANTINE, Rung.QUARANTINED, True,
                    LadderReason.HARD_FAULT.value, message, verdict,
                )
            )  # fmt: skip
        return out


def _levels(verdict: Verdict) -> dict[str, tuple[float, float]]:
    """The verdict's measured signals over their threshold: name -> (value, threshold)."""
    return {
        s.name: (s.value, s.threshold)
        for s in verdict.signals
        if s.name not in COUNTED_SIGNALS and 0 < s.threshold <= s.value
    }


def _remember(peak: dict[str, float], verdict: Verdict) -> None:
    """Keep each measured signal's highest value while a refused step waits."""
    for name, (value, _) in _levels(verdict).items():
        peak[name] = max(value, peak.get(name, value))


def _held(state: LadderState, now: datetime) -> str:
    """Why a waiting step is not taken now (empty: take it): its evidence receded while it
    waited (see the module's ``dying``). Marks the step refused, to be asked again in
    ``retry_s`` (it is taken then if the evidence has come back)."""
    levels = _levels(state.verdict)
    if not state.waited_peak or not levels:
        return ""
    fell: list[str] = []
    for name, (value, threshold) in levels.items():
        peak = state.waited_peak.get(name)
        if peak is None or value > peak - threshold:
            return ""  # this evidence holds (or is new since the wait began)
        fell.append(f"{name} {peak:.3g} -> {value:.3g} (threshold {threshold:.3g})")
    state.refused_at, state.refused_for = now, LadderReason.RECEDED.value
    return f"not taken: its evidence receded while the step waited: {'; '.join(fell)}"


def latched(verdict: Verdict) -> bool:
    """Whether a ``failed`` verdict stands only on evidence no longer reported: the sample
    that showed it has passed (a fatal XID stays latched for minutes) and nothing repeats it.
    A refused quarantine is not asked again on that alone, so a step held back by the caps
    never lands minutes after its evidence."""
    names = {s.name for s in verdict.signals}
    stale = any(s.name == HARD_CONFIRMED and s.value < 1 for s in verdict.signals)
    return stale and not names & set(SILENCE_SIGNALS)


def confirmed(verdict: Verdict) -> bool:
    """Whether a verdict carries confirmed evidence the device reported of itself."""
    return any(s.name == HARD_CONFIRMED and s.value >= s.threshold for s in verdict.signals)


REASONS: tuple[str, ...] = (*(r.value for r in LadderReason), *(r.value for r in GuardReason))
"""Every reason a ladder decision can carry (a closed set, for metric labels)."""
