"""Every controller the worker runs, in one table: its name, the worker role that runs
it, the command type it issues, where its commands go, and the reasons it gives.

The name is both a decision's ``controller`` and its command's ``issuer``
(:func:`planning.issuing.issue` takes it from here), so a command in ClickHouse
joins to the decision that sent it by name as well as by id. The roles a worker
may run (``ingest`` plus every controller's role) and the metric labels each
processor declares at start come from this table; adding a controller is a
row here and its planner.
"""

from __future__ import annotations

from dataclasses import dataclass

from controllers.capacity import CapacityReason
from controllers.guardrail import GuardReason
from controllers.isolation import REASONS as LADDER_REASONS
from controllers.power import PowerReason
from controllers.power_routing import PowerRouteReason
from controllers.tpot_guard import BatchReason
from controllers.warming import WarmReason
from schemas.commands import Command, RouteCommand, ThrottleCommand, WarmCommand
from schemas.topics import ROUTE_COMMANDS, THROTTLE_COMMANDS, WARM_COMMANDS, TopicSpec

INGEST = "ingest"
"""The role that writes every topic to ClickHouse (not a controller)."""


@dataclass(frozen=True, slots=True)
class Controller:
    name: str  # a decision's controller, its command's issuer
    role: str  # the worker role (processor) that runs it
    command: type[Command]
    topic: TopicSpec  # where its commands go
    reasons: tuple[str, ...]  # every reason its decisions give (a closed set: metric labels)


ISOLATION = Controller("isolation", "health", RouteCommand, ROUTE_COMMANDS, LADDER_REASONS)
WARMING = Controller("warming", "demand", WarmCommand, WARM_COMMANDS, (*WarmReason, *GuardReason))
CAPACITY = Controller("capacity", "control", ThrottleCommand, THROTTLE_COMMANDS, (*CapacityReason,))
TPOT_GUARD = Controller(
    "tpot_guard", "control", ThrottleCommand, THROTTLE_COMMANDS, (*BatchReason,)
)
POWER = Controller("power", "control", ThrottleCommand, THROTTLE_COMMANDS, (*PowerReason,))
POWER_ROUTING = Controller(
    "power_routing", "control", RouteCommand, ROUTE_COMMANDS, (*PowerRouteReason,)
)

CONTROLLERS: tuple[Controller, ...] = (
    ISOLATION,
    WARMING,
    CAPACITY,
    TPOT_GUARD,
    POWER,
    POWER_ROUTING,
)
ROLES: tuple[str, ...] = (INGEST, *dict.fromkeys(c.role for c in CONTROLLERS))
"""What a worker may run, in the order the default runs them."""

_BY_NAME = {c.name: c for c in CONTROLLERS}


def controller(name: str) -> Controller:
    """The registered controller called ``name``; a clear error for any other name."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no controller {name!r}; registered: {sorted(_BY_NAME)}") from None


def controllers_of(role: str) -> tuple[Controller, ...]:
    """The controllers a worker role runs (none for ``ingest``)."""
    return tuple(c for c in CONTROLLERS if c.role == role)
