"""A scenario made runnable: fleet, demand, faults and telemetry, stepped together.

Example::

    sim = Simulation(load_scenario(Path("scenarios/ecc-storm.yaml")), start=now)
    for n in range(60):
        events = sim.tick(n)   # one step of fleet.interval_s, then its telemetry

``tick`` matches the simulated agent's interface, so the same runner publishes
either. Commands are applied between ticks (see :mod:`agents.sim.control`).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from agents.sim.demand import AzureTraceDemand, DemandSource, RateCsvDemand, SyntheticDemand
from agents.sim.fault_mix import sample_faults
from agents.sim.faults import FaultClock
from agents.sim.fleet import NODES_PER_RACK, Fleet
from agents.sim.hardware import SERVED_AT_START
from agents.sim.noise import TelemetryNoise
from agents.sim.scenario import DemandSpec, Scenario
from agents.sim.telemetry import Record, TelemetryBuilder


def build_demand(spec: DemandSpec, *, seed: int) -> DemandSource:
    if spec.kind == "synthetic":
        return SyntheticDemand(seed=seed, period_s=spec.period_s)
    assert spec.path is not None  # validated
    if spec.kind == "rate-csv":
        return RateCsvDemand(
            spec.path,
            models=SERVED_AT_START,
            region_shares=spec.region_shares,
            model_map=spec.model_map,
        )
    assert spec.model is not None
    return AzureTraceDemand(spec.path, model=spec.model, region_shares=spec.region_shares)


class Simulation:
    """One run of a scenario; ``nodes`` and ``seed`` override the scenario's fleet."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        start: datetime,
        nodes: int | None = None,
        seed: int | None = None,
    ) -> None:
        updates: dict[str, object] = {}
        if nodes is not None:
            updates["nodes"] = nodes
        if seed is not None:
            updates["seed"] = seed
        spec = scenario.fleet.model_copy(update=updates)
        self.scenario = scenario
        faults = list(scenario.faults)
        if scenario.sample_faults is not None:
            racks = -(-spec.nodes // NODES_PER_RACK)
            horizon = scenario.duration_s or 900.0
            faults += sample_faults(
                scenario.sample_faults,
                nodes=spec.nodes,
                devices_per_node=spec.devices_per_node,
                racks=racks,
                horizon_s=horizon,
                type_mix=spec.type_mix,
            )
        self.faults = FaultClock(faults)
        self.fleet = Fleet(
            spec,
            start=start,
            demand=build_demand(scenario.demand, seed=spec.seed),
            faults=self.faults,
            load_ratio=scenario.demand.load_ratio,
            batch_ratio=scenario.demand.batch_ratio,
        )
        self.faults.bind(self.fleet)
        self.telemetry = TelemetryBuilder(self.fleet, seed=spec.seed)
        self.noise = TelemetryNoise(scenario.noise, [n.node_id for n in self.fleet.nodes])

    @property
    def now(self) -> datetime:
        """The fleet's clock: the end of the last step."""
        return self.fleet.now

    @property
    def interval_s(self) -> float:
        return self.fleet.interval_s

    @property
    def ticks(self) -> int | None:
        """Steps the scenario asks for (None: run until stopped)."""
        d = self.scenario.duration_s
        return None if d is None else max(1, round(d / self.fleet.interval_s))

    def tick(self, tick: int) -> list[Record]:
        """Advance one step and return its telemetry as the pipeline receives it (the
        scenario's noise applied; ``tick`` is informational)."""
        del tick
        self.fleet.step()
        return self.noise.apply(self.telemetry.events(), t_s=self.fleet.t_s)

    def write_truth(self, path: Path) -> None:
        self.faults.write_truth(path, self.fleet.start)
