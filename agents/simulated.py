"""A seeded, deterministic stand-in for the node agents of a small fleet.

``SimulatedFleetAgent.tick(n)`` returns every event that N nodes x G devices
would publish at tick ``n``: one accelerator sample per device, one heartbeat
per node (with probes every ``probe_every`` ticks), one PDU reading per rack,
one serving sample per node and one demand sample per (model, region). The
same seed and start time give byte-identical events.

This is the walking skeleton's agent; the closed-loop fleet simulator (whose
state answers to commands) builds on the same layout.
"""

from __future__ import annotations

import math
import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from schemas.base import AcceleratorType, Contract
from schemas.events import (
    AcceleratorTelemetry,
    Demand,
    NodeHealth,
    PduPhase,
    PduReading,
    ProbeKind,
    ProbeResult,
    ServingMetrics,
)
from schemas.topics import ACCELERATOR, DEMAND, NODE_HEALTH, PDU, SERVING, TopicSpec

GIB = 1024**3
AGENT_VERSION = "fleetloop-sim/0.1.0"
MODELS = ("llama-70b", "mixtral-8x7b", "qwen-7b")
REGIONS = ("us-east", "eu-west")
NODES_PER_RACK = 4
RACKS_PER_POD = 8


@dataclass(frozen=True, slots=True)
class DeviceProfile:
    """Static traits of an accelerator type."""

    power_limit_watts: float
    idle_watts: float
    hbm_bytes: int | None
    sm_clock_mhz: float
    mem_clock_mhz: float | None
    reports_ecc: bool
    reports_xid: bool
    reports_nvlink: bool
    reports_memory_temp: bool


PROFILES: dict[AcceleratorType, DeviceProfile] = {
    AcceleratorType.H100: DeviceProfile(700, 90, 80 * GIB, 1980, 2619, True, True, True, True),
    AcceleratorType.B200: DeviceProfile(1000, 140, 192 * GIB, 1965, 3996, True, True, True, True),
    AcceleratorType.A100: DeviceProfile(400, 55, 80 * GIB, 1410, 1593, True, True, True, True),
    AcceleratorType.MI300X: DeviceProfile(
        750, 110, 192 * GIB, 2100, 1300, True, False, False, True
    ),
    AcceleratorType.MTIA: DeviceProfile(90, 20, 64 * GIB, 1350, None, True, False, False, False),
    AcceleratorType.CPU: DeviceProfile(350, 80, None, 3500, None, False, False, False, False),
}
TYPE_MIX = (
    AcceleratorType.H100,
    AcceleratorType.B200,
    AcceleratorType.A100,
    AcceleratorType.MI300X,
    AcceleratorType.MTIA,
)


@dataclass(frozen=True, slots=True)
class Node:
    node_id: str
    accelerator_type: AcceleratorType
    region: str
    pod_id: str
    rack_id: str
    pdu_id: str
    model: str


def build_nodes(count: int) -> list[Node]:
    """Place ``count`` nodes in racks, pods and regions; accelerator types cycle."""
    nodes = []
    for i in range(count):
        rack = i // NODES_PER_RACK
        pod = rack // RACKS_PER_POD
        nodes.append(
            Node(
                node_id=f"node-{i:05d}",
                accelerator_type=TYPE_MIX[i % len(TYPE_MIX)],
                region=REGIONS[pod % len(REGIONS)],
                pod_id=f"pod-{pod:03d}",
                rack_id=f"rack-{rack:04d}",
                pdu_id=f"pdu-{rack:04d}-a",
                model=MODELS[i % len(MODELS)],
            )
        )
    return nodes


class SimulatedFleetAgent:
    """Generates the five telemetry families for a fleet, deterministically."""

    def __init__(
        self,
        *,
        nodes: int,
        devices_per_node: int,
        seed: int,
        start: datetime,
        interval_s: float = 1.0,
        probe_every: int = 10,
    ) -> None:
        if start.tzinfo is None:
            raise ValueError("start must be timezone-aware")
        self.nodes = build_nodes(nodes)
        self.devices_per_node = devices_per_node
        self.start = start
        self.interval_s = interval_s
        self.probe_every = probe_every
        self._rng = random.Random(seed)
        self._sbe: dict[str, int] = {}
        self.racks = sorted({(n.rack_id, n.pdu_id, n.pod_id, n.region) for n in self.nodes})

    def _id(self) -> uuid.UUID:
        return uuid.UUID(int=self._rng.getrandbits(128), version=4)

    def tick(self, n: int) -> list[tuple[TopicSpec, Contract]]:
        """Every event of tick ``n``, in a fixed order."""
        at = self.start + timedelta(seconds=n * self.interval_s)
        load = 0.55 + 0.35 * math.sin(2 * math.pi * n / 600.0)
        out: list[tuple[TopicSpec, Contract]] = []
        rack_watts: dict[str, float] = {}
        for node in self.nodes:
            for d in range(self.devices_per_node):
                sample = self._device(node, d, at, load)
                rack_watts[node.rack_id] = rack_watts.get(node.rack_id, 0.0) + (
                    sample.power_usage_watts or 0.0
                )
                out.append((ACCELERATOR, sample))
            out.append((NODE_HEALTH, self._health(node, n, at)))
            out.append((SERVING, self._serving(node, at, load)))
        for rack_id, pdu_id, pod_id, region in self.racks:
            out.append((PDU, self._pdu(rack_id, pdu_id, pod_id, region, at, rack_watts)))
        for model in MODELS:
            for region in REGIONS:
                out.append((DEMAND, self._demand(model, region, at, load)))
        return out

    def first(self, count: int) -> list[tuple[TopicSpec, Contract]]:
        """Exactly the first ``count`` events, tick after tick from tick 0."""
        out: list[tuple[TopicSpec, Contract]] = []
        n = 0
        while len(out) < count:
            out.extend(self.tick(n))
            n += 1
        return out[:count]

    def _device(self, node: Node, d: int, at: datetime, load: float) -> AcceleratorTelemetry:
        p = PROFILES[node.accelerator_type]
        rng = self._rng
        util = min(1.0, max(0.0, load + rng.gauss(0.0, 0.05)))
        power = p.idle_watts + (p.power_limit_watts - p.idle_watts) * util * 0.9
        uuid_ = f"{node.node_id}-gpu{d}"
        if p.reports_ecc:
            self._sbe[uuid_] = self._sbe.get(uuid_, 0) + (1 if rng.random() < 0.01 else 0)
        sbe = self._sbe.get(uuid_) if p.reports_ecc else None
        return AcceleratorTelemetry(
            event_id=self._id(),
            observed_at=at,
            node_id=node.node_id,
            device_uuid=uuid_,
            device_index=d,
            accelerator_type=node.accelerator_type,
            region=node.region,
            pod_id=node.pod_id,
            rack_id=node.rack_id,
            pdu_id=node.pdu_id,
            gpu_temp_celsius=round(32.0 + 45.0 * util + rng.gauss(0.0, 0.5), 2),
            memory_temp_celsius=round(36.0 + 40.0 * util, 2) if p.reports_memory_temp else None,
            power_usage_watts=round(power, 1),
            power_limit_watts=p.power_limit_watts,
            sm_clock_mhz=p.sm_clock_mhz,
            mem_clock_mhz=p.mem_clock_mhz,
            gpu_util_ratio=round(util, 4),
            mem_copy_util_ratio=round(util * 0.6, 4),
            fb_used_bytes=int(p.hbm_bytes * (0.5 + 0.4 * util)) if p.hbm_bytes else None,
            fb_total_bytes=p.hbm_bytes,
            ecc_sbe_volatile_total=sbe,
            ecc_dbe_volatile_total=0 if p.reports_ecc else None,
            ecc_sbe_aggregate_total=sbe,
            ecc_dbe_aggregate_total=0 if p.reports_ecc else None,
            retired_pages_total=0 if p.reports_ecc else None,
            remapped_rows_total=0 if p.reports_ecc else None,
            xid_last=None,
            pcie_replay_total=0,
            nvlink_errors_total=0 if p.reports_nvlink else None,
            clock_throttle_reasons=0,
        )

    def _health(self, node: Node, n: int, at: datetime) -> NodeHealth:
        probes: tuple[ProbeResult, ...] = ()
        if n % self.probe_every == 0:
            probes = tuple(
                ProbeResult(
                    probe=ProbeKind.GEMM,
                    device_uuid=f"{node.node_id}-gpu{d}",
                    passed=True,
                    duration_s=0.25,
                    achieved_per_s=PROFILES[node.accelerator_type].power_limit_watts * 1e12,
                    expected_ratio=round(1.0 + self._rng.gauss(0.0, 0.01), 4),
                )
                for d in range(self.devices_per_node)
            )
        return NodeHealth(
            event_id=self._id(),
            observed_at=at,
            node_id=node.node_id,
            region=node.region,
            pod_id=node.pod_id,
            rack_id=node.rack_id,
            agent_version=AGENT_VERSION,
            heartbeat_seq=n,
            uptime_s=3600.0 + n * self.interval_s,
            probes=probes,
        )

    def _serving(self, node: Node, at: datetime, load: float) -> ServingMetrics:
        rng = self._rng
        batch = max(1, int(32 * load))
        tpot = 0.012 + 0.02 * load + abs(rng.gauss(0.0, 0.001))
        return ServingMetrics(
            event_id=self._id(),
            observed_at=at,
            replica_id=f"{node.node_id}/{node.model}",
            node_id=node.node_id,
            model=node.model,
            pool=f"{node.model}/{node.accelerator_type}",
            region=node.region,
            accelerator_type=node.accelerator_type,
            interval_s=self.interval_s,
            tpot_p50_s=round(tpot, 5),
            tpot_p95_s=round(tpot * 1.4, 5),
            ttft_p50_s=round(0.15 + 0.3 * load, 4),
            ttft_p95_s=round(0.3 + 0.8 * load, 4),
            queue_depth=int(20 * load * load),
            batch_size=batch,
            kv_cache_util_ratio=round(min(1.0, 0.2 + 0.7 * load), 4),
            tokens_per_s=round(batch / tpot, 1),
            requests=int(50 * load),
            errors=1 if rng.random() < 0.01 else 0,
        )

    def _pdu(
        self,
        rack_id: str,
        pdu_id: str,
        pod_id: str,
        region: str,
        at: datetime,
        rack_watts: dict[str, float],
    ) -> PduReading:
        watts = rack_watts.get(rack_id, 0.0) + 1200.0  # hosts, fans, switches
        return PduReading(
            event_id=self._id(),
            observed_at=at,
            pdu_id=pdu_id,
            rack_id=rack_id,
            pod_id=pod_id,
            region=region,
            phase=PduPhase.L1,
            power_watts=round(watts, 1),
            capacity_watts=40_000.0,
            breaker_limit_watts=36_000.0,
            voltage_volts=415.0,
            current_amperes=round(watts / 415.0, 2),
        )

    def _demand(self, model: str, region: str, at: datetime, load: float) -> Demand:
        requests = max(0, round(200 * load + self._rng.gauss(0.0, 5.0)))
        return Demand(
            event_id=self._id(),
            observed_at=at,
            model=model,
            region=region,
            interval_s=self.interval_s,
            requests=requests,
            prompt_tokens=requests * 900,
            generated_tokens=requests * 180,
        )
