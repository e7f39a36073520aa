"""What the simulated fleet's agents publish after a step: the five telemetry families.

A node that is down publishes nothing (its heartbeats stop); a device lost off
the bus publishes no samples and fails its probes; a PDU keeps reporting (its
meter is upstream of the breaker). Fields a device type cannot report are null.
Counts are rounded stochastically from the fleet's generator, so totals over a
run match the simulated rates.
"""

from __future__ import annotations

import random
import uuid
from datetime import datetime

from agents.collectors.base import heartbeat
from agents.sim.fleet import BATCH_MAX, Fleet
from agents.sim.hardware import GIB, MODELS
from agents.sim.state import Device, Node, Rack
from schemas.base import Contract
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

AGENT_VERSION = "fleetloop-sim/0.2.0"
Record = tuple[TopicSpec, Contract]


class TelemetryBuilder:
    """Turns fleet state into events; owns the generator for ids and sensor noise."""

    def __init__(self, fleet: Fleet, *, seed: int) -> None:
        self.fleet = fleet
        self.rng = random.Random(seed * 7919 + 1)
        # ids from their own generator, seeded by the run's start as well: a restarted
        # simulator replays the same fleet, but its events are new events with new ids (the
        # sink stores each id once, so a collision with a past run would lose an event)
        self._ids = random.Random(f"{seed}/{fleet.start.isoformat()}")

    def _id(self) -> uuid.UUID:
        return uuid.UUID(int=self._ids.getrandbits(128), version=4)

    def _count(self, value: float) -> int:
        """Stochastic rounding: E[count] == x."""
        whole = int(value)
        return whole + (1 if self.rng.random() < value - whole else 0)

    def events(self) -> list[Record]:
        """Every event of the step just taken, in a fixed order."""
        f = self.fleet
        at = f.now
        out: list[Record] = []
        probes_due = (f.n - 1) % max(1, round(f.spec.probe_every_s / f.interval_s)) == 0
        for node in f.nodes:
            if node.down:
                continue
            node.heartbeat_seq += 1
            for dev in node.devices:
                if not dev.lost:
                    out.append((ACCELERATOR, self.device_sample(dev, at)))
            out.append((NODE_HEALTH, self._health(node, at, probes_due)))
            for dev in node.devices:
                if dev.model is not None and dev.serving(f.t_s) and not dev.lost:
                    out.append((SERVING, self._serving(dev, at)))
        for rack in f.racks:
            out.append((PDU, self._pdu(rack, at)))
        for (model, region), rps in sorted(f.offered.items()):
            out.append((DEMAND, self._demand(model, region, rps, at)))
        return out

    def device_sample(self, dev: Device, at: datetime | None = None) -> AcceleratorTelemetry:
        """One accelerator sample of ``dev`` as it is now."""
        at = at or self.fleet.now
        hw, node, rng = dev.spec, dev.node, self.rng
        ecc = hw.reports_ecc
        weights = MODELS[dev.model].weights_bytes if dev.model else 2 * GIB
        fb_used = None
        if hw.hbm_bytes is not None:
            fb_used = min(
                hw.hbm_bytes, int(weights + dev.busy_ratio * 0.6 * (hw.hbm_bytes - weights))
            )
        temp = min(250.0, dev.temp_celsius + rng.gauss(0.0, 0.3))
        return AcceleratorTelemetry(
            event_id=self._id(),
            observed_at=at,
            node_id=node.node_id,
            device_uuid=dev.uuid,
            device_index=dev.index,
            accelerator_type=hw.kind,
            region=node.region,
            pod_id=node.pod_id,
            rack_id=node.rack_id,
            pdu_id=node.pdu_id,
            gpu_temp_celsius=round(temp, 2),
            memory_temp_celsius=round(temp + 4.0, 2) if hw.reports_memory_temp else None,
            power_usage_watts=round(max(0.0, dev.power_watts + rng.gauss(0.0, 2.0)), 1),
            power_limit_watts=dev.power_cap_watts,
            power_limit_min_watts=hw.min_power_limit_watts,
            power_limit_max_watts=hw.power_limit_watts,
            sm_clock_mhz=round(hw.sm_clock_mhz * dev.clock_ratio, 1),
            mem_clock_mhz=hw.mem_clock_mhz,
            gpu_util_ratio=round(dev.busy_ratio, 4),
            mem_copy_util_ratio=round(dev.busy_ratio * 0.6, 4),
            fb_used_bytes=fb_used,
            fb_total_bytes=hw.hbm_bytes,
            ecc_sbe_volatile_total=dev.sbe_volatile if ecc else None,
            ecc_dbe_volatile_total=dev.dbe_volatile if ecc else None,
            ecc_sbe_aggregate_total=dev.sbe_aggregate if ecc else None,
            ecc_dbe_aggregate_total=dev.dbe_aggregate if ecc else None,
            retired_pages_total=dev.retired_pages if ecc else None,
            remapped_rows_total=dev.remapped_rows if ecc else None,
            xid_last=dev.xid if hw.reports_xid else None,
            pcie_replay_total=0,
            nvlink_errors_total=0 if hw.reports_nvlink else None,
            clock_throttle_reasons=dev.throttle_reasons,
        )

    def _health(self, node: Node, at: datetime, probes_due: bool) -> NodeHealth:
        probes: tuple[ProbeResult, ...] = ()
        if probes_due:
            probes = tuple(self._probe(dev) for dev in node.devices)
        return heartbeat(
            node.identity,
            event_id=self._id(),
            at=at,
            seq=node.heartbeat_seq,
            uptime_s=self.fleet.t_s - node.booted_at_s,
            agent_version=AGENT_VERSION,
            probes=probes,
        )

    def _probe(self, dev: Device) -> ProbeResult:
        if dev.lost:
            return ProbeResult(
                probe=ProbeKind.GEMM, device_uuid=dev.uuid, passed=False, duration_s=0.0
            )
        ratio = max(0.0, dev.clock_ratio * dev.health + self.rng.gauss(0.0, 0.01))
        return ProbeResult(
            probe=ProbeKind.GEMM,
            device_uuid=dev.uuid,
            # judged against what its clocks allow: a capped device is slow, not broken
            passed=not dev.failed and ratio >= 0.5 * max(dev.clock_ratio, 0.05),
            duration_s=round(0.25 / max(ratio, 0.05), 4),
            achieved_per_s=round(dev.spec.decode_tokens_per_s * 4e11 * ratio, 0),
            expected_ratio=round(ratio, 4),
        )

    def _serving(self, dev: Device, at: datetime) -> ServingMetrics:
        assert dev.model is not None
        m, rng, dt = MODELS[dev.model], self.rng, self.fleet.interval_s
        jitter = 1.0 + abs(rng.gauss(0.0, 0.02))
        requests = self._count(dev.served_rps * dt)
        failing = requests if dev.failed else min(requests, self._count(dev.errors))
        errors = failing + self._count(dev.rejected)
        return ServingMetrics(
            event_id=self._id(),
            observed_at=at,
            replica_id=f"{dev.uuid}/{dev.model}",
            node_id=dev.node.node_id,
            device_uuid=dev.uuid,
            model=dev.model,
            pool=dev.pool,
            region=dev.node.region,
            accelerator_type=dev.spec.kind,
            interval_s=dt,
            tpot_p50_s=round(dev.tpot_s * jitter, 5) if requests else None,
            tpot_p95_s=round(dev.tpot_s * jitter * 1.35, 5) if requests else None,
            ttft_p50_s=round(dev.ttft_s * jitter, 4) if requests else None,
            ttft_p95_s=round(dev.ttft_s * jitter * 1.8, 4) if requests else None,
            queue_depth=int(dev.queue),
            batch_size=round(dev.batch),
            kv_cache_util_ratio=round(min(1.0, 1.2 * dev.batch / BATCH_MAX), 4),
            tokens_per_s=round(dev.served_rps * m.generated_tokens, 1),
            requests=requests,
            errors=errors,
            optional_requests=min(requests, self._count(dev.optional_rps * dt)),
            batch_requests=min(requests, self._count(dev.batch_rps * dt)),
        )

    def _pdu(self, rack: Rack, at: datetime) -> PduReading:
        watts = 0.0 if rack.tripped else rack.power_watts
        return PduReading(
            event_id=self._id(),
            observed_at=at,
            pdu_id=rack.pdu_id,
            rack_id=rack.rack_id,
            pod_id=rack.pod_id,
            region=rack.region,
            phase=PduPhase.L1,
            power_watts=round(watts, 1),
            capacity_watts=rack.capacity_watts,
            breaker_limit_watts=round(rack.effective_limit_watts, 1),
            voltage_volts=415.0,
            current_amperes=round(watts / 415.0, 2),
        )

    def _demand(self, model: str, region: str, rps: float, at: datetime) -> Demand:
        dt = self.fleet.interval_s
        prompt, generated = self.fleet.lengths[(model, region)]
        requests = self._count(rps * dt)
        return Demand(
            event_id=self._id(),
            observed_at=at,
            model=model,
            region=region,
            interval_s=dt,
            requests=requests,
            prompt_tokens=round(requests * prompt),
            generated_tokens=round(requests * generated),
        )
