"""Records the pipeline derives from its telemetry and passes between its own stages.

Serving telemetry is keyed by node; demand, forecasts and warming are keyed by model and
region. The demand role's first stage reads the serving telemetry (split by node
partitions over as many processes as run the role) and sends, per (model, region, pool),
what each serving partition saw in each demand step, keyed by model and region, so the
planner that owns a (model, region) receives every partition's part in its own
partition. Not ingested into ClickHouse: the serving samples it is made of are.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from schemas.base import Contract, Count, Identifier, IntervalSeconds, UtcDatetime

__all__ = ["ServingStep"]


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
