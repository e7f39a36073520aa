"""Telemetry events: the five families node agents publish.

Field names follow DCGM's vocabulary (see :mod:`schemas.dcgm`) with units in
the name and normalised at the edge: temperatures in degrees Celsius, power in
watts, clocks in MHz, memory in bytes, utilisation as a 0..1 ratio, durations in
seconds. A field the device cannot report is ``None``, never 0.

Example::

    >>> from schemas.events import NodeHealth
    >>> NodeHealth.model_validate_json(raw)  # doctest: +SKIP
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated
from uuid import UUID

from pydantic import Field

from schemas.base import (
    AcceleratorType,
    Amperes,
    Celsius,
    Contract,
    Count,
    FeedWatts,
    Identifier,
    IntervalSeconds,
    Megahertz,
    PerSecond,
    Ratio,
    Seconds,
    UptimeSeconds,
    UtcDatetime,
    Volts,
    Watts,
)


class Event(Contract):
    """Common header of every telemetry event."""

    event_id: UUID
    observed_at: UtcDatetime


class AcceleratorTelemetry(Event):
    """One sample of one accelerator (GPU, ASIC or CPU socket), keyed by node."""

    node_id: Identifier
    device_uuid: Identifier
    device_index: Annotated[int, Field(ge=0, le=65_535)]
    accelerator_type: AcceleratorType
    region: Identifier
    pod_id: Identifier
    rack_id: Identifier
    pdu_id: Identifier

    gpu_temp_celsius: Celsius | None = None
    memory_temp_celsius: Celsius | None = None
    power_usage_watts: Watts | None = None
    power_limit_watts: Watts | None = None
    power_limit_min_watts: Watts | None = Field(
        default=None, description="lowest power limit the driver accepts (DCGM field 161)"
    )
    power_limit_max_watts: Watts | None = Field(
        default=None, description="highest power limit the driver accepts (DCGM field 162)"
    )
    sm_clock_mhz: Megahertz | None = None
    mem_clock_mhz: Megahertz | None = None
    gpu_util_ratio: Ratio | None = None
    mem_copy_util_ratio: Ratio | None = None
    fb_used_bytes: Count | None = None
    fb_total_bytes: Count | None = None
    ecc_sbe_volatile_total: Count | None = None
    ecc_dbe_volatile_total: Count | None = None
    ecc_sbe_aggregate_total: Count | None = None
    ecc_dbe_aggregate_total: Count | None = None
    retired_pages_total: Count | None = None
    remapped_rows_total: Count | None = None
    xid_last: Count | None = None
    pcie_replay_total: Count | None = None
    nvlink_errors_total: Count | None = None
    clock_throttle_reasons: Count | None = Field(
        default=None, description="DCGM clock-event reason bitmask; 0 means not throttled"
    )


class ProbeKind(StrEnum):
    """Micro-benchmarks a node agent runs to catch slow-but-alive hardware."""

    GEMM = "gemm"
    HBM_BANDWIDTH = "hbm_bandwidth"
    PCIE_BANDWIDTH = "pcie_bandwidth"
    COLLECTIVE_ALLREDUCE = "collective_allreduce"


class ProbeResult(Contract):
    """Outcome of one probe micro-benchmark on one device (or the whole node)."""

    probe: ProbeKind
    device_uuid: Identifier | None = None
    passed: bool
    duration_s: Seconds
    achieved_per_s: Annotated[float, Field(ge=0.0, le=1e18)] | None = Field(
        default=None,
        description="FLOP/s for gemm, bytes/s for bandwidth probes (at most 1e18: an "
        "exaFLOP/s per device, hundreds of times today's)",
    )
    expected_ratio: Annotated[float, Field(ge=0.0, le=100.0)] | None = Field(
        default=None, description="achieved / reference for this accelerator type"
    )


class NodeHealth(Event):
    """Heartbeat of a node agent, with the probes it ran since the last one."""

    node_id: Identifier
    region: Identifier
    pod_id: Identifier
    rack_id: Identifier
    agent_version: Annotated[str, Field(min_length=1, max_length=64)]
    heartbeat_seq: Count
    uptime_s: UptimeSeconds
    probes: tuple[ProbeResult, ...] = ()


class PduPhase(StrEnum):
    L1 = "L1"
    L2 = "L2"
    L3 = "L3"


class PduReading(Event):
    """One reading of one PDU phase, keyed by PDU."""

    pdu_id: Identifier
    rack_id: Identifier
    pod_id: Identifier
    region: Identifier
    phase: PduPhase
    power_watts: FeedWatts
    capacity_watts: FeedWatts
    breaker_limit_watts: FeedWatts
    voltage_volts: Volts | None = None
    current_amperes: Amperes | None = None


class ServingMetrics(Event):
    """Latency and load of one serving replica over ``interval_s``, keyed by node."""

    replica_id: Identifier
    node_id: Identifier
    device_uuid: Identifier | None = Field(
        default=None, description="the accelerator it runs on; null when it spans several"
    )
    model: Identifier
    pool: Identifier
    region: Identifier
    accelerator_type: AcceleratorType
    interval_s: IntervalSeconds
    tpot_p50_s: Seconds | None = None
    tpot_p95_s: Seconds | None = None
    ttft_p50_s: Seconds | None = None
    ttft_p95_s: Seconds | None = None
    queue_depth: Count
    batch_size: Count
    kv_cache_util_ratio: Ratio | None = None
    tokens_per_s: PerSecond
    requests: Count
    errors: Count
    optional_requests: Count | None = Field(
        default=None, description="of requests, optional work; None: not known"
    )
    batch_requests: Count | None = Field(
        default=None, description="of requests, deferrable batch work; None: not known"
    )


class Demand(Event):
    """Requests for one model in one region over ``interval_s``, keyed by model|region."""

    model: Identifier
    region: Identifier
    interval_s: IntervalSeconds
    requests: Count
    prompt_tokens: Count
    generated_tokens: Count


TELEMETRY_TYPES: tuple[type[Event], ...] = (
    AcceleratorTelemetry,
    NodeHealth,
    PduReading,
    ServingMetrics,
    Demand,
)
