"""Decision state that must outlive a process: the isolation ladder and its guardrail.

The isolation processor keeps these on a compacted topic (``state.isolation.v1``),
one record per key, and reads them back before its first decision after a start
or a rebalance, so a crash never forgets an isolation, a rung, a rate-limit
history or a lockout that waits for a person.

- key ``device/<uuid>``: an :class:`IsolationRecord` with ``device`` set, for a
  device off the bottom rung; a tombstone (null value) once it is restored;
- key ``guardrail``: the guardrail's isolated set, recent isolating actions,
  lockout and the fleet's size as last counted (so caps and the lockout ratio are
  not computed over the few devices seen since the restart).

Records are written, and acknowledged by the broker, before the commands they
lead to are sent: a crash in between leaves a state that is ahead of the fleet
(a device counted as isolated whose command never left), never behind it. The
last command of each device rides along and is sent again on restore until it
expires; executors drop the copy they already applied (replay memory).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from schemas.base import Contract, Count, Identifier, UtcDatetime
from schemas.commands import RouteCommand
from schemas.verdicts import Verdict

GUARDRAIL_KEY = "guardrail"
DEVICE_KEY_PREFIX = "device/"


class LadderEntry(Contract):
    """One device off the ladder's bottom rung (0 in service, 4 quarantined), or back on it
    with its restore command not yet expired."""

    rung: Annotated[int, Field(ge=0, le=4)]
    rung_at: UtcDatetime | None = None
    healthy_since: UtcDatetime | None = None
    refused_at: UtcDatetime | None = None
    refused_for: Annotated[str, Field(max_length=64)] = ""
    verdict: Verdict = Field(description="the newest verdict the ladder acted on")
    command: RouteCommand | None = Field(
        default=None, description="the last command issued for it: sent again on restore"
    )


class GuardrailEntry(Contract):
    """What the guardrail needs to keep its caps, rate limit and lockout across a restart."""

    isolated: tuple[Identifier, ...] = ()
    lost: tuple[Identifier, ...] = Field(
        default=(), description="of the isolated, those out with a node lost as a whole"
    )
    actions: tuple[UtcDatetime, ...] = Field(default=(), description="isolating actions")
    locked_out: bool = False
    devices: Count = Field(default=0, description="devices the guardrail knew")
    pool_sizes: dict[Identifier, Count] = Field(default_factory=dict)
    rack_sizes: dict[Identifier, Count] = Field(default_factory=dict)


class DetectorMemory(Contract):
    """One device's record in the health detector (``state.health.v1``, keyed by device, in
    the partition of its node's telemetry): what a restarted detector would otherwise
    relearn. ``memory`` is :func:`models.health_memory.remember`'s mapping of plain values."""

    device_uuid: Identifier
    node_id: Identifier
    memory: dict[str, Any]


class DemandMemory(Contract):
    """What the demand planner holds of one (model, region) (``state.demand.v1``, keyed
    like the demand, in its partition): its forecaster's and warming policy's memory, the
    step open and the serving counts held (:meth:`planning.demand.DemandPlanner.remember`).
    ``offset``: the demand partition's next offset when it was written; the memory holds
    every demand record before it."""

    model: Identifier
    region: Identifier
    offset: Count
    memory: dict[str, Any]


class ControlMemory(Contract):
    """What one region's control planner's levers hold (``state.control.v1``, keyed by
    region, in its partition of the region-keyed telemetry): the devices its caps or low
    clocks hold down with their default watts, its racks' batch moves, its replicas'
    routing weights under 1, each pool's batch cap and optional-work budget with its
    controllers' memory (:meth:`planning.pools.ControlPlanner.held`). The process that
    plans the region next adopts it, so what was set is given back in time."""

    region: Identifier
    held: dict[str, Any]


class IsolationRecord(Contract):
    """One record of ``state.isolation.v1``: a device's ladder entry or the guardrail."""

    key: Annotated[str, Field(min_length=1, max_length=160)]
    device: LadderEntry | None = None
    guardrail: GuardrailEntry | None = None
