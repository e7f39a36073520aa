"""The three executors: node, router and warmer.

Each is an :class:`~agents.executors.gate.Actuator` over one control interface;
:func:`~agents.executors.gate.execute` wraps it with the signature, expiry and
replay checks and turns whatever happens into one result.

Which executor answers a command is a function of the command alone
(:func:`scope_of`), so every valid command has exactly one owner:

- warm commands: the warmer;
- route commands addressed to a pool: the router (pool weights; with a node or
  device as well, ejection or readmission of its devices);
- route commands addressed to a device or node: the node executor (what that
  device accepts: de-weight, stop new sessions, drain, quarantine, restore);
- throttle commands: power cap and clock mode to the node executor; batch
  size, admission, optional-work budget and batch moves to the router.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum

from agents.executors.controls import NodeControl, RouterControl, WarmerControl
from agents.executors.gate import PermanentActuatorError
from schemas.commands import (
    Command,
    RouteAction,
    RouteCommand,
    Target,
    ThrottleAction,
    ThrottleCommand,
    WarmAction,
    WarmCommand,
)

NODE_THROTTLES = {ThrottleAction.POWER_CAP, ThrottleAction.CLOCK_MODE}
EJECTING = {RouteAction.DRAIN, RouteAction.QUARANTINE, RouteAction.STOP_NEW_SESSIONS}


class Scope(StrEnum):
    NODE = "node"
    ROUTER = "router"
    WARMER = "warmer"


def scope_of(command: Command) -> Scope:
    """The executor that owns ``command``; see :func:`scope_of_malformed` for one that
    does not decode."""
    if isinstance(command, WarmCommand):
        return Scope.WARMER
    if isinstance(command, RouteCommand):
        return Scope.ROUTER if command.target.pool else Scope.NODE
    if isinstance(command, ThrottleCommand):
        return Scope.NODE if command.action in NODE_THROTTLES else Scope.ROUTER
    raise TypeError(f"not a command type: {type(command).__name__}")


def scope_of_malformed(
    command_type: type[object], doc: Mapping[str, object], target: Target | None
) -> Scope:
    """The executor that refuses a message of ``command_type`` that does not decode.

    The same rules as :func:`scope_of`, read from what the message says (``doc``, its
    parsed JSON object, empty when it is not one; ``target``, when that part decodes).
    A node command is answered by the node it names; when the message names no node
    or device it could belong to, the router answers (there is one router per fleet,
    so every message still gets exactly one result).
    """
    if command_type is WarmCommand:
        return Scope.WARMER
    node_scoped = (
        target is not None and not target.pool and bool(target.node_id or target.device_uuid)
    )
    if command_type is ThrottleCommand:
        action = doc.get("action")
        node_scoped = node_scoped and any(a.value == action for a in NODE_THROTTLES)
    return Scope.NODE if node_scoped else Scope.ROUTER


def _summary(what: str, items: list[str]) -> str:
    shown = ", ".join(items[:4]) + (f" and {len(items) - 4} more" if len(items) > 4 else "")
    return f"{what}: {shown}"


class NodeExecutor:
    """Host levers: the isolation ladder on devices or nodes, power caps, clock modes."""

    def __init__(self, control: NodeControl) -> None:
        self.control = control

    def apply(self, command: Command, *, now: datetime) -> str:
        del now
        if not (command.target.node_id or command.target.device_uuid):
            raise PermanentActuatorError("the node executor needs a node_id or device_uuid target")
        devices = self.control.devices(command.target)
        if not devices:
            raise PermanentActuatorError(f"no device matches {command.target}")
        if isinstance(command, RouteCommand):
            details = [
                self.control.set_admission_state(
                    d, command.action, weight_ratio=command.weight_ratio
                )
                for d in devices
            ]
        elif isinstance(command, ThrottleCommand) and command.action is ThrottleAction.POWER_CAP:
            assert command.power_limit_watts is not None  # validated by the contract
            watts = command.power_limit_watts
            details = [self.control.set_power_limit(d, watts) for d in devices]
        elif isinstance(command, ThrottleCommand) and command.action is ThrottleAction.CLOCK_MODE:
            assert command.clock_mode is not None
            mode = command.clock_mode
            details = [self.control.set_clock_mode(d, mode) for d in devices]
        else:
            raise PermanentActuatorError(f"the node executor does not do {type(command).__name__}")
        return _summary(f"{len(devices)} device(s)", details)


class RouterExecutor:
    """The routing table: pool weights per model, ejection, admission and batch levers."""

    def __init__(self, control: RouterControl) -> None:
        self.control = control

    def apply(self, command: Command, *, now: datetime) -> str:
        del now
        pool = command.target.pool
        if pool is None:
            raise PermanentActuatorError("the router executor needs a pool target")
        if isinstance(command, ThrottleCommand) and command.action is ThrottleAction.MOVE_BATCH:
            assert command.target.rack_id is not None and command.batch_move_ratio is not None
            return self.control.move_batch(
                pool, command.target.rack_id, command.batch_move_ratio, command.to_pool
            )
        if isinstance(command, ThrottleCommand):
            value = {
                ThrottleAction.BATCH_SIZE: command.batch_size_max,
                ThrottleAction.ADMISSION: command.admission_ratio,
                ThrottleAction.OPTIONAL_BUDGET: command.optional_budget_ratio,
            }.get(command.action)
            if value is None:
                raise PermanentActuatorError(f"the router does not do {command.action.value}")
            done = [self.control.set_pool_lever(pool, command.action.value, float(value))]
            # how the budget is spent: the two levers of optional work, when given
            for lever in ("funnel_extra_candidates", "upgrade_ratio"):
                setting = getattr(command, lever)
                if setting is not None:
                    done.append(self.control.set_pool_lever(pool, lever, float(setting)))
            return "; ".join(done)
        if not isinstance(command, RouteCommand):
            raise PermanentActuatorError(f"the router does not do {type(command).__name__}")
        if command.target.node_id or command.target.device_uuid:
            devices = self.control.pool_devices(pool, command.target)
            if not devices:
                raise PermanentActuatorError(f"no device of pool {pool} matches {command.target}")
            if command.action is RouteAction.RESTORE:
                return self.control.set_ejected(devices, ejected=False)
            if command.action in EJECTING:
                return self.control.set_ejected(devices, ejected=True)
            assert command.weight_ratio is not None  # deweight: validated by the contract
            # the router's own weight for these replicas (power-aware routing), not the
            # device's admission state (the isolation ladder's, through the node executor)
            return self.control.set_replica_weight(devices, command.weight_ratio)
        ratio = {
            RouteAction.DEWEIGHT: command.weight_ratio,
            RouteAction.RESTORE: 1.0,
        }.get(command.action, 0.0)
        assert ratio is not None
        return self.control.set_pool_weight(pool, command.model, ratio)


class Warmer:
    """Loads (warm) or unloads (cool) replicas of a model in a pool."""

    def __init__(self, control: WarmerControl) -> None:
        self.control = control

    def apply(self, command: Command, *, now: datetime) -> str:
        if not isinstance(command, WarmCommand):
            raise PermanentActuatorError(f"the warmer does not do {type(command).__name__}")
        pool = command.target.pool
        if pool is None:
            raise PermanentActuatorError("a warm command needs a pool target")
        if command.action is WarmAction.WARM:
            return self.control.warm(pool, command.model, command.replicas, now=now)
        return self.control.cool(pool, command.model, command.replicas, now=now)
