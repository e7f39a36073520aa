"""The one guardrail every isolating action passes, whichever controller proposes it.

A controller that wants to take capacity away (de-weight, stop new sessions,
drain, quarantine) asks :meth:`Guardrail.check` first. Four checks, in order;
the first that refuses names the reason:

1. fail-static: no isolation when the telemetry behind it is older than
   ``stale_after_s`` (a blind pipeline never drains the fleet);
2. lockout: once ``lockout_ratio`` of the fleet's devices were isolated within
   ``lockout_window_s``, nothing more is isolated until a person calls
   :meth:`Guardrail.reset` (NVSentinel stops after 50% of nodes in 5 minutes);
   a further step on a device already isolated (drain after de-weight) passes
   from here on, as it adds no blast radius;
3. blast radius: at most ``max_isolated_ratio`` of any pool and
   ``rack_max_isolated_ratio`` of any rack isolated at once, but always at
   least ``min_isolated`` device (Envoy's outlier detection ejects at most 10% of a
   cluster by default; a rack holds few nodes, so its default is a node's share).
   Both caps count devices taken out one by one: one whole node out (every
   device of it isolated: drained as a unit, or quarantined as one when it went
   silent) is the pool's and the rack's spare node, beside their caps, not in
   them. Pools are provisioned a node spare, and hardware fails in nodes;
   without it, one crashed 8-device node filled a 10% cap of 80 devices and held
   every device fault of the pool back until the node came back, and a node
   whose cooling failed was refused its drain for as long as it overheated
   because one device of its 32-device rack was out for its own fault (the
   rack's cap is one node's share). A node counts as whole only once its devices
   are known: each named by a verdict, the newest ``node_settle_s`` ago (after a
   restart, verdicts name a node's devices one by one, and the first two out are
   not the node). A node lost as a whole (its heartbeat gone: ``Proposal.lost``)
   is past help and serves nothing. It leaves as a dead host leaves by an active
   health check, while the caps are for what the detector judges (Envoy's 10% is
   for outlier ejection, and counts no host a health check removed): it skips both
   caps, and the caps do not count it, up to ``lost_max_ratio`` of its pool out in
   all (Envoy's panic threshold: past half a pool, our view of the pool is more
   likely wrong than the pool);
4. rate: at most ``max_actions`` isolating actions per ``rate_window_s``.

A unit of devices taken out together (a node drained as one, ``Proposal.members``)
is one action for the rate limit and the lockout, and every member for the
blast radius; a pool or rack may always lose one whole node when nothing else
of it is isolated (a node is the unit hardware fails in). The two allowances
do not add up: with something already out, a unit passes only within the cap
plus the spare node, so a second node drained counts in full.

Scaling a model's replicas (warm, cool) passes :meth:`Guardrail.check_scaling`:
fail-static for both; a cool (capacity taken away) is also refused while
locked out and limited to ``max_actions`` per ``rate_window_s`` per scope.

Giving capacity back (restore) is never refused. A proposal marked ``hard``
(the device has already failed, on confirmed evidence it reported itself: a
double-bit ECC error, a fatal XID, a failed probe; never on silence, which a
partition or a clock can fake) takes no healthy capacity away, so it skips
checks 3 and 4; it
still fails static and still counts towards the lockout, which is what stops a
detector gone wrong from quarantining the fleet. Every answer is a
:class:`GuardDecision` with a closed reason, for ClickHouse, metrics and logs.
Pure: time is an argument; the state is plain data and round-trips as JSON.

Example::

    guard = Guardrail(GuardrailConfig(), devices={"d1": ("us-east-h100", "rack-0000"), ...})
    guard.observe(now)                      # fresh telemetry arrived
    decision = guard.check(Proposal("d1", isolate=True), now=now)
    if decision.allowed: ...                # send the command
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum


class GuardReason(StrEnum):
    ALLOWED = "allowed"
    RESTORE = "restore"
    STALE_TELEMETRY = "stale_telemetry"
    LOCKED_OUT = "locked_out"
    POOL_CAP = "pool_cap"
    RACK_CAP = "rack_cap"
    RATE_LIMITED = "rate_limited"
    UNKNOWN_DEVICE = "unknown_device"


@dataclass(frozen=True, slots=True)
class GuardrailConfig:
    max_isolated_ratio: float = 0.10
    rack_max_isolated_ratio: float = 0.25
    min_isolated: int = 1
    max_actions: int = 10
    rate_window_s: float = 60.0
    stale_after_s: float = 30.0
    lockout_ratio: float = 0.5
    lockout_window_s: float = 300.0
    node_settle_s: float = 60.0  # a node's devices are known once all were named this long ago
    lost_max_ratio: float = 0.5  # lost nodes leave past the caps up to this share of a pool

    def __post_init__(self) -> None:
        for name in (
            "max_isolated_ratio",
            "rack_max_isolated_ratio",
            "lockout_ratio",
            "lost_max_ratio",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 < value <= 1.0):
                raise ValueError(f"{name} must be in (0, 1], not {value!r}")
        for name in ("rate_window_s", "stale_after_s", "lockout_window_s", "node_settle_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
        if self.max_actions < 1 or self.min_isolated < 0:
            raise ValueError("max_actions must be >= 1 and min_isolated >= 0")


@dataclass(frozen=True, slots=True)
class Proposal:
    """One step for a device, or for a unit of devices taken out together (``members``: a
    node drained as one): one action for the rate limit and the lockout, every member for
    the blast radius."""

    device_uuid: str  # the device, or the unit's name (a node id) when members are given
    isolate: bool  # True: take capacity away; False: give it back
    hard: bool = False  # failed, on confirmed evidence of its own: no radius or rate to spend
    lost: bool = False  # a node gone silent as a whole (members): its pool's panic share only
    members: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GuardDecision:
    allowed: bool
    reason: GuardReason
    message: str


@dataclass(frozen=True, slots=True)
class Sizes:
    """How many devices the fleet has, in all and per pool and rack."""

    devices: int
    pools: dict[str, int]
    racks: dict[str, int]


@dataclass(slots=True)
class GuardrailState:
    isolated: set[str] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)  # of the isolated, those out with a lost node
    actions: list[datetime] = field(default_factory=list)  # isolating actions, oldest first
    fresh_at: datetime | None = None  # newest telemetry seen
    locked_out: bool = False

    def to_json(self) -> str:
        return json.dumps(
            {
                "isolated": sorted(self.isolated),
                "lost": sorted(self.lost),
                "actions": [a.isoformat() for a in self.actions],
                "fresh_at": None if self.fresh_at is None else self.fresh_at.isoformat(),
                "locked_out": self.locked_out,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> GuardrailState:
        doc = json.loads(text)
        fresh = doc["fresh_at"]
        return cls(
            isolated=set(doc["isolated"]),
            lost=set(doc.get("lost", ())),
            actions=[datetime.fromisoformat(a) for a in doc["actions"]],
            fresh_at=None if fresh is None else datetime.fromisoformat(fresh),
            locked_out=bool(doc["locked_out"]),
        )


class Guardrail:
    """Allows or refuses each isolation and scaling step: caps per pool and rack, a rate
    limit, fail-static on stale telemetry, and a lockout a person lifts. ``devices`` maps
    each device to its (pool, rack); :meth:`register` may name its node too."""

    def __init__(
        self,
        config: GuardrailConfig,
        *,
        devices: Mapping[str, tuple[str, str]],
        state: GuardrailState | None = None,
    ) -> None:
        self.config = config
        self.devices = dict(devices)
        self.state = state if state is not None else GuardrailState()
        self._pool_size: dict[str, int] = {}
        self._rack_size: dict[str, int] = {}
        self._scaling: dict[str, list[datetime]] = {}  # scope -> recent cools
        self._floor = Sizes(0, {}, {})  # sizes a previous process counted (see resume)
        self.node_of: dict[str, str] = {}  # device -> its node, where registered with one
        self._node_devices: dict[str, set[str]] = {}
        self._named_at: dict[str, datetime] = {}  # device -> when a verdict first named it
        for pool, rack in self.devices.values():
            self._pool_size[pool] = self._pool_size.get(pool, 0) + 1
            self._rack_size[rack] = self._rack_size.get(rack, 0) + 1

    def register(
        self,
        device_uuid: str,
        *,
        pool: str,
        rack: str,
        node: str | None = None,
        at: datetime | None = None,
    ) -> None:
        """A device the guardrail had not seen (fleets grow; verdicts name their place), and
        its node, when known, named by a verdict observed at ``at`` (a whole node out is its
        pool's spare: see the blast radius). A node counts as whole only when every device
        of it was named with a time, the newest ``node_settle_s`` ago: a device resumed from
        a previous process's record (no ``at``) waits for a verdict of its own."""
        if node is not None and device_uuid not in self.node_of:
            self.node_of[device_uuid] = node
            self._node_devices.setdefault(node, set()).add(device_uuid)
        if node is not None and at is not None and device_uuid not in self._named_at:
            self._named_at[device_uuid] = at
        if device_uuid in self.devices:
            return
        self.devices[device_uuid] = (pool, rack)
        self._pool_size[pool] = self._pool_size.get(pool, 0) + 1
        self._rack_size[rack] = self._rack_size.get(rack, 0) + 1

    def sizes(self) -> Sizes:
        """The fleet as counted so far: devices, and devices per pool and per rack."""
        f, pools, racks = self._floor, self._pool_size, self._rack_size
        return Sizes(
            max(f.devices, len(self.devices)),
            {k: max(f.pools.get(k, 0), pools.get(k, 0)) for k in f.pools | pools},
            {k: max(f.racks.get(k, 0), racks.get(k, 0)) for k in f.racks | racks},
        )

    def resume(self, state: GuardrailState, sizes: Sizes) -> None:
        """Take up a previous process's state and the fleet it had counted: until as many
        devices are seen again, caps and the lockout ratio use the sizes counted then, not
        the few devices seen since the restart."""
        self.state = state
        self._floor = sizes

    def observe(self, at: datetime) -> None:
        """Telemetry observed at ``at`` arrived (keeps the guardrail from failing static)."""
        if self.state.fresh_at is None or at > self.state.fresh_at:
            self.state.fresh_at = at

    def check_scaling(
        self, scope: str, *, remove: bool, now: datetime, telemetry_at: datetime
    ) -> GuardDecision:
        """A warm (``remove=False``) or cool of replicas in ``scope`` (model and pool),
        decided on telemetry observed at ``telemetry_at``."""
        c = self.config
        self.observe(telemetry_at)
        age = (now - telemetry_at).total_seconds()
        if age > c.stale_after_s:
            return GuardDecision(
                False,
                GuardReason.STALE_TELEMETRY,
                f"telemetry {age:.0f}s old (limit {c.stale_after_s:g}s): fail static",
            )
        if not remove:
            return GuardDecision(True, GuardReason.ALLOWED, f"{scope}: adding capacity")
        if self.state.locked_out:
            return GuardDecision(False, GuardReason.LOCKED_OUT, "locked out until a person resets")
        window = timedelta(seconds=c.rate_window_s)
        recent = [a for a in self._scaling.get(scope, []) if now - a <= window]
        if len(recent) >= c.max_actions:
            return GuardDecision(
                False,
                GuardReason.RATE_LIMITED,
                f"{scope}: {len(recent)} cools in {c.rate_window_s:g}s",
            )
        self._scaling[scope] = [*recent, now]
        return GuardDecision(
            True, GuardReason.ALLOWED, f"{scope}: {len(recent) + 1} cools in window"
        )

    def cools(self, scope: str) -> list[datetime]:
        """When ``scope``'s cools within the rate window were allowed (as far as this
        guardrail knows): what a process that takes the scope over must :meth:`add_cools`."""
        return list(self._scaling.get(scope, []))

    def add_cools(self, scope: str, at: list[datetime]) -> None:
        """Count cools of ``scope`` another process allowed (at the instants ``at``)."""
        self._scaling[scope] = sorted({*self._scaling.get(scope, []), *at})

    def reset(self) -> None:
        """A person lifts the lockout."""
        self.state.locked_out = False
        self.state.actions.clear()

    def cap(self, size: int, ratio: float | None = None) -> int:
        ratio = self.config.max_isolated_ratio if ratio is None else ratio
        return max(self.config.min_isolated, math.floor(ratio * size))

    def check(self, proposal: Proposal, *, now: datetime) -> GuardDecision:
        """Decide, and when an isolation is allowed, record it."""
        s, c = self.state, self.config
        units = proposal.members or (proposal.device_uuid,)
        unknown = [d for d in units if d not in self.devices]
        if unknown:
            return GuardDecision(False, GuardReason.UNKNOWN_DEVICE, f"{', '.join(unknown)}?")
        if not proposal.isolate:
            s.isolated.difference_update(units)
            s.lost.difference_update(units)
            return GuardDecision(True, GuardReason.RESTORE, "giving capacity back is never refused")
        age = None if s.fresh_at is None else (now - s.fresh_at).total_seconds()
        if age is None or age > c.stale_after_s:
            seen = "none yet" if age is None else f"{age:.0f}s old"
            return GuardDecision(
                False,
                GuardReason.STALE_TELEMETRY,
                f"telemetry {seen} (limit {c.stale_after_s:g}s): fail static",
            )
        recent = [a for a in s.actions if now - a <= timedelta(seconds=c.lockout_window_s)]
        if s.locked_out:
            return GuardDecision(False, GuardReason.LOCKED_OUT, "locked out until a person resets")
        new = [d for d in units if d not in s.isolated]
        if not new:  # a further step on the ladder adds no radius
            return GuardDecision(True, GuardReason.ALLOWED, "already isolated; a further step")
        f, lost = self._floor, proposal.lost
        caps: tuple[tuple[GuardReason, dict[str, int], dict[str, int], float], ...]
        if proposal.hard:
            caps = ()
        elif proposal.lost:  # a dead host leaves by its health check, up to the panic share
            caps = ((GuardReason.POOL_CAP, self._pool_size, f.pools, c.lost_max_ratio),)
        else:
            caps = (
                (GuardReason.POOL_CAP, self._pool_size, f.pools, c.max_isolated_ratio),
                (GuardReason.RACK_CAP, self._rack_size, f.racks, c.rack_max_isolated_ratio),
            )
        counted = s.isolated if lost else s.isolated - s.lost  # see lost_max_ratio
        for reason, sizes, floors, ratio in caps:
            adding = Counter(self._where(d, reason) for d in new)
            for key, count in sorted(adding.items(), key=lambda kv: str(kv[0])):
                assert key is not None  # every unit is a known device (checked above)
                members = sum(1 for d in counted if self._where(d, reason) == key)
                size = max(sizes[key], floors.get(key, 0))
                limit = self.cap(size, ratio)
                if proposal.members and not members:  # a pool or rack may always lose one
                    limit = max(limit, count)  # node, the unit of failure, when nothing is out
                spare = 0  # a spare node is beside the cap (looked for only when over)
                if members + count > limit and not lost:
                    spare = self._spare_node(key, reason, counted | set(new), now)
                if members + count - spare > limit:
                    adds = f" (+{count})" if count > 1 else ""
                    spared = f", {spare} of them its spare node" if spare else ""
                    panic = " for a lost node (more looks like our view, not the fleet)"
                    return GuardDecision(
                        False,
                        reason,
                        f"{key}: {members}{adds} of {size} isolated{spared}, "
                        f"cap {limit}{panic if lost else ''}",
                    )
        in_window = [a for a in s.actions if now - a <= timedelta(seconds=c.rate_window_s)]
        if len(in_window) >= c.max_actions and not proposal.hard:
            return GuardDecision(
                False,
                GuardReason.RATE_LIMITED,
                f"{len(in_window)} isolations in {c.rate_window_s:g}s",
            )
        s.isolated.update(new)
        if lost:
            s.lost.update(new)
        s.actions = [*recent, now]
        if len(s.actions) >= c.lockout_ratio * max(len(self.devices), f.devices):
            s.locked_out = True  # this one goes through; the next ones wait for a person
        pool = (
            self.devices[proposal.device_uuid][0] if not proposal.members else proposal.device_uuid
        )
        return GuardDecision(
            True, GuardReason.ALLOWED, f"{pool}: {len(s.isolated)} isolated fleet-wide"
        )

    def node_members(self, node: str) -> tuple[str, ...]:
        """The devices of ``node`` that a verdict has named (:meth:`register` with ``at``)."""
        return tuple(sorted(d for d in self._node_devices.get(node, ()) if d in self._named_at))

    def _spare_node(self, key: str, reason: GuardReason, isolated: set[str], now: datetime) -> int:
        """The devices of the largest node of pool or rack ``key`` (``reason`` says which)
        wholly in ``isolated`` (two devices or more, each named ``node_settle_s`` ago or
        more): its spare node, not in its cap."""
        whole = 0
        settled = timedelta(seconds=self.config.node_settle_s)
        for node in {self.node_of[d] for d in isolated if d in self.node_of}:
            devices = self._node_devices[node]
            named = [self._named_at.get(d) for d in devices]
            if (
                len(devices) >= 2
                and all(at is not None and now - at >= settled for at in named)
                and devices <= isolated
                and all(self._where(d, reason) == key for d in devices)
            ):
                whole = max(whole, len(devices))
        return whole

    def _where(self, device: str, reason: GuardReason) -> str | None:
        where = self.devices.get(device)
        if where is None:
            return None
        return where[0] if reason is GuardReason.POOL_CAP else where[1]
