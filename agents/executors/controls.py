"""What executors act on: one small interface per executor, many implementations.

The simulated fleet implements all three (:mod:`agents.sim.control`); a real
GPU host implements :class:`NodeControl` with NVML for the levers the driver
offers (:mod:`agents.collectors.nvml`). Every method returns a one-line detail
for the command result, or raises
:class:`~agents.executors.gate.PermanentActuatorError` /
:class:`~agents.executors.gate.TransientActuatorError`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from schemas.commands import ClockMode, RouteAction, Target


class NodeControl(Protocol):
    """Levers of a host: what each device accepts, its power limit and clocks."""

    def devices(self, target: Target) -> list[str]:
        """Device uuids the target names on this host (all of a node's when no device)."""
        ...

    def set_admission_state(
        self, device_uuid: str, action: RouteAction, *, weight_ratio: float | None
    ) -> str: ...

    def set_power_limit(self, device_uuid: str, watts: float) -> str: ...

    def set_clock_mode(self, device_uuid: str, mode: ClockMode) -> str: ...


class RouterControl(Protocol):
    """The router's table: weights per model and pool, ejected devices, pool levers."""

    def pool_devices(self, pool: str, target: Target) -> list[str]:
        """Devices of ``pool`` that the target names (for ejection)."""
        ...

    def set_pool_weight(self, pool: str, model: str | None, ratio: float) -> str: ...

    def set_ejected(self, device_uuids: list[str], *, ejected: bool) -> str: ...

    def set_replica_weight(self, device_uuids: list[str], ratio: float) -> str:
        """The router's weight for these replicas within their pool (1: as any other)."""
        ...

    def set_pool_lever(self, pool: str, lever: str, value: float) -> str: ...

    def move_batch(self, pool: str, rack_id: str, ratio: float, to_pool: str | None) -> str:
        """Place ``ratio`` of ``pool``'s deferrable batch work on ``rack_id`` in
        ``to_pool`` instead (0: bring it back)."""
        ...

    def table(self) -> dict[str, Any]:
        """The current routing table, as JSON-able data (served to gateways)."""
        ...


class WarmerControl(Protocol):
    """Loading and unloading model replicas in an accelerator pool."""

    def warm(self, pool: str, model: str, replicas: int, *, now: datetime) -> str: ...

    def cool(self, pool: str, model: str, replicas: int, *, now: datetime) -> str: ...
