"""The closed-loop fleet simulator: state that answers to commands.

Each step of ``interval_s`` simulated seconds:

1. demand per (model, region) from the demand source, scaled to the fleet,
   times any spike, plus any cold-model demand;
2. routing: each region's demand is split over the replicas serving the model
   there, in proportion to ``pool weight x replica weight x device weight x
   capacity`` (the router's table; the replica weight is power-aware routing's);
   a region with no replica spills to the others; crashed hosts refuse
   connections, so the router skips them; a failed device takes traffic and
   errors until its route's circuit breaker opens, and errors are retried
   next step as far as the retry budget of the model and region allows;
3. per device: a request queue served at ``capacity x clock x health``
   (``agents.sim.hardware``), busy ratio, batch size by Little's law, TPOT
   and TTFT from batch, queue, clocks and health;
4. power ``idle + (limit - idle) x busy x clock^2``, held under the power cap by
   lowering clocks; a first-order thermal model
   ``T += (inlet + R x P - T) x (1 - exp(-dt / tau))`` with hardware slowdown
   above ``slowdown_celsius`` and loss of the device above ``shutdown_celsius``;
5. correctable ECC errors as a Poisson rate that climbs during a storm and
   ends in a double-bit fault; XIDs; a rack whose draw stays above its breaker
   limit for ``trip_after_s`` trips and takes its nodes down.

Telemetry for the step is built by :mod:`agents.sim.telemetry`. Randomness
comes from one generator seeded by the scenario, so the same seed, scenario and
commands at the same steps give the same run.
"""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta

from agents.sim.batch import BatchWork
from agents.sim.demand import DemandSource
from agents.sim.faults import ActiveFaults, FaultClock
from agents.sim.hardware import (
    ACCELERATORS,
    MODELS,
    REGIONS,
    SERVED_AT_START,
    node_type,
)
from agents.sim.scenario import FleetSpec, ScenarioError
from agents.sim.state import (
    INLET_CELSIUS,
    AdminState,
    Device,
    Node,
    Rack,
    RouterTable,
)
from schemas.base import AcceleratorType
from schemas.dcgm import (
    CLOCKS_HW_POWER_BRAKE,
    CLOCKS_HW_SLOWDOWN,
    CLOCKS_HW_THERMAL,
    CLOCKS_SW_POWER_CAP,
)

NODES_PER_RACK = 4
RACKS_PER_POD = 2
NODE_BASE_WATTS = 600.0  # CPUs, NICs, fans per node
BATCH_MAX = 256
DOUBLING_BATCH = 128.0  # a sequence's token takes twice as long in a batch of this size
QUEUE_LIMIT_S = 30.0  # a queue longer than this many seconds of service rejects requests
BASE_SBE_PER_S = 2e-4
BREAKER_RATIO = 0.6  # racks are oversubscribed: the breaker is well below the nameplate sum


def _batch_throughput(batch: float) -> float:
    """Sequences a token time carries at a running batch of ``batch`` (each token takes
    ``1 + batch / DOUBLING_BATCH`` times a lone sequence's)."""
    return batch / (1.0 + batch / DOUBLING_BATCH)


class Fleet:
    """The simulated fleet; ``step()`` advances it by one interval."""

    def __init__(
        self,
        spec: FleetSpec,
        *,
        start: datetime,
        demand: DemandSource,
        faults: FaultClock,
        load_ratio: float = 0.55,
        batch_ratio: float = 0.0,
    ) -> None:
        if start.tzinfo is None:
            raise ValueError("start must be timezone-aware")
        self.spec = spec
        self.start = start
        self.n = 0  # steps taken
        self.rng = random.Random(spec.seed)
        self.demand = demand
        self.faults = faults
        self.router = RouterTable()
        self.batch = BatchWork(ratio=batch_ratio)
        self.nodes: list[Node] = []
        self.racks: list[Rack] = []
        self.devices: dict[str, Device] = {}
        self._place(spec)
        self._nodes_by_id = {n.node_id: n for n in self.nodes}
        self.scale = self._demand_scale(load_ratio)
        self.offered: dict[tuple[str, str], float] = {}  # (model, region) -> rps this step
        self.lengths: dict[tuple[str, str], tuple[float, float]] = {}  # prompt, generated
        self.unserved: dict[tuple[str, str], float] = {}

    # -- layout -------------------------------------------------------------------------------

    def _place(self, spec: FleetSpec) -> None:
        served = spec.devices_per_node - min(spec.spare_devices_per_node, spec.devices_per_node - 1)
        unknown = sorted({k.value for k in spec.type_mix or ()} - {k.value for k in ACCELERATORS})
        if unknown:
            raise ScenarioError(
                f"fleet.type_mix: the simulator models no {unknown}; "
                f"it models {sorted(k.value for k in ACCELERATORS)}"
            )
        for i in range(spec.nodes):
            rack = i // NODES_PER_RACK
            pod = rack // RACKS_PER_POD
            kind = node_type(i, spec.type_mix)
            node = Node(
                f"node-{i:05d}",
                i,
                kind,
                REGIONS[pod % len(REGIONS)],
                f"pod-{pod:03d}",
                f"rack-{rack:04d}",
                f"pdu-{rack:04d}-a",
            )
            hw = ACCELERATORS[kind]
            fitting = [m for m in SERVED_AT_START if hw.serves_well(MODELS[m])]
            for d in range(spec.devices_per_node):
                dev = Device(
                    f"{node.node_id}-gpu{d}", d, node, hw, power_cap_watts=hw.power_limit_watts
                )
                if d < served and fitting:
                    dev.model = fitting[(i + d) % len(fitting)]
                node.devices.append(dev)
                self.devices[dev.uuid] = dev
            self.nodes.append(node)
        for r in range(0, len(self.nodes), NODES_PER_RACK):
            members = self.nodes[r : r + NODES_PER_RACK]
            nominal = sum(
                NODE_BASE_WATTS + d.spec.power_limit_watts for n in members for d in n.devices
            )
            first = members[0]
            self.racks.append(
                Rack(
                    first.rack_id,
                    first.pdu_id,
                    first.pod_id,
                    first.region,
                    members,
                    capacity_watts=round(nominal, -2),
                    breaker_limit_watts=round(BREAKER_RATIO * nominal, -2),
                )
            )

    def _demand_scale(self, load_ratio: float) -> dict[tuple[str, str], float]:
        """Requests/s per unit of source rate, so the mean load is ``load_ratio``."""
        capacity: dict[tuple[str, str], float] = {}
        for dev in self.devices.values():
            if dev.model is not None:
                key = (dev.model, dev.node.region)
                m = MODELS[dev.model]
                capacity[key] = capacity.get(key, 0.0) + dev.spec.capacity_tokens_per_s(m) / (
                    m.generated_tokens
                )
        scale = {}
        for (model, region), rps in capacity.items():
            mean = self.demand.mean_rps(model, region)
            scale[(model, region)] = load_ratio * rps / mean if mean > 0 else 0.0
        return scale

    @property
    def interval_s(self) -> float:
        return self.spec.interval_s

    @property
    def t_s(self) -> float:
        """Simulated seconds since the start, at the end of the last step."""
        return self.n * self.spec.interval_s

    @property
    def now(self) -> datetime:
        return self.start + timedelta(seconds=self.t_s)

    def node(self, node_id: str) -> Node | None:
        return self._nodes_by_id.get(node_id)

    # -- one step -----------------------------------------------------------------------------

    def step(self) -> None:
        """Advance one interval (the state then describes the end of it)."""
        self.n += 1
        t, dt = self.t_s, self.spec.interval_s
        active = self.faults.active(t, self)
        self._apply_node_faults(active, t)
        self._route(active, t)
        at = self.now  # the routers' breakers run on event time
        if self.batch.active:
            serving = [d for d in self.devices.values() if self._runs_batch(d, t)]
            self.batch.place([(d, self._capacity_rps(d)) for d in serving], dt=dt)
        for dev in self.devices.values():
            self._serve(dev, active, t, dt)
            self._heat(dev, active, dt)
            self._errors(dev, active, t, dt)
            if dev.model is not None:
                self.router.record_step(dev, (dev.model, dev.node.region), at, dt)
        self._racks(active, t)

    def _apply_node_faults(self, active: ActiveFaults, at_s: float) -> None:
        for node in self.nodes:
            crashed = node.node_id in active.crashed_nodes
            if node.crashed and not crashed:  # reboot: models reload before serving
                self._reboot(node, at_s)
            node.crashed = crashed
        for dev in self.devices.values():
            if (dev.failed or dev.lost) and dev.uuid in active.repaired:
                self._repair(dev, at_s)

    def _reboot(self, node: Node, at_s: float) -> None:
        node.booted_at_s = at_s
        for dev in node.devices:
            self._cold_start(dev, at_s)

    def _repair(self, dev: Device, at_s: float) -> None:
        """The device was swapped: a sound one, starting cold."""
        dev.failed = dev.lost = False
        dev.thermal_clock = 1.0
        self._cold_start(dev, at_s)

    @staticmethod
    def _cold_start(dev: Device, at_s: float) -> None:
        """Power on: empty queue, cool, volatile counters cleared, its model reloading."""
        dev.queue = 0.0
        dev.temp_celsius = INLET_CELSIUS + 10.0
        dev.sbe_volatile = dev.dbe_volatile = 0
        if dev.model is not None:
            dev.ready_at_s = at_s + dev.spec.load_time_s(MODELS[dev.model])

    def _runs_batch(self, dev: Device, at_s: float) -> bool:
        return (
            dev.model is not None
            and dev.serving(at_s)
            and not (dev.lost or dev.failed or dev.node.down)
            and self.device_weight(dev) > 0
        )

    @staticmethod
    def _capacity_rps(dev: Device) -> float:
        """Requests a second at full clocks: what the batch scheduler places by."""
        assert dev.model is not None
        m = MODELS[dev.model]
        return dev.spec.capacity_tokens_per_s(m) / m.generated_tokens

    def device_weight(self, dev: Device) -> float:
        if dev.uuid in self.router.ejected:
            return 0.0
        if dev.admin is AdminState.ACTIVE:
            return 1.0
        if dev.admin is AdminState.DEWEIGHTED:
            return dev.weight_ratio
        return 0.0

    def _route(self, active: ActiveFaults, at_s: float) -> None:
        for dev in self.devices.values():
            dev.offered_rps = dev.rejected = dev.errors = 0.0
            dev.batch_offered_rps = dev.batch_rps = 0.0
        self.offered.clear()
        self.unserved.clear()
        candidates: dict[tuple[str, str], list[tuple[Device, float]]] = {}
        at = self.now
        for dev in self.devices.values():
            if dev.model is None or not dev.serving(at_s) or dev.lost:
                continue
            # the router balances by replica capacity (what a least-loaded policy converges to)
            m = MODELS[dev.model]
            w = (
                self.router.weight(dev.model, dev.pool)
                * self.router.replica_weights.get(dev.uuid, 1.0)
                * self.device_weight(dev)
                * (dev.spec.capacity_tokens_per_s(m) / m.generated_tokens)
            )
            if w > 0 and self.router.route_open(dev.uuid, at):
                candidates.setdefault((dev.model, dev.node.region), []).append((dev, w))
        for model in MODELS:
            for region in REGIONS:
                o = self.demand.at(model, region, at_s)
                rps = self.scale.get((model, region), 0.0) * o.rps
                rps = rps * active.demand_factor(model, region) + active.cold_rps(model, region)
                rps += self.router.retries.pop((model, region), 0.0)
                if rps <= 0:
                    continue
                self.offered[(model, region)] = rps
                spec = MODELS[model]
                self.lengths[(model, region)] = (
                    o.prompt_tokens or spec.prompt_tokens,
                    o.generated_tokens or spec.generated_tokens,
                )
                targets = candidates.get((model, region)) or [
                    c for r in REGIONS for c in candidates.get((model, r), [])
                ]
                total = sum(w for _, w in targets)
                if total <= 0:
                    self.unserved[(model, region)] = rps
                    continue
                for dev, w in targets:
                    admit = self.router.admission_ratio.get(dev.pool, 1.0)
                    dev.offered_rps += rps * w / total * admit
                    dev.rejected += rps * w / total * (1.0 - admit)

    def _serve(self, dev: Device, active: ActiveFaults, at_s: float, dt: float) -> None:
        if dev.node.down or dev.lost:
            dev.busy_ratio = dev.served_rps = dev.batch = 0.0
            dev.power_watts = 0.0
            return
        dev.health = 1.0 / (1.0 + active.slowdown.get(dev.uuid, 0.0))
        # a serving stack's own slowness (a model's rollout) slows what it serves, not the chip
        health = dev.health / (1.0 + active.serving_slowdown.get(dev.uuid, 0.0))
        dev.clock_ratio = min(
            dev.clock_ceiling, dev.cap_clock, active.brake.get(dev.node.rack_id, 1.0)
        )
        if dev.model is None or not dev.serving(at_s):
            loading = dev.model is not None
            dev.busy_ratio = 0.3 if loading else 0.0
            dev.served_rps = dev.batch = dev.queue = 0.0
            dev.tpot_s = dev.ttft_s = 0.0
            return
        m = MODELS[dev.model]
        if dev.admin is AdminState.QUARANTINED:
            dev.queue = 0.0
        capacity_rps = (
            dev.spec.capacity_tokens_per_s(m) * dev.clock_ratio * health / (m.generated_tokens)
        )
        cap = self.router.batch_size_max.get(dev.pool)
        tpot = dev.spec.tpot_base_s(m) / (dev.clock_ratio * health)
        if cap is not None and cap < BATCH_MAX:
            # a batch cap bounds concurrency: fewer tokens per second, as a batch's throughput
            # goes (``b / (1 + b / DOUBLING_BATCH)``), relative to the most the device
            # runs uncapped, so a cap back at the ceiling is no cap at all
            capacity_rps *= _batch_throughput(cap) / _batch_throughput(BATCH_MAX)
        arrived = dev.offered_rps * dt
        served = min(capacity_rps * dt, dev.queue + arrived)
        dev.queue = dev.queue + arrived - served
        limit = capacity_rps * QUEUE_LIMIT_S
        if dev.queue > limit:
            dev.rejected += dev.queue - limit
            dev.queue = limit
        # batch, then optional work, only where the router sends work at all (not drained,
        # ejected...), from what baseline leaves spare: baseline never waits for either
        spare = capacity_rps - served / dt if self.device_weight(dev) > 0 else 0.0
        dev.batch_rps = min(dev.batch_offered_rps, max(0.0, spare))
        self.batch.defer(dev.pool, (dev.batch_offered_rps - dev.batch_rps) * dt)
        spare -= dev.batch_rps
        # the batch at which TPOT reaches the router's target, as a rate (Little's law)
        target = self.router.tpot_target_s
        room = max(0.0, DOUBLING_BATCH * (target / tpot - 1)) / (m.generated_tokens * target)
        dev.optional_rps = self.router.optional_rps(dev, capacity_rps, spare, room)
        dev.served_rps = served / dt + dev.batch_rps + dev.optional_rps
        dev.busy_ratio = min(1.0, dev.served_rps / capacity_rps) if capacity_rps > 0 else 0.0
        dev.batch = min(float(cap or BATCH_MAX), dev.served_rps * m.generated_tokens * tpot)
        dev.tpot_s = tpot * (1.0 + dev.batch / DOUBLING_BATCH)
        wait_s = dev.queue / capacity_rps if capacity_rps > 0 else QUEUE_LIMIT_S
        prefill_s = m.prompt_tokens / (dev.spec.prefill_tokens_per_s * dev.clock_ratio * health)
        dev.ttft_s = prefill_s * (1.0 + dev.batch / 256.0) + wait_s
        if dev.failed:
            dev.errors = dev.served_rps * dt
        xid_errors = active.xid_error_ratio.get(dev.uuid, 0.0)
        if dev.xid is not None and xid_errors > 0:
            dev.errors += xid_errors * dev.served_rps * dt

    def _heat(self, dev: Device, active: ActiveFaults, dt: float) -> None:
        hw = dev.spec
        reasons = 0
        if dev.node.down or dev.lost:
            dev.temp_celsius += (INLET_CELSIUS - dev.temp_celsius) * (1 - math.exp(-dt / 120.0))
            dev.throttle_reasons = 0
            return
        # Dynamic power ~ f * V^2 with voltage tracking the clock: serving ``work`` (the share
        # of full-clock capacity in use) at clock c draws idle + (limit - idle) * work * c.
        # The firmware holds the cap within a step and picks the clock for the next one.
        dyn_max = hw.power_limit_watts - hw.idle_watts
        work = dev.busy_ratio * dev.clock_ratio
        dev.power_watts = min(
            hw.idle_watts + dyn_max * work * dev.clock_ratio,
            max(hw.idle_watts, dev.power_cap_watts),
        )
        if work > 0 and hw.idle_watts + dyn_max * work * dev.clock_ceiling > dev.power_cap_watts:
            reasons |= CLOCKS_SW_POWER_CAP
            dev.cap_clock = max(0.2, (dev.power_cap_watts - hw.idle_watts) / (dyn_max * work))
        else:
            dev.cap_clock = 1.0
        inlet = INLET_CELSIUS + active.inlet_rise.get(dev.node.node_id, 0.0)
        resistance = hw.thermal_resistance_c_per_watt * active.resistance.get(dev.node.node_id, 1.0)
        steady = inlet + resistance * dev.power_watts
        dev.temp_celsius += (steady - dev.temp_celsius) * (
            1 - math.exp(-dt / hw.thermal_time_constant_s)
        )
        if dev.temp_celsius >= hw.slowdown_celsius:
            dev.thermal_clock = max(0.3, dev.thermal_clock - 0.1 * dt)
            reasons |= CLOCKS_HW_SLOWDOWN | CLOCKS_HW_THERMAL
        elif dev.temp_celsius < hw.slowdown_celsius - 3.0:
            dev.thermal_clock = min(1.0, dev.thermal_clock + 0.05 * dt)
        if dev.thermal_clock < 1.0:
            reasons |= CLOCKS_HW_SLOWDOWN
        if active.brake.get(dev.node.rack_id, 1.0) < 1.0:  # the rack asserts the brake
            reasons |= CLOCKS_HW_SLOWDOWN | CLOCKS_HW_POWER_BRAKE
        dev.throttle_reasons = reasons
        if dev.temp_celsius >= hw.shutdown_celsius:
            dev.lost = True
            self.faults.record(t_s=self.t_s, what="device_lost_overheat", target=dev.uuid)
            dev.xid = 79 if hw.reports_xid else None

    def _errors(self, dev: Device, active: ActiveFaults, at_s: float, dt: float) -> None:
        if dev.lost:
            return
        dev.xid = None
        if dev.node.down:
            return
        rate = active.sbe_rate.get(dev.uuid, BASE_SBE_PER_S)
        sbe = poisson(self.rng, rate * dt)
        dev.sbe_volatile += sbe
        dev.sbe_aggregate += sbe
        if dev.uuid in active.dbe_now and not dev.failed:
            dev.failed = True
            dev.dbe_volatile += 1
            dev.dbe_aggregate += 1
            if dev.spec.kind in (AcceleratorType.A100, AcceleratorType.H100, AcceleratorType.B200):
                dev.remapped_rows += 1
            else:
                dev.retired_pages += 1
            dev.xid = 48 if dev.spec.reports_xid else None
            self.faults.record(t_s=at_s, what="double_bit_ecc", target=dev.uuid)
        xid = active.xid.get(dev.uuid)
        if xid is not None and dev.spec.reports_xid and self.rng.random() < dt / xid[1]:
            dev.xid = xid[0]
            # what a flap threw is chance (a short one may throw one XID, or none): the
            # evaluation says so of a flap it missed
            self.faults.record(t_s=at_s, what="xid", target=dev.uuid, xid=float(xid[0]))

    def _racks(self, active: ActiveFaults, at_s: float) -> None:
        for rack in self.racks:
            was_tripped = rack.tripped
            rack.limit_ratio = active.breaker_ratio.get(rack.rack_id, 1.0)
            if rack.tripped and rack.rack_id not in active.breaker_ratio:
                rack.tripped = False  # the feed is repaired and the breaker reset
            rack.power_watts = sum(
                (0.0 if n.down else NODE_BASE_WATTS) + sum(d.power_watts for d in n.devices)
                for n in rack.nodes
            )
            trip_after_s = active.trip_after_s.get(rack.rack_id, 10.0)
            if rack.power_watts > rack.effective_limit_watts and not rack.tripped:
                rack.over_since_s = rack.over_since_s if rack.over_since_s is not None else at_s
                if at_s - rack.over_since_s >= trip_after_s:
                    rack.tripped = True
                    self.faults.record(t_s=at_s, what="breaker_trip", target=rack.rack_id)
            elif rack.power_watts <= rack.effective_limit_watts:
                if rack.over_since_s is not None and not rack.tripped:  # how close it came
                    self.faults.record(
                        t_s=at_s, what="over_breaker_limit", target=rack.rack_id,
                        duration_s=round(at_s - rack.over_since_s, 3), trip_after_s=trip_after_s,
                    )  # fmt: skip
                rack.over_since_s = None
            for node in rack.nodes:
                if was_tripped and not rack.tripped:
                    self._reboot(node, at_s)
                node.tripped = rack.tripped


def poisson(rng: random.Random, lam: float) -> int:
    """Poisson draw; Knuth for small means, normal approximation for large ones."""
    if lam <= 0:
        return 0
    if lam > 30:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    threshold, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= threshold:
            return k
        k += 1
