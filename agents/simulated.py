"""The open-loop simulated agent: the fleet simulator with no faults and no commands.

``SimulatedFleetAgent.tick(n)`` returns every event that N nodes x G devices
publish in one step: one accelerator sample per device, one heartbeat per node
(with probes every ``probe_every`` steps), one serving sample per loaded
replica, one PDU reading per rack and one demand sample per (model, region).
The same seed and start time give byte-identical events. `fleetloop agent`
and the ingest tests use it as a load generator; `fleetloop sim` runs the
same simulator closed-loop, with faults and executors.
"""

from __future__ import annotations

from datetime import datetime

from agents.sim.scenario import FleetSpec, Scenario
from agents.sim.simulation import Simulation
from agents.sim.telemetry import Record


class SimulatedFleetAgent:
    """Generates the five telemetry families for a healthy fleet, deterministically."""

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
        fleet = FleetSpec(
            nodes=nodes,
            devices_per_node=devices_per_node,
            seed=seed,
            interval_s=interval_s,
            probe_every_s=probe_every * interval_s,
        )
        self.sim = Simulation(Scenario(fleet=fleet), start=start)

    def tick(self, tick: int) -> list[Record]:
        """The events of the next step (``tick`` is informational: steps run in order)."""
        return self.sim.tick(tick)

    def first(self, count: int) -> list[Record]:
        """Exactly the first ``count`` events, step after step from the start."""
        out: list[Record] = []
        n = 0
        while len(out) < count:
            out.extend(self.tick(n))
            n += 1
        return out[:count]
