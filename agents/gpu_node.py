"""A real GPU host as a loop source: its NVML readings and heartbeat, each tick.

The node executor on the same host acts through :class:`NvmlNodeControl` and
answers only the commands addressed to this node or one of its devices
(:meth:`GpuNode.addressed_to_me`); every other host answers its own.

Example::

    node = GpuNode(identity, NvmlGpuReader(identity), interval_s=1.0)
    records = node.tick(0)   # accelerator samples + one NodeHealth
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from agents.collectors.base import AcceleratorReader, NodeIdentity, heartbeat
from agents.runner import Records
from schemas.commands import Target
from schemas.topics import ACCELERATOR, NODE_HEALTH

AGENT_VERSION = "fleetloop-node/0.2.0"


class GpuNode:
    """Telemetry of one host from its reader; implements the loop's source interface."""

    def __init__(
        self,
        identity: NodeIdentity,
        reader: AcceleratorReader,
        *,
        interval_s: float,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
        new_id: Callable[[], uuid.UUID] = uuid.uuid4,
    ) -> None:
        self.identity = identity
        self.reader = reader
        self._interval_s = interval_s
        self.clock = clock
        self.monotonic = monotonic
        self.new_id = new_id
        self.started = monotonic()
        self.devices: set[str] = set()
        self.heartbeat_seq = 0

    @property
    def now(self) -> datetime:
        return self.clock()

    @property
    def interval_s(self) -> float:
        return self._interval_s

    def tick(self, tick: int) -> Records:
        del tick  # the wall clock, not the tick count, stamps a real node's readings
        now = self.clock()
        samples = self.reader.read(now)
        self.devices |= {s.device_uuid for s in samples}
        self.heartbeat_seq += 1
        beat = heartbeat(
            self.identity,
            event_id=self.new_id(),
            at=now,
            seq=self.heartbeat_seq,
            uptime_s=self.monotonic() - self.started,
            agent_version=AGENT_VERSION,
        )
        return [*((ACCELERATOR, s) for s in samples), (NODE_HEALTH, beat)]

    def addressed_to_me(self, target: Target) -> bool:
        if target.node_id is not None:
            return target.node_id == self.identity.node_id
        return target.device_uuid is not None and target.device_uuid in self.devices
