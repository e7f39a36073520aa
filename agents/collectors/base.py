"""The reader interface every accelerator collector implements.

A reader returns one :class:`~schemas.events.AcceleratorTelemetry` per device
it can see, units normalised, fields the device cannot report as ``None``.
The simulator's per-node view (:class:`SimulatedNodeReader`) and the NVML
collector (:class:`agents.collectors.nvml.NvmlGpuReader`) are interchangeable.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from schemas.events import AcceleratorTelemetry

if TYPE_CHECKING:
    from agents.sim.simulation import Simulation


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """Where a host sits; stamped on every sample it publishes."""

    node_id: str
    region: str
    pod_id: str
    rack_id: str
    pdu_id: str


class AcceleratorReader(Protocol):
    def read(self, now: datetime) -> list[AcceleratorTelemetry]:
        """One sample per visible device, observed at ``now``."""
        ...


class SimulatedNodeReader:
    """One simulated node's devices, as its own agent would read them after a step.

    Sensor noise comes from the simulation's generator, so reading between steps
    changes the noise (not the physics) of the telemetry that follows.
    """

    def __init__(self, sim: Simulation, node_id: str) -> None:
        if sim.fleet.node(node_id) is None:
            raise ValueError(f"no node {node_id!r} in the simulated fleet")
        self.sim = sim
        self.node_id = node_id

    def read(self, now: datetime) -> list[AcceleratorTelemetry]:
        node = self.sim.fleet.node(self.node_id)
        assert node is not None
        if node.down:
            return []
        builder = self.sim.telemetry
        return [builder.device_sample(d, now) for d in node.devices if not d.lost]
