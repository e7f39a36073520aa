"""Fault injection: which faults are active at a simulated instant, and the ground truth.

:class:`FaultClock` resolves each :class:`~agents.sim.scenario.FaultSpec`'s
target to fleet ids once, then answers ``active(t)`` with the effects the
fleet applies in that step (:class:`ActiveFaults`). It also keeps the ground
truth for evaluation: every injected fault (kind, target, start, end,
parameters) and every consequence the fleet observed (a double-bit fault, a
breaker trip, a device lost to heat), written as JSON lines.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.sim.hardware import ACCELERATORS, MODELS, REGIONS
from agents.sim.scenario import DEFAULT_PARAMS, FaultKind, FaultSpec, ScenarioError

if TYPE_CHECKING:
    from agents.sim.fleet import Fleet


@dataclass(frozen=True, slots=True)
class ResolvedFault:
    fault_id: str
    spec: FaultSpec
    node_id: str | None = None
    device_uuid: str | None = None
    rack_id: str | None = None
    region: str | None = None
    model: str | None = None
    accelerator_type: str | None = None

    @property
    def target(self) -> str:
        """The narrowest thing hit: a device, node or rack; else a model or an accelerator
        type (in a region)."""
        for part in (self.device_uuid, self.node_id, self.rack_id):
            if part:
                return part
        if self.accelerator_type:
            where = f"{self.accelerator_type}/{self.model}" if self.model else self.accelerator_type
            return f"{where}@{self.region}" if self.region else where
        if self.model:
            return f"{self.model}@{self.region}" if self.region else self.model
        return self.region or "fleet"


@dataclass(slots=True)
class ActiveFaults:
    """The effects of the faults active in one step, by target id."""

    crashed_nodes: set[str] = field(default_factory=set)
    repaired: set[str] = field(default_factory=set)  # device uuids swapped this step
    sbe_rate: dict[str, float] = field(default_factory=dict)
    dbe_now: set[str] = field(default_factory=set)
    slowdown: dict[str, float] = field(default_factory=dict)  # the chip (probes too)
    serving_slowdown: dict[str, float] = field(default_factory=dict)  # its serving stack
    xid: dict[str, tuple[int, float]] = field(default_factory=dict)  # uuid -> (xid, period_s)
    xid_error_ratio: dict[str, float] = field(default_factory=dict)
    breaker_ratio: dict[str, float] = field(default_factory=dict)
    trip_after_s: dict[str, float] = field(default_factory=dict)
    inlet_rise: dict[str, float] = field(default_factory=dict)
    resistance: dict[str, float] = field(default_factory=dict)
    brake: dict[str, float] = field(default_factory=dict)  # rack -> clock ratio held to
    spikes: list[tuple[str | None, str, float]] = field(default_factory=list)
    cold: list[tuple[str, str | None, float]] = field(default_factory=list)

    def demand_factor(self, model: str, region: str) -> float:
        f = 1.0
        for m, r, factor in self.spikes:
            if r == region and m in (None, model):
                f *= factor
        return f

    def cold_rps(self, model: str, region: str) -> float:
        return sum(rps for m, r, rps in self.cold if m == model and r in (None, region))


def _in_cohort(rollout: ResolvedFault, kind: str, model: str | None, region: str) -> bool:
    """Whether a device of ``kind`` serving ``model`` in ``region`` is in the cohort a
    rollout targets (every criterion it names)."""
    return (
        (rollout.accelerator_type is None or rollout.accelerator_type == kind)
        and (rollout.model is None or rollout.model == model)
        and (rollout.region is None or rollout.region == region)
    )


class FaultClock:
    """The scenario's faults on one fleet: which are active at a time, what each does
    to its devices, nodes and racks, and the consequences observed."""

    def __init__(self, faults: tuple[FaultSpec, ...] | list[FaultSpec]) -> None:
        self.specs = list(faults)
        self.resolved: list[ResolvedFault] = []
        self.consequences: list[dict[str, Any]] = []
        self._interval_s = 1.0

    def bind(self, fleet: Fleet) -> None:
        """Resolve targets against ``fleet``'s layout; errors name the fault."""
        self._interval_s = fleet.interval_s
        out = []
        for i, spec in enumerate(self.specs):
            t = spec.target
            fid = f"f{i:03d}-{spec.kind.value}"
            node_id = device_uuid = rack_id = None
            if t.node is not None:
                if t.node >= len(fleet.nodes):
                    raise ScenarioError(
                        f"{fid}: node {t.node} but the fleet has {len(fleet.nodes)}"
                    )
                node = fleet.nodes[t.node]
                node_id = node.node_id
                if t.device is not None:
                    if t.device >= len(node.devices):
                        raise ScenarioError(f"{fid}: device {t.device} is not on {node_id}")
                    device_uuid = node.devices[t.device].uuid
                    if (
                        spec.kind is FaultKind.FLAPPING_XID
                        and not ACCELERATORS[node.kind].reports_xid
                    ):
                        raise ScenarioError(f"{fid}: {node.kind.value} devices report no XIDs")
            if t.rack is not None:
                if t.rack >= len(fleet.racks):
                    raise ScenarioError(
                        f"{fid}: rack {t.rack} but the fleet has {len(fleet.racks)}"
                    )
                rack_id = fleet.racks[t.rack].rack_id
            if t.region is not None and t.region not in REGIONS:
                raise ScenarioError(f"{fid}: unknown region {t.region!r}; known: {REGIONS}")
            if t.model is not None and t.model not in MODELS:
                raise ScenarioError(f"{fid}: unknown model {t.model!r}; known: {sorted(MODELS)}")
            kinds = sorted(k.value for k in ACCELERATORS)
            if t.accelerator_type is not None and t.accelerator_type not in kinds:
                raise ScenarioError(
                    f"{fid}: unknown accelerator type {t.accelerator_type!r}; known: {kinds}"
                )
            out.append(
                ResolvedFault(
                    fid, spec, node_id, device_uuid, rack_id, t.region, t.model,
                    t.accelerator_type,
                )
            )  # fmt: skip
        self.resolved = out

    def active(self, t_s: float, fleet: Fleet) -> ActiveFaults:
        a = ActiveFaults()
        dt = self._interval_s
        for f in self.resolved:
            s = f.spec
            if s.end_s <= t_s < s.end_s + dt and f.device_uuid is not None:
                a.repaired.add(f.device_uuid)
            if s.end_s <= t_s < s.end_s + dt and s.kind is FaultKind.THERMAL_RUNAWAY:
                node = fleet.node(f.node_id or "")
                if node is not None:  # devices lost to heat are swapped when cooling is fixed
                    a.repaired.update(d.uuid for d in node.devices if d.lost)
            if s.end_s <= t_s < s.end_s + dt and s.kind is FaultKind.INLET_HEAT:
                for node in fleet.nodes:  # and when the air is cool again
                    if node.rack_id == f.rack_id:
                        a.repaired.update(d.uuid for d in node.devices if d.lost)
            if not s.start_s <= t_s < s.end_s:
                continue
            k, p = s.kind, s.param
            if k is FaultKind.ECC_STORM and f.device_uuid:
                # the rate climbs until the double-bit fault, then stays at its peak
                climb_s = min(t_s - s.start_s, p("lead_s"))
                grow = min(60.0, p("growth_per_s") * climb_s)
                a.sbe_rate[f.device_uuid] = p("base_sbe_per_s") * math.exp(grow)
                if t_s >= s.start_s + p("lead_s"):
                    a.dbe_now.add(f.device_uuid)
            elif k is FaultKind.GREY_SLOWDOWN and f.device_uuid:
                _compound(a.slowdown, f.device_uuid, p("slowdown_ratio"))  # with a rollout's
            elif k is FaultKind.FLAPPING_XID and f.device_uuid:
                a.xid[f.device_uuid] = (int(p("xid")), p("period_s"))
                a.xid_error_ratio[f.device_uuid] = p("errors_ratio")
            elif k is FaultKind.THERMAL_RUNAWAY and f.node_id:
                a.resistance[f.node_id] = p("resistance_factor")
                a.inlet_rise[f.node_id] = p("inlet_rise_celsius")
            elif k is FaultKind.NODE_CRASH and f.node_id:
                a.crashed_nodes.add(f.node_id)
            elif k is FaultKind.PDU_OVERLOAD and f.rack_id:
                a.breaker_ratio[f.rack_id] = p("breaker_limit_ratio")
                a.trip_after_s[f.rack_id] = p("trip_after_s")
            elif k is FaultKind.DEMAND_SPIKE and f.region:
                a.spikes.append((f.model, f.region, p("factor")))
            elif k is FaultKind.COLD_MODEL and f.model:
                a.cold.append((f.model, f.region, p("rps")))
            elif k is FaultKind.ROLLOUT_SLOWDOWN:
                # a type's driver or firmware slows the chip; a model's rollout (a serving
                # stack, a kernel) slows what serves that model
                slowed = a.slowdown if f.accelerator_type is not None else a.serving_slowdown
                for dev in fleet.devices.values():
                    if _in_cohort(f, dev.spec.kind.value, dev.model, dev.node.region):
                        _compound(slowed, dev.uuid, p("slowdown_ratio"))
            elif k is FaultKind.POWER_BRAKE and f.rack_id:
                a.brake[f.rack_id] = min(a.brake.get(f.rack_id, 1.0), p("clock_ratio"))
            elif k is FaultKind.INLET_HEAT and f.rack_id:
                for node in fleet.nodes:
                    if node.rack_id == f.rack_id:
                        rise = a.inlet_rise.get(node.node_id, 0.0) + p("inlet_rise_celsius")
                        a.inlet_rise[node.node_id] = rise
        return a

    def record(self, *, t_s: float, what: str, target: str, **detail: float) -> None:
        """A consequence the fleet observed (double-bit fault, breaker trip, a rack over its
        breaker limit for ``duration_s`` of its ``trip_after_s``...)."""
        self.consequences.append({"t_s": round(t_s, 3), "what": what, "target": target, **detail})

    def truth(self, start: datetime) -> list[dict[str, Any]]:
        """Ground truth rows: every fault, then every consequence, with instants."""
        rows: list[dict[str, Any]] = []
        for f in self.resolved:
            s = f.spec
            rows.append(
                {
                    "record": "fault",
                    "fault_id": f.fault_id,
                    "kind": s.kind.value,
                    "target": f.target,
                    "node_id": f.node_id,
                    "device_uuid": f.device_uuid,
                    "rack_id": f.rack_id,
                    "region": f.region,
                    "model": f.model,
                    "accelerator_type": f.accelerator_type,
                    "start_at": (start + timedelta(seconds=s.start_s)).isoformat(),
                    "end_at": (start + timedelta(seconds=s.end_s)).isoformat(),
                    "start_s": s.start_s,
                    "end_s": s.end_s,
                    "params": {n: s.param(n) for n in sorted(DEFAULT_PARAMS[s.kind])},
                }
            )
        for c in self.consequences:
            at = (start + timedelta(seconds=c["t_s"])).isoformat()
            rows.append({"record": "consequence", **c, "at": at})
        return rows

    def write_truth(self, path: Path, start: datetime) -> None:
        """Write the ground truth as JSON lines, atomically."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in self.truth(start)))
        tmp.replace(path)


def _compound(slowdowns: dict[str, float], device_uuid: str, ratio: float) -> None:
    """Slow ``device_uuid`` by ``ratio`` more: slowdowns compound, in any order."""
    before = slowdowns.get(device_uuid, 0.0)
    slowdowns[device_uuid] = (1 + before) * (1 + ratio) - 1
