"""Records the pipeline derives from its telemetry and passes between its own stages.

Serving telemetry is keyed by node; demand, forecasts and warming are keyed by model and
region. The demand role's first stage reads the serving telemetry (split by node
partitions over as many processes as run the role) and sends, per (model, region, pool),
what each serving partition saw in each demand step, keyed by model and region, so the
planner that owns a (model, region) receives every partition's part in its own
partition. Not ingested into ClickHouse: the serving samples it is made of are.

The control role is split by region: its telemetry is forwarded as it is, keyed by region
(``schemas.topics.regional``), and the fleet's optional-work limit is shared between the
processes that plan the regions by :class:`BudgetClaim` records.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from schemas.base import (
    Contract,
    Count,
    Identifier,
    IntervalSeconds,
    UtcDatetime,
)

__all__ = ["BudgetClaim", "ServingStep"]

DeviceUnits = Annotated[float, Field(ge=0.0, le=1e9)]
"""An amount of accelerator capacity, in devices' worth."""


class ServingStep(Contract):
    """The replicas of one model in one region and pool that served requests in one demand
    step, as one partition of the serving telemetry saw them so far (``demand.serving``).
    Within a step each later record of the same source counts at least as much: a
    consumer keeps the largest, so a copy or a replay changes nothing."""

    model: Identifier
    region: Identifier
    pool: Identifier
    step_at: UtcDatetime = Field(description="the demand step's start (event time)")
    step_s: IntervalSeconds
    source: Annotated[str, Field(min_length=1, max_length=256)] = Field(
        description="the serving partition it summarises: <topic>/<partition>"
    )
    replicas: Count = Field(description="distinct replicas that served a request in it")
    requests: Count = Field(description="requests they served in it")
    observed_at: UtcDatetime = Field(description="event time of the newest sample counted")


class BudgetClaim(Contract):
    """What one pool holds of the fleet's optional-work limit, as the control process that
    plans it granted at a control period's end. Every control process hears every claim and
    counts the other processes' pools' latest against the limit; a newer claim of a pool
    replaces the older (the topic is compacted by pool)."""

    pool: Identifier
    region: Identifier
    units: DeviceUnits = Field(description="device-equivalents of optional work it may run")
    capacity_units: DeviceUnits = Field(description="its capacity then, in the same units")
    claimed_at: UtcDatetime = Field(description="the control period's end (event time)")
    owner: Annotated[str, Field(min_length=1, max_length=256)] = Field(
        description="the control process that plans the pool (its claims are not its own others')"
    )
