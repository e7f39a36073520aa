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
from uuid import UUID

from schemas.events import AcceleratorTelemetry, NodeHealth, ProbeResult

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


def heartbeat(
    identity: NodeIdentity,
    *,
    event_id: UUID,
    at: datetime,
    seq: int,
    uptime_s: float,
    agent_version: str,
    probes: tuple[ProbeResult, ...] = (),
) -> NodeHealth:
    """The heartbeat a node agent publishes each interval, with any probes it ran."""
    return NodeHealth(
        event_id=event_id,
        observed_at=at,
        node_id=identity.node_id,
        region=identity.region,
        pod_id=identity.pod_id,
        rack_id=identity.rack_id,
        agent_version=agent_version,
        heartbeat_seq=seq,
        uptime_s=max(0.0, uptime_s),
        probes=probes,
    )


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
