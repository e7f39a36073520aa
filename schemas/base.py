"""Shared building blocks of every payload.

Every payload carries ``schema_version``. Models are frozen, reject unknown
fields and reject non-finite floats, so a NaN can never reach a controller
through a decoded event.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field

SCHEMA_VERSION: Literal[1] = 1


EARLIEST_INSTANT = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_INSTANT = datetime(2100, 1, 1, tzinfo=UTC)
"""Instants a payload may carry: [1970, 2100). Every such instant converts to UTC
and fits every time column it lands in (ClickHouse ``DateTime`` counts unsigned
32-bit seconds from 1970 and ends in 2106), so a timestamp that is valid here is
storable downstream."""


def _to_utc(value: datetime) -> datetime:
    try:
        utc = value.astimezone(UTC)
    except (OverflowError, ValueError):  # e.g. year 9999 at UTC-1 is past year 9999 in UTC
        raise ValueError(f"instant {value.isoformat()} has no UTC equivalent") from None
    if not EARLIEST_INSTANT <= utc < LATEST_INSTANT:
        raise ValueError(
            f"instant {utc.isoformat()} outside [{EARLIEST_INSTANT.year}, {LATEST_INSTANT.year})"
        )
    return utc


UtcDatetime = Annotated[AwareDatetime, AfterValidator(_to_utc)]
"""A timezone-aware instant in [1970, 2100), normalised to UTC."""

NonNegFloat = Annotated[float, Field(ge=0.0)]
Ratio = Annotated[float, Field(ge=0.0, le=1.0)]
Count = Annotated[int, Field(ge=0, le=2**63 - 1)]
"""A non-negative integer that fits the UInt64 columns it lands in."""
Celsius = Annotated[float, Field(ge=-60.0, le=250.0)]
"""A temperature a sensor on a running device can physically report."""
Identifier = Annotated[str, Field(min_length=1, max_length=128)]

# Physical bounds: a value past them is a broken sensor or a forged message, never a
# reading, so it is refused at decode (a dead letter with its reason) before any model or
# controller can act on it. Each bound leaves an order of magnitude over today's parts.
Watts = Annotated[float, Field(ge=0.0, le=10_000.0)]
"""One accelerator or CPU socket: the largest packages draw under 3 kW (a GB200
superchip about 2.7 kW)."""
FeedWatts = Annotated[float, Field(ge=0.0, le=1_000_000.0)]
"""One PDU phase or rack feed: racks draw 10 to 150 kW (a GB200 NVL72 about 130 kW)."""
Volts = Annotated[float, Field(ge=0.0, le=2_000.0)]
"""Distribution in a data hall: 480 V AC, 800 V DC at most."""
Amperes = Annotated[float, Field(ge=0.0, le=10_000.0)]
"""One phase of a feed: a few hundred amperes."""
Megahertz = Annotated[float, Field(ge=0.0, le=50_000.0)]
"""A clock as NVML reports it: cores under 3.5 GHz, memory under 25 GHz."""
Seconds = Annotated[float, Field(ge=0.0, le=86_400.0)]
"""A latency, a probe's run, a wait: at most a day (past that it is an outage, not a
duration a component reports)."""
IntervalSeconds = Annotated[float, Field(gt=0.0, le=86_400.0)]
"""The span one report covers: more than zero, at most a day."""
UptimeSeconds = Annotated[float, Field(ge=0.0, le=3.2e9)]
"""Since boot: at most a century."""
PerSecond = Annotated[float, Field(ge=0.0, le=1e9)]
"""Tokens or requests per second: a replica serves 1e3 to 1e5 tokens per second, a
region's demand far less than a billion requests per second."""


class Contract(BaseModel):
    """Base of every payload: frozen, closed, finite."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        allow_inf_nan=False,
        use_enum_values=False,
        ser_json_inf_nan="null",
    )

    schema_version: Literal[1] = SCHEMA_VERSION


class AcceleratorType(StrEnum):
    """Accelerator families the fleet runs."""

    H100 = "H100"
    H200 = "H200"
    B200 = "B200"
    A100 = "A100"
    MI300X = "MI300X"
    MTIA = "MTIA"
    CPU = "CPU"


def pool_name(region: str, accelerator_type: AcceleratorType) -> str:
    """A pool is one accelerator type in one region: ``us-east-h100``."""
    return f"{region}-{accelerator_type.value.lower()}"
