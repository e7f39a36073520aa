"""A fault mix drawn from real fault episodes (the gpu-faults layout).

Each episode's description maps to the simulator fault it looks like from the
outside (a DBE over threshold is an ECC storm ending in a double-bit fault; a
PCIe link running narrow is a grey slowdown; a lost GPU or a kernel panic is a
node crash...). Episodes whose cause is unknown are left out. Kinds are drawn
with their frequency in the file and durations from the same kind's repair
times, scaled by ``repair_days_to_s`` (by default one day of repair becomes
one simulated minute) and clamped to a few minutes, so a short run sees
faults begin and end.
"""

from __future__ import annotations

import csv
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from agents.sim.hardware import ACCELERATORS, node_type
from agents.sim.scenario import (
    DEFAULT_PARAMS,
    FaultKind,
    FaultSpec,
    SampleSpec,
    ScenarioError,
    TargetSpec,
)
from schemas.base import AcceleratorType

DESCRIPTION_TO_KIND: dict[str, FaultKind] = {
    "GPU DBE(Double Bit ECC) > Threshold": FaultKind.ECC_STORM,
    "GPU SBE(Single Bit ECC) > Threshold": FaultKind.ECC_STORM,
    "GPU xid Error": FaultKind.FLAPPING_XID,
    "GPU device unknow error": FaultKind.FLAPPING_XID,
    "nvidia-smi Timeout": FaultKind.FLAPPING_XID,
    "GPU PCI link width low": FaultKind.GREY_SLOWDOWN,
    "GPU P2P Bandwidth Low": FaultKind.GREY_SLOWDOWN,
    "Silent Data Corruption": FaultKind.GREY_SLOWDOWN,
    "NIC Link Speed low": FaultKind.GREY_SLOWDOWN,
    "Speed Critical (Sensor)": FaultKind.THERMAL_RUNAWAY,
    "GPU Temperature High": FaultKind.THERMAL_RUNAWAY,
    "Redundancy Lost": FaultKind.THERMAL_RUNAWAY,  # fan redundancy; PSU redundancy below
    "GPU Lost": FaultKind.NODE_CRASH,
    "GPU device not found": FaultKind.NODE_CRASH,
    "Motherboard Failed": FaultKind.NODE_CRASH,
    "Kernel Panic": FaultKind.NODE_CRASH,
    "Server down": FaultKind.NODE_CRASH,
    "Suspect Machine Offline": FaultKind.NODE_CRASH,
    "Machine Check Exception ( Uncorrectable )": FaultKind.NODE_CRASH,
    "Power Supply Failure detected": FaultKind.NODE_CRASH,
}
CLASS_OVERRIDES = {("Power Supply", "Redundancy Lost"): FaultKind.PDU_OVERLOAD}
MIN_DURATION_S = 120.0
MAX_DURATION_S = 900.0


@dataclass(frozen=True, slots=True)
class Episode:
    kind: FaultKind
    duration_days: float


def read_episodes(path: Path) -> list[Episode]:
    """The episodes of ``path`` that map to a simulator fault."""
    out = []
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            need = {"fault_class", "fault_desc", "duration_days"}
            if not need <= set(reader.fieldnames or ()):
                raise ScenarioError(f"{path}: fault episodes need columns {sorted(need)}")
            for row in reader:
                key = (row["fault_class"], row["fault_desc"])
                kind = CLASS_OVERRIDES.get(key) or DESCRIPTION_TO_KIND.get(row["fault_desc"])
                if kind is not None:
                    out.append(Episode(kind, float(row["duration_days"])))
    except OSError as exc:
        raise ScenarioError(f"fault episodes: {exc}") from None
    if not out:
        raise ScenarioError(f"{path}: no episode maps to a simulator fault")
    return out


def sample_faults(
    spec: SampleSpec,
    *,
    nodes: int,
    devices_per_node: int,
    racks: int,
    horizon_s: float,
    type_mix: tuple[AcceleratorType, ...] | None = None,
    busy_nodes: set[int] | None = None,
) -> list[FaultSpec]:
    """``spec.count`` faults on random targets, starting after the warm-up, seeded. With
    ``busy_nodes`` (nodes other faults already hit), each fault takes a node of its own:
    two faults on one node (a crash hiding a slow chip, a second slowdown on a chip still
    isolated for the first) leave the truth ambiguous, so a fault with no free node left
    is not drawn."""
    episodes = read_episodes(spec.path)
    by_kind: dict[FaultKind, list[float]] = defaultdict(list)
    for e in episodes:
        by_kind[e.kind].append(e.duration_days)
    rng = random.Random(spec.seed)
    out = []
    for _ in range(spec.count):
        kind = rng.choice(episodes).kind
        duration = spec.repair_days_to_s * rng.choice(by_kind[kind])
        duration = min(MAX_DURATION_S, max(MIN_DURATION_S, duration))
        lead = DEFAULT_PARAMS[FaultKind.ECC_STORM]["lead_s"]
        if kind is FaultKind.ECC_STORM:  # the log dates the double-bit fault and times its
            duration += lead  # repair; the storm of correctable errors comes before both
        latest = max(spec.warmup_s, horizon_s - duration)
        start = round(rng.uniform(spec.warmup_s, latest), 1)
        if busy_nodes is None:
            node = rng.randrange(nodes)
        else:
            free = [i for i in range(nodes) if i not in busy_nodes]
            if kind is FaultKind.FLAPPING_XID:
                free = [i for i in free if ACCELERATORS[node_type(i, type_mix)].reports_xid]
            if not free and kind is not FaultKind.PDU_OVERLOAD:
                continue
            node = rng.choice(free) if free else 0
            if kind is not FaultKind.PDU_OVERLOAD:
                busy_nodes.add(node)
        if kind is FaultKind.FLAPPING_XID and busy_nodes is None:  # XIDs: some types only
            xid_nodes = [
                i for i in range(nodes) if ACCELERATORS[node_type(i, type_mix)].reports_xid
            ]
            node = rng.choice(xid_nodes) if xid_nodes else node
        target = TargetSpec(node=node)
        params: dict[str, float] = {}
        if kind in (FaultKind.ECC_STORM, FaultKind.GREY_SLOWDOWN, FaultKind.FLAPPING_XID):
            target = TargetSpec(node=node, device=rng.randrange(devices_per_node))
        if kind is FaultKind.PDU_OVERLOAD:
            target = TargetSpec(rack=rng.randrange(racks))
        if kind is FaultKind.ECC_STORM:
            params["lead_s"] = lead
        if kind is FaultKind.GREY_SLOWDOWN:
            params["slowdown_ratio"] = round(rng.uniform(0.15, 0.3), 3)
        out.append(
            FaultSpec(
                kind=kind,
                target=target,
                start_s=start,
                duration_s=round(duration, 1),
                params=params,
            )
        )
    return out
