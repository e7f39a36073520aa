"""Scenario families: a generator of scenarios, as data, drawn once per seed.

A hand-written scenario tests the faults its author thought of, where they put
them. A family says how faults happen instead (which kinds, how many per run,
how strong, how long) and every seed draws its own scenario from it: the fleet's
size and type mix, its demand, the faults and their targets, the telemetry's
noise. An evaluation over many seeds then measures a detector on faults
nobody placed by hand::

    name: held-out-mix
    duration_s: 1800
    fleet: {nodes: [32, 56], type_mix: [[H100, A100, MI300X], [H100, B200, MTIA]]}
    demand:                              # one of these per seed
      - {kind: rate-csv, path: ../data/servegen/rates_2days.csv}
      - {kind: synthetic}
    faults:
      - kind: grey_slowdown
        count: [2, 4]                    # per seed, uniform
        devices: [1, 2]                  # devices of one node it hits together
        start_s: [120, 1200]
        duration_s: [300, 900]
        params: {slowdown_ratio: [0.15, 0.25]}
      - kind: rollout_slowdown
        count: [0, 1]
        target: accelerator_type         # or model_region
        params: {slowdown_ratio: [0.05, 0.2]}
    sample_faults: {path: ../data/gpu-faults/derived_fault_episodes.csv, count: [4, 8]}
    noise: {drop_ratio: [0, 0.01], clock_skew_s: [0, 2], skewed_nodes_ratio: 0.2}

A range is a number or ``[low, high]``, drawn uniformly (counts and node numbers
as whole numbers); a list of choices is drawn from evenly. Each seed's draw
depends only on the family's name and the seed, so ``--seeds 1-5`` is the same
five scenarios on any machine. Unknown keys are errors.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from agents.sim.fault_mix import sample_faults
from agents.sim.fleet import NODES_PER_RACK
from agents.sim.hardware import ACCELERATORS, MODELS, REGIONS, SERVED_AT_START, node_type
from agents.sim.scenario import (
    DEFAULT_PARAMS,
    DEVICE_FAULTS,
    NODE_FAULTS,
    RACK_FAULTS,
    Closed,
    DemandSpec,
    FaultKind,
    FaultSpec,
    FleetSpec,
    NoiseSpec,
    SampleSpec,
    Scenario,
    ScenarioError,
    TargetSpec,
    resolve_paths,
)
from schemas.base import AcceleratorType

Range = float | tuple[float, float]

XID_FAULTS = {FaultKind.FLAPPING_XID}


def draw(rng: random.Random, value: Range) -> float:
    """A number from ``value``: itself, or uniform in ``[low, high]``."""
    if not isinstance(value, tuple):
        return value
    low, high = value
    if high < low:
        raise ScenarioError(f"range [{low}, {high}]: the high end is below the low end")
    return rng.uniform(low, high)


def _count(rng: random.Random, value: Range) -> int:
    """A whole number from ``value``: itself, or uniform over ``low..high``."""
    if not isinstance(value, tuple):
        return int(value)
    low, high = value
    if high < low:
        raise ScenarioError(f"range [{low}, {high}]: the high end is below the low end")
    return rng.randint(int(low), int(high))


class FaultDraw(Closed):
    """How one kind of fault happens in a family's scenarios."""

    kind: FaultKind
    count: Range = 1
    devices: Range = Field(1, description="device faults: devices of one node hit together")
    start_s: Range | None = Field(None, description="default: after a tenth of the run")
    duration_s: Range | None = Field(None, description="default: a tenth to a half of the run")
    params: dict[str, Range] = Field(default_factory=dict)
    target: Literal["accelerator_type", "model_region", "model", "region"] | None = Field(
        None, description="rollout_slowdown: the cohort it slows"
    )

    @model_validator(mode="after")
    def _check(self) -> FaultDraw:
        unknown = set(self.params) - set(DEFAULT_PARAMS[self.kind])
        if unknown:
            raise ValueError(
                f"{self.kind.value}: unknown params {sorted(unknown)}; "
                f"known: {sorted(DEFAULT_PARAMS[self.kind])}"
            )
        return self


class FleetDraw(Closed):
    nodes: Range = 40
    devices_per_node: int = 8
    type_mix: list[tuple[AcceleratorType, ...]] | None = Field(
        None, description="choices of node type mix (default: all five types)"
    )


class SampleDraw(Closed):
    path: Path
    count: Range = 6


class NoiseDraw(Closed):
    drop_ratio: Range = 0.0
    duplicate_ratio: Range = 0.0
    skewed_nodes_ratio: Range = 0.0
    clock_skew_s: Range = 0.0
    delayed_partitions: Range = 0
    delay_s: Range = 0.0


class Family(Closed):
    name: str
    description: str = ""
    duration_s: Annotated[float, Field(gt=0)] = 1800.0
    tune_seeds: tuple[int, int] | None = Field(
        None, description="the seeds its defaults were tuned on; report on others"
    )
    fleet: FleetDraw = FleetDraw()
    demand: list[DemandSpec] = Field(default_factory=lambda: [DemandSpec()], min_length=1)
    faults: list[FaultDraw] = Field(default_factory=list)
    sample_faults: SampleDraw | None = None
    noise: NoiseDraw = NoiseDraw()


def load_family(path: Path) -> Family:
    """Read and validate a family file; relative data paths resolve beside it."""
    try:
        raw: Any = yaml.safe_load(path.read_text())
        family = Family.model_validate(raw or {})
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise ScenarioError(f"{path}: {exc}") from None
    base = path.parent
    demand = [
        d
        if d.path is None or d.path.is_absolute()
        else d.model_copy(update={"path": base / d.path})
        for d in family.demand
    ]
    sample = family.sample_faults
    if sample is not None and not sample.path.is_absolute():
        sample = sample.model_copy(update={"path": base / sample.path})
    return family.model_copy(update={"demand": demand, "sample_faults": sample})


def draw_scenario(family: Family, seed: int) -> Scenario:
    """Seed ``seed``'s scenario of ``family``: the same one on every machine."""
    rng = random.Random(f"{family.name}/{seed}")
    duration = family.duration_s
    mix = tuple(rng.choice(family.fleet.type_mix)) if family.fleet.type_mix else None
    nodes = max(1, _count(rng, family.fleet.nodes))
    per_node = family.fleet.devices_per_node
    fleet = FleetSpec(nodes=nodes, devices_per_node=per_node, seed=seed, type_mix=mix)
    racks = -(-nodes // NODES_PER_RACK)
    types = sorted({node_type(i, mix) for i in range(nodes)})
    busy: set[int] = set()  # one fault per node: none hides another (a crash, a slow chip)
    faults: list[FaultSpec] = []

    for spec in family.faults:
        kind = spec.kind
        for _ in range(_count(rng, spec.count)):
            length = draw(rng, spec.duration_s or (duration * 0.1, duration * 0.5))
            length = max(1.0, min(length, duration))
            start = draw(rng, spec.start_s or (duration * 0.1, duration - length))
            start = max(0.0, min(start, duration - 1.0))
            params = {name: round(draw(rng, v), 4) for name, v in spec.params.items()}
            if kind is FaultKind.ECC_STORM:  # the storm runs before its double-bit fault
                lead = params.get("lead_s", DEFAULT_PARAMS[kind]["lead_s"])
                params["lead_s"] = round(min(lead, length * 0.8), 1)
            targets = _targets(rng, spec, nodes, per_node, racks, types, mix, busy)
            for target in targets:
                if target.node is not None:
                    busy.add(target.node)
                faults.append(
                    FaultSpec(
                        kind=kind,
                        target=target,
                        start_s=round(start, 1),
                        duration_s=round(length, 1),
                        params=params,
                    )
                )
    if family.sample_faults is not None:  # drawn here, on nodes no other fault hit
        count = _count(rng, family.sample_faults.count)
        if count > 0:
            faults += sample_faults(
                SampleSpec(path=family.sample_faults.path, count=count, seed=seed),
                nodes=nodes, devices_per_node=per_node, racks=racks, horizon_s=duration,
                type_mix=mix, busy_nodes=busy,
            )  # fmt: skip
    n = family.noise
    noise = NoiseSpec(
        drop_ratio=round(draw(rng, n.drop_ratio), 4),
        duplicate_ratio=round(draw(rng, n.duplicate_ratio), 4),
        skewed_nodes_ratio=round(draw(rng, n.skewed_nodes_ratio), 3),
        clock_skew_s=round(draw(rng, n.clock_skew_s), 3),
        delayed_partitions=_count(rng, n.delayed_partitions),
        delay_s=round(draw(rng, n.delay_s), 2),
        seed=seed,
    )
    scenario = Scenario(
        name=f"{family.name}#{seed}",
        description=f"seed {seed} of the {family.name} family",
        duration_s=duration,
        fleet=fleet,
        demand=rng.choice(family.demand),
        faults=tuple(faults),
        noise=noise,
    )
    return resolve_paths(scenario, Path("."))


def _targets(
    rng: random.Random,
    spec: FaultDraw,
    nodes: int,
    per_node: int,
    racks: int,
    types: list[AcceleratorType],
    mix: tuple[AcceleratorType, ...] | None,
    busy: set[int],
) -> list[TargetSpec]:
    """Where one fault of ``spec`` lands (several devices of one node when it asks), on a
    node no other fault hit; none when every node is taken."""
    kind = spec.kind
    if kind in DEVICE_FAULTS or kind in NODE_FAULTS:
        candidates = [
            i
            for i in range(nodes)
            if i not in busy
            and (kind not in XID_FAULTS or ACCELERATORS[node_type(i, mix)].reports_xid)
        ]
        if not candidates:
            return []  # the fleet has no node left for it: fewer faults, said in the truth
        node = rng.choice(candidates)
        if kind in NODE_FAULTS:
            return [TargetSpec(node=node)]
        hit = rng.sample(range(per_node), min(per_node, max(1, _count(rng, spec.devices))))
        return [TargetSpec(node=node, device=d) for d in sorted(hit)]
    if kind in RACK_FAULTS:
        return [TargetSpec(rack=rng.randrange(racks))]
    if kind is FaultKind.DEMAND_SPIKE:
        return [TargetSpec(region=rng.choice(REGIONS))]
    if kind is FaultKind.COLD_MODEL:
        cold = sorted(set(MODELS) - set(SERVED_AT_START))
        return [TargetSpec(model=rng.choice(cold or sorted(MODELS)))]
    # a rollout: one accelerator type, or one model (in one region)
    how = spec.target or "accelerator_type"
    if how == "accelerator_type":
        return [TargetSpec(accelerator_type=rng.choice(types).value)]
    if how == "region":
        return [TargetSpec(accelerator_type=rng.choice(types).value, region=rng.choice(REGIONS))]
    model = rng.choice(SERVED_AT_START)
    region = rng.choice(REGIONS) if how == "model_region" else None
    return [TargetSpec(model=model, region=region)]


def parse_seeds(text: str) -> list[int]:
    """``"1-5"``, ``"3"`` or ``"1-5,9,20-24"`` as a list of seeds."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, sep, high = part.partition("-")
        try:
            first, last = int(low), int(high) if sep else int(low)
        except ValueError:
            raise ScenarioError(f"seeds: {part!r} is not N or N-M") from None
        if last < first:
            raise ScenarioError(f"seeds: {part!r} runs backwards")
        seeds += range(first, last + 1)
    if not seeds:
        raise ScenarioError("seeds: none given")
    return seeds
