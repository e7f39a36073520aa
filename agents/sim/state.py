"""The simulated fleet's state: devices, nodes, racks and the router's table.

Plain mutable records; :class:`agents.sim.fleet.Fleet` steps them and the
controls in :mod:`agents.sim.control` change them. The router's table also
holds the router's own fast decisions, made per replica as the fleet steps:
how much optional work a replica takes (its shedder), whether its route is open
(its circuit breaker), and which errors are retried (the retry budget).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from agents.collectors.base import NodeIdentity
from agents.sim.hardware import CLOCK_LOW_FACTOR, AcceleratorSpec
from controllers.shedding import (
    Admission,
    CircuitBreaker,
    LoadShedder,
    RetryBudget,
    ShedConfig,
    WorkClass,
)
from schemas.base import AcceleratorType, pool_name
from schemas.commands import ClockMode

INLET_CELSIUS = 25.0


class AdminState(StrEnum):
    """What a device accepts, set by the node executor (the isolation ladder)."""

    ACTIVE = "active"
    DEWEIGHTED = "deweighted"
    NO_NEW_SESSIONS = "no_new_sessions"
    DRAINING = "draining"
    QUARANTINED = "quarantined"


@dataclass(slots=True)
class Device:
    uuid: str
    index: int
    node: Node
    spec: AcceleratorSpec
    model: str | None = None
    ready_at_s: float = 0.0  # serving once the step time reaches this (loading before)
    admin: AdminState = AdminState.ACTIVE
    weight_ratio: float = 1.0
    power_cap_watts: float = 0.0
    clock_mode: ClockMode = ClockMode.DEFAULT
    temp_celsius: float = INLET_CELSIUS + 10.0
    cap_clock: float = 1.0  # clock ratio the power cap allows
    thermal_clock: float = 1.0  # clock ratio hardware slowdown allows
    clock_ratio: float = 1.0
    health: float = 1.0  # speed relative to a sound device (below 1 when grey-failing)
    power_watts: float = 0.0
    busy_ratio: float = 0.0
    queue: float = 0.0
    offered_rps: float = 0.0
    served_rps: float = 0.0  # baseline, batch and optional work
    optional_rps: float = 0.0  # of which optional
    batch_rps: float = 0.0  # of which deferrable batch work
    batch_offered_rps: float = 0.0  # batch work placed here this step
    rejected: float = 0.0
    errors: float = 0.0
    batch: float = 0.0
    tpot_s: float = 0.0
    ttft_s: float = 0.0
    throttle_reasons: int = 0
    sbe_volatile: int = 0
    sbe_aggregate: int = 0
    dbe_volatile: int = 0
    dbe_aggregate: int = 0
    retired_pages: int = 0
    remapped_rows: int = 0
    xid: int | None = None  # raised during the last step
    failed: bool = False  # double-bit fault: still reports, serves only errors
    lost: bool = False  # fell off the bus: reports nothing

    @property
    def clock_ceiling(self) -> float:
        """The clock ratio the clock mode and hardware slowdown allow (the power cap aside)."""
        mode = CLOCK_LOW_FACTOR if self.clock_mode is ClockMode.LOW else 1.0
        return min(mode, self.thermal_clock)

    def serving(self, t_s: float) -> bool:
        return self.model is not None and t_s >= self.ready_at_s and not self.node.down

    @property
    def pool(self) -> str:
        return pool_name(self.node.region, self.spec.kind)


@dataclass(slots=True)
class Node:
    node_id: str
    index: int
    kind: AcceleratorType
    region: str
    pod_id: str
    rack_id: str
    pdu_id: str
    devices: list[Device] = field(default_factory=list)
    crashed: bool = False  # by a fault
    tripped: bool = False  # by its rack's breaker
    heartbeat_seq: int = 0
    booted_at_s: float = -3600.0

    @property
    def down(self) -> bool:
        return self.crashed or self.tripped

    @property
    def identity(self) -> NodeIdentity:
        return NodeIdentity(self.node_id, self.region, self.pod_id, self.rack_id, self.pdu_id)


@dataclass(slots=True)
class Rack:
    rack_id: str
    pdu_id: str
    pod_id: str
    region: str
    nodes: list[Node]
    capacity_watts: float
    breaker_limit_watts: float
    power_watts: float = 0.0
    limit_ratio: float = 1.0  # below 1 while a feed is degraded
    over_since_s: float | None = None
    tripped: bool = False

    @property
    def effective_limit_watts(self) -> float:
        return self.breaker_limit_watts * self.limit_ratio


@dataclass(slots=True)
class RouterTable:
    """The router's state: pool weights per model, ejections, admission, batch caps."""

    pool_weights: dict[tuple[str, str], float] = field(default_factory=dict)  # (model, pool)
    ejected: set[str] = field(default_factory=set)  # device uuids
    # device uuid -> its replica's weight in its pool (power-aware routing; absent: 1)
    replica_weights: dict[str, float] = field(default_factory=dict)
    admission_ratio: dict[str, float] = field(default_factory=dict)  # pool
    batch_size_max: dict[str, int] = field(default_factory=dict)  # pool
    optional_budget_ratio: dict[str, float] = field(default_factory=dict)  # pool
    # pool -> how its budget is spent (extra candidates per request, share upgraded)
    optional_levers: dict[str, dict[str, float]] = field(default_factory=dict)
    # each replica's local shedder: optional work it takes, by its own queue's delay
    shedders: dict[str, LoadShedder] = field(default_factory=dict)  # device uuid
    breakers: dict[str, CircuitBreaker] = field(default_factory=dict)  # device uuid
    retry_budgets: dict[tuple[str, str], RetryBudget] = field(default_factory=dict)
    retries: dict[tuple[str, str], float] = field(default_factory=dict)  # rps for next step
    retried_total: float = 0.0  # requests retried so far
    tpot_target_s: float = 0.072  # the TPOT the router fills optional work up to

    def route_open(self, uuid: str, now: datetime) -> bool:
        """Whether the route to this replica takes traffic (its breaker closed or probing)."""
        breaker = self.breakers.get(uuid)
        return breaker is None or breaker.allow(now=now)

    def record_step(self, dev: Device, key: tuple[str, str], now: datetime, dt: float) -> None:
        """After a step: the route's outcome to its breaker (a step that errored on most
        of its requests is a failure), and its errors retried next step on the same
        model and region, as far as the retry budget allows."""
        requests = dev.served_rps * dt
        if requests <= 0:
            return
        breaker = self.breakers.setdefault(dev.uuid, CircuitBreaker(min_calls=5, window=10))
        breaker.record(ok=dev.errors <= 0.5 * requests, now=now)
        budget = self.retry_budgets.setdefault(key, RetryBudget(ratio=0.1, burst=50.0))
        budget.on_requests(requests)
        if dev.errors > 0:
            granted = budget.grant(dev.errors)
            self.retried_total += granted
            self.retries[key] = self.retries.get(key, 0.0) + granted / dt

    def optional_rps(
        self, dev: Device, capacity_rps: float, spare_rps: float, room_rps: float
    ) -> float:
        """Optional work this replica serves now: the pool's budget share of its room (the
        rate it can serve with TPOT at ``tpot_target_s``), degraded (halved) or dropped by
        its shedder as its queue grows, and never more than what baseline work leaves spare
        (baseline never waits for it); none on a device a power cap holds down."""
        budget = self.optional_budget_ratio.get(dev.pool, 0.0)
        if budget <= 0 or capacity_rps <= 0 or room_rps <= 0 or dev.cap_clock < 1.0:
            # a device its power cap holds down has no spare: the watts optional work would
            # draw come out of the clock baseline work runs at
            return 0.0
        shedder = self.shedders.get(dev.uuid)
        if shedder is None:
            shedder = self.shedders[dev.uuid] = LoadShedder(ShedConfig())
        verdict = shedder.admit(WorkClass.OPTIONAL, queue_delay_s=dev.queue / capacity_rps)
        share = {Admission.ADMIT: 1.0, Admission.DEGRADE: 0.5, Admission.DROP: 0.0}[verdict]
        return max(0.0, min(budget * room_rps * share, spare_rps))

    def weight(self, model: str, pool: str) -> float:
        return self.pool_weights.get((model, pool), self.pool_weights.get(("*", pool), 1.0))
