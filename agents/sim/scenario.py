"""Scenario files: the fleet, its demand and its faults, as data.

A scenario is YAML (or JSON)::

    name: ecc-storm
    duration_s: 900
    fleet: {nodes: 10, seed: 7}
    demand: {kind: synthetic}            # or rate-csv / azure-llm with a path
    faults:
      - kind: ecc_storm
        target: {node: 3, device: 2}      # indexes into the fleet, or ids
        start_s: 120
        duration_s: 600
        params: {lead_s: 300}
    sample_faults:                        # optional: a mix drawn from real episodes
      path: ../shared/data/gpu-faults/derived_fault_episodes.csv
      count: 6

Relative paths are resolved against the scenario file's folder. Unknown keys
are errors, so a typo never silently drops a fault.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from schemas.base import AcceleratorType


class Closed(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class FaultKind(StrEnum):
    ECC_STORM = "ecc_storm"  # correctable ECC rate climbs, then a double-bit fault
    THERMAL_RUNAWAY = "thermal_runaway"  # node cooling fails
    GREY_SLOWDOWN = "grey_slowdown"  # a device serves slower, every counter clean
    FLAPPING_XID = "flapping_xid"  # intermittent XIDs
    PDU_OVERLOAD = "pdu_overload"  # a rack's feed degrades; the breaker trips if overdrawn
    NODE_CRASH = "node_crash"  # heartbeats and telemetry stop
    DEMAND_SPIKE = "demand_spike"  # regional demand multiplies
    COLD_MODEL = "cold_model"  # demand for a model loaded nowhere
    # conditions shared by many devices, none of them faulty: nothing to isolate
    ROLLOUT_SLOWDOWN = "rollout_slowdown"  # a driver/firmware rollout slows a type or model
    POWER_BRAKE = "power_brake"  # a rack's power brake holds its devices' clocks down
    INLET_HEAT = "inlet_heat"  # a rack's inlet air runs hot (a failed CRAH, a hot aisle)


DEVICE_FAULTS = {FaultKind.ECC_STORM, FaultKind.GREY_SLOWDOWN, FaultKind.FLAPPING_XID}
NODE_FAULTS = {FaultKind.THERMAL_RUNAWAY, FaultKind.NODE_CRASH}
RACK_FAULTS = {FaultKind.PDU_OVERLOAD, FaultKind.POWER_BRAKE, FaultKind.INLET_HEAT}

DEFAULT_PARAMS: dict[FaultKind, dict[str, float]] = {
    FaultKind.ECC_STORM: {"lead_s": 300.0, "base_sbe_per_s": 0.01, "growth_per_s": 0.02},
    FaultKind.THERMAL_RUNAWAY: {"resistance_factor": 2.0, "inlet_rise_celsius": 12.0},
    FaultKind.GREY_SLOWDOWN: {"slowdown_ratio": 0.2},
    FaultKind.FLAPPING_XID: {"xid": 31.0, "period_s": 20.0, "errors_ratio": 0.05},
    FaultKind.PDU_OVERLOAD: {"breaker_limit_ratio": 0.45, "trip_after_s": 10.0},
    FaultKind.NODE_CRASH: {},
    FaultKind.DEMAND_SPIKE: {"factor": 2.5},
    FaultKind.COLD_MODEL: {"rps": 5.0},
    FaultKind.ROLLOUT_SLOWDOWN: {"slowdown_ratio": 0.1},
    FaultKind.POWER_BRAKE: {"clock_ratio": 0.7},
    FaultKind.INLET_HEAT: {"inlet_rise_celsius": 8.0},
}


class TargetSpec(Closed):
    """What a fault hits: fleet indexes or ids; which are needed depends on the kind."""

    node: Annotated[int, Field(ge=0)] | None = None
    device: Annotated[int, Field(ge=0)] | None = None
    rack: Annotated[int, Field(ge=0)] | None = None
    region: str | None = None
    model: str | None = None
    accelerator_type: str | None = None


class FaultSpec(Closed):
    kind: FaultKind
    target: TargetSpec = TargetSpec()
    start_s: Annotated[float, Field(ge=0)]
    duration_s: Annotated[float, Field(gt=0)]
    params: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> FaultSpec:
        unknown = set(self.params) - set(DEFAULT_PARAMS[self.kind])
        if unknown:
            raise ValueError(
                f"{self.kind.value}: unknown params {sorted(unknown)}; "
                f"known: {sorted(DEFAULT_PARAMS[self.kind])}"
            )
        t = self.target
        if self.kind in DEVICE_FAULTS and (t.node is None or t.device is None):
            raise ValueError(f"{self.kind.value} targets a device: give target.node and .device")
        if self.kind in NODE_FAULTS and (t.node is None or t.device is not None):
            # a device named too would be scored as that device's fault while the whole
            # node suffers it
            raise ValueError(f"{self.kind.value} targets a node: give target.node alone")
        if self.kind in RACK_FAULTS and (
            t.rack is None or t.node is not None or t.device is not None
        ):
            raise ValueError(f"{self.kind.value} targets a rack: give target.rack alone")
        if (
            self.kind is FaultKind.ROLLOUT_SLOWDOWN
            and t.accelerator_type is None
            and (t.model is None)
        ):
            raise ValueError(
                "rollout_slowdown targets an accelerator type or a model (in a region): give "
                "target.accelerator_type or target.model (and target.region)"
            )
        if self.kind is FaultKind.DEMAND_SPIKE and t.region is None:
            raise ValueError("demand_spike targets a region: give target.region")
        if self.kind is FaultKind.COLD_MODEL and t.model is None:
            raise ValueError("cold_model targets a model: give target.model")
        if self.kind is FaultKind.ECC_STORM and self.param("lead_s") > self.duration_s:
            raise ValueError("ecc_storm: lead_s (storm before the double-bit fault) > duration_s")
        return self

    def param(self, name: str) -> float:
        return self.params.get(name, DEFAULT_PARAMS[self.kind][name])

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


class DemandSpec(Closed):
    kind: Literal["synthetic", "rate-csv", "azure-llm"] = "synthetic"
    path: Path | None = None
    model: str | None = Field(None, description="azure-llm: the model the trace drives")
    model_map: dict[str, str] | None = Field(None, description="rate-csv: trace model -> ours")
    region_shares: dict[str, float] = Field(
        default_factory=lambda: {"us-east": 0.6, "eu-west": 0.4}
    )
    load_ratio: Annotated[float, Field(gt=0, le=2)] = 0.55
    period_s: Annotated[float, Field(gt=0)] = 3600.0
    batch_ratio: Annotated[float, Field(ge=0, le=1)] = Field(
        0.0, description="deferrable batch jobs, as a share of each serving replica's capacity"
    )

    @model_validator(mode="after")
    def _path_for_files(self) -> DemandSpec:
        if self.kind != "synthetic" and self.path is None:
            raise ValueError(f"demand kind {self.kind!r} needs a path")
        if self.kind == "azure-llm" and self.model is None:
            raise ValueError("an azure-llm trace drives one model: give demand.model")
        return self


class FleetSpec(Closed):
    nodes: Annotated[int, Field(ge=1)] = 10
    devices_per_node: Annotated[int, Field(ge=1, le=16)] = 8
    seed: int = 7
    interval_s: Annotated[float, Field(gt=0)] = 1.0
    probe_every_s: Annotated[float, Field(gt=0)] = 10.0
    spare_devices_per_node: Annotated[int, Field(ge=0)] = 2
    heartbeat_timeout_s: Annotated[float, Field(gt=0)] = 5.0
    type_mix: tuple[AcceleratorType, ...] | None = Field(
        None, min_length=1, description="node types, cycled over the nodes (default: all five)"
    )


class SampleSpec(Closed):
    path: Path
    count: Annotated[int, Field(ge=1)] = 6
    seed: int = 1
    repair_days_to_s: Annotated[float, Field(gt=0)] = 60.0
    warmup_s: Annotated[float, Field(ge=0)] = 60.0


class NoiseSpec(Closed):
    """What the telemetry path does to the agents' events on their way to the pipeline."""

    drop_ratio: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.0, description="each event lost with this probability"
    )
    duplicate_ratio: Annotated[float, Field(ge=0, le=1)] = Field(
        0.0, description="each event delivered twice with this probability"
    )
    skewed_nodes_ratio: Annotated[float, Field(ge=0, le=1)] = Field(
        0.0, description="nodes whose clock is off (their events' observed_at)"
    )
    clock_skew_s: Annotated[float, Field(ge=0, le=60)] = Field(
        0.0, description="a skewed node's clock is off by up to this, either way"
    )
    partitions: Annotated[int, Field(ge=1, le=10_000)] = Field(
        12, description="how the agents' keys (node ids) spread over a topic's partitions"
    )
    delayed_partitions: Annotated[int, Field(ge=0)] = Field(
        0, description="partitions that lag: every event of their nodes arrives late"
    )
    delay_s: Annotated[float, Field(ge=0, le=600)] = Field(
        0.0, description="how late a lagging partition's events arrive"
    )
    seed: int = 11


class Scenario(Closed):
    name: str = "steady"
    description: str = ""
    duration_s: Annotated[float, Field(gt=0)] | None = None
    fleet: FleetSpec = FleetSpec()
    demand: DemandSpec = DemandSpec()
    faults: tuple[FaultSpec, ...] = ()
    sample_faults: SampleSpec | None = None
    noise: NoiseSpec = NoiseSpec()


class ScenarioError(ValueError):
    """A scenario file that cannot be used, with the reason."""


def load_scenario(path: Path) -> Scenario:
    """Read and validate a scenario file; relative data paths resolve beside it."""
    try:
        raw: Any = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{path}: {exc}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: a scenario is a mapping, not {type(raw).__name__}")
    try:
        scenario = Scenario.model_validate(raw)
    except ValidationError as exc:
        raise ScenarioError(f"{path}: {exc}") from None
    return resolve_paths(scenario, path.parent)


def resolve_paths(scenario: Scenario, base: Path) -> Scenario:
    demand = scenario.demand
    if demand.path is not None and not demand.path.is_absolute():
        demand = demand.model_copy(update={"path": base / demand.path})
    sample = scenario.sample_faults
    if sample is not None and not sample.path.is_absolute():
        sample = sample.model_copy(update={"path": base / sample.path})
    return scenario.model_copy(update={"demand": demand, "sample_faults": sample})
