"""Node-tick envelopes: one message per node per interval per family (contract v2).

A v1 telemetry message carried one device's sample; a node of eight GPUs sent
eight accelerator messages and eight serving messages a second, and the
pipeline's cost is per message. A v2 envelope carries every device's sample of
one node for one tick (:class:`AcceleratorTick`), or every serving replica's
metrics (:class:`ServingTick`), keyed by node, with what the samples share
(the node, its place, the instant, the event id) said once.

Codec: these are msgspec structs, chosen by measurement (``python -m
bench.codec``): on the simulated fleet's envelopes msgspec decodes and
validates a sample in about a third of pydantic's time, faster than
``orjson.loads`` builds plain dicts, with the same bounds (they are read off
the v1 pydantic aliases in :mod:`schemas.base`, so the two never drift), the
same error kinds (:func:`schemas.codec.decode_tick`) and a JSON Schema export.

Each sample is still a row in ClickHouse (``sample_index`` says which); the
detectors and planners read it as a flat view (:class:`AcceleratorSample`,
:class:`ServingSample`) with the field names of the v1 contract, so the same
logic judges a v1 message and a sample of a v2 envelope.

Every struct here is ``gc=False``: it holds only scalars and tuples of other such
structs, so it can never be part of a reference cycle, and the collector need not
walk its fields. A batch in flight is tens of thousands of samples; tracked, each
young-generation collection walked every field of every one (a third of a second
per second of ingest at full speed, ``bench.ingest_throughput``).

A consumer of v1 (``telemetry.accelerator.v1``, ``telemetry.serving.v1``) sees
those topics go quiet as agents move to v2; the worker still ingests and judges
v1, so agents can be upgraded one host at a time.
"""

from __future__ import annotations

import typing
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias
from uuid import UUID

from msgspec import Meta, Raw, Struct
from msgspec.structs import astuple, force_setattr

from schemas import base
from schemas.base import AcceleratorType
from schemas.events import AcceleratorTelemetry, ServingMetrics


def _twin(alias: Any) -> Any:
    """The msgspec twin of a pydantic alias from :mod:`schemas.base` (same bounds)."""
    inner, *extras = typing.get_args(alias)
    bounds: dict[str, Any] = {}
    for extra in extras:
        for item in getattr(extra, "metadata", ()):
            for name in ("ge", "gt", "le", "lt", "min_length", "max_length"):
                if getattr(item, name, None) is not None:
                    bounds[name] = getattr(item, name)
    return Annotated[inner, Meta(**bounds)]


if TYPE_CHECKING:  # what a type checker needs to know; the bounds are runtime metadata
    Identifier: TypeAlias = str
    Celsius: TypeAlias = float
    Watts: TypeAlias = float
    Megahertz: TypeAlias = float
    Ratio: TypeAlias = float
    Count: TypeAlias = int
    Seconds: TypeAlias = float
    IntervalSeconds: TypeAlias = float
    PerSecond: TypeAlias = float
else:
    Identifier = _twin(base.Identifier)
    Celsius = _twin(base.Celsius)
    Watts = _twin(base.Watts)
    Megahertz = _twin(base.Megahertz)
    Ratio = _twin(base.Ratio)
    Count = _twin(base.Count)
    Seconds = _twin(base.Seconds)
    IntervalSeconds = _twin(base.IntervalSeconds)
    PerSecond = _twin(base.PerSecond)
DeviceIndex = Annotated[int, Meta(ge=0, le=65_535)]

MAX_SAMPLES = 1024
"""Samples in one envelope: a node has 8 to 72 accelerators (an NVL72 tray is 4); 1024
leaves room for CPU sockets and chiplets while bounding a message near 1 MB."""

ENVELOPE_VERSION: Literal[2] = 2


def _utc(value: datetime) -> datetime:
    if value.tzinfo is UTC and base.EARLIEST_INSTANT <= value < base.LATEST_INSTANT:
        return value  # what agents send ("Z"): nothing to convert, once per envelope
    return base._to_utc(value)


class Envelope(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """What every node-tick envelope carries once for all its samples."""

    event_id: UUID
    observed_at: Annotated[datetime, Meta(tz=True)]
    node_id: Identifier
    region: Identifier

    def __post_init__(self) -> None:
        # frozen to everyone else: the normalised instant replaces the decoded one here
        force_setattr(self, "observed_at", _utc(self.observed_at))


class DeviceSample(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """One accelerator's sample inside an :class:`AcceleratorTick` (v1's measurement fields)."""

    device_uuid: Identifier
    device_index: DeviceIndex
    accelerator_type: AcceleratorType
    gpu_temp_celsius: Celsius | None = None
    memory_temp_celsius: Celsius | None = None
    power_usage_watts: Watts | None = None
    power_limit_watts: Watts | None = None
    power_limit_min_watts: Watts | None = None
    power_limit_max_watts: Watts | None = None
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
    clock_throttle_reasons: Count | None = None


class AcceleratorTick(Envelope, frozen=True, forbid_unknown_fields=True, gc=False):
    """Every accelerator sample of one node for one tick; keyed by node."""

    pod_id: Identifier
    rack_id: Identifier
    pdu_id: Identifier
    samples: Annotated[tuple[DeviceSample, ...], Meta(min_length=1, max_length=MAX_SAMPLES)]
    schema_version: Literal[2] = ENVELOPE_VERSION


class ReplicaSample(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """One serving replica's metrics inside a :class:`ServingTick` (v1's fields)."""

    replica_id: Identifier
    model: Identifier
    pool: Identifier
    accelerator_type: AcceleratorType
    interval_s: IntervalSeconds
    queue_depth: Count
    batch_size: Count
    tokens_per_s: PerSecond
    requests: Count
    errors: Count
    device_uuid: Identifier | None = None
    tpot_p50_s: Seconds | None = None
    tpot_p95_s: Seconds | None = None
    ttft_p50_s: Seconds | None = None
    ttft_p95_s: Seconds | None = None
    kv_cache_util_ratio: Ratio | None = None
    optional_requests: Count | None = None
    batch_requests: Count | None = None


class ServingTick(Envelope, frozen=True, forbid_unknown_fields=True, gc=False):
    """Every serving replica's metrics on one node for one tick; keyed by node."""

    samples: Annotated[tuple[ReplicaSample, ...], Meta(min_length=1, max_length=MAX_SAMPLES)]
    schema_version: Literal[2] = ENVELOPE_VERSION


Tick = AcceleratorTick | ServingTick
TICK_TYPES: tuple[type[AcceleratorTick] | type[ServingTick], ...] = (AcceleratorTick, ServingTick)


class AcceleratorSample(Struct, frozen=True, gc=False):
    """One device's sample of an :class:`AcceleratorTick` as the detectors read it: the v1
    contract's field names, header and sample together (built, never decoded)."""

    event_id: UUID
    observed_at: datetime
    node_id: str
    region: str
    pod_id: str
    rack_id: str
    pdu_id: str
    device_uuid: str
    device_index: int
    accelerator_type: AcceleratorType
    gpu_temp_celsius: float | None
    memory_temp_celsius: float | None
    power_usage_watts: float | None
    power_limit_watts: float | None
    power_limit_min_watts: float | None
    power_limit_max_watts: float | None
    sm_clock_mhz: float | None
    mem_clock_mhz: float | None
    gpu_util_ratio: float | None
    mem_copy_util_ratio: float | None
    fb_used_bytes: int | None
    fb_total_bytes: int | None
    ecc_sbe_volatile_total: int | None
    ecc_dbe_volatile_total: int | None
    ecc_sbe_aggregate_total: int | None
    ecc_dbe_aggregate_total: int | None
    retired_pages_total: int | None
    remapped_rows_total: int | None
    xid_last: int | None
    pcie_replay_total: int | None
    nvlink_errors_total: int | None
    clock_throttle_reasons: int | None
    sample_index: int = 0


class ServingSample(Struct, frozen=True, gc=False):
    """One replica's metrics of a :class:`ServingTick` as the planners read them."""

    event_id: UUID
    observed_at: datetime
    node_id: str
    region: str
    replica_id: str
    model: str
    pool: str
    accelerator_type: AcceleratorType
    interval_s: float
    queue_depth: int
    batch_size: int
    tokens_per_s: float
    requests: int
    errors: int
    device_uuid: str | None
    tpot_p50_s: float | None
    tpot_p95_s: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    kv_cache_util_ratio: float | None
    optional_requests: int | None
    batch_requests: int | None
    sample_index: int = 0


_DEVICE_FIELDS = DeviceSample.__struct_fields__
_REPLICA_FIELDS = ReplicaSample.__struct_fields__
# the views take a sample's fields positionally: they list them in the same order
assert AcceleratorSample.__struct_fields__[7:-1] == _DEVICE_FIELDS
assert ServingSample.__struct_fields__[4:-1] == _REPLICA_FIELDS


def accelerator_samples(tick: AcceleratorTick) -> list[AcceleratorSample]:
    """Each device's sample of ``tick`` as a flat view."""
    head = (tick.event_id, tick.observed_at, tick.node_id, tick.region, tick.pod_id,
            tick.rack_id, tick.pdu_id)  # fmt: skip
    return [
        AcceleratorSample(*head, *astuple(s), i)  # type: ignore[call-arg]
        for i, s in enumerate(tick.samples)
    ]


def serving_samples(tick: ServingTick) -> list[ServingSample]:
    """Each replica's metrics of ``tick`` as a flat view."""
    head = (tick.event_id, tick.observed_at, tick.node_id, tick.region)
    return [
        ServingSample(*head, *astuple(s), i)  # type: ignore[call-arg]
        for i, s in enumerate(tick.samples)
    ]


def pack_accelerator(samples: typing.Sequence[Any], *, event_id: UUID) -> AcceleratorTick:
    """One node's v1 accelerator samples of one instant as a v2 envelope; the header comes
    from the first (a node's samples share it)."""
    first = samples[0]
    return AcceleratorTick(
        event_id=event_id, observed_at=first.observed_at, node_id=first.node_id,
        region=first.region, pod_id=first.pod_id, rack_id=first.rack_id, pdu_id=first.pdu_id,
        samples=tuple(DeviceSample(*(getattr(s, f) for f in _DEVICE_FIELDS)) for s in samples),
    )  # fmt: skip


def pack_serving(replicas: typing.Sequence[Any], *, event_id: UUID) -> ServingTick:
    """One node's v1 serving metrics of one instant as a v2 envelope."""
    first = replicas[0]
    return ServingTick(
        event_id=event_id, observed_at=first.observed_at, node_id=first.node_id,
        region=first.region,
        samples=tuple(
            ReplicaSample(**{f: getattr(r, f) for f in _REPLICA_FIELDS}) for r in replicas
        ),
    )  # fmt: skip


class AcceleratorHead(Envelope, frozen=True, forbid_unknown_fields=True, gc=False):
    """An :class:`AcceleratorTick` with its samples left undecoded: how a bad sample is
    told apart from a bad envelope."""

    pod_id: Identifier
    rack_id: Identifier
    pdu_id: Identifier
    samples: Annotated[tuple[Raw, ...], Meta(min_length=1, max_length=MAX_SAMPLES)]
    schema_version: Literal[2] = ENVELOPE_VERSION


class ServingHead(Envelope, frozen=True, forbid_unknown_fields=True, gc=False):
    """A :class:`ServingTick` with its samples left undecoded."""

    samples: Annotated[tuple[Raw, ...], Meta(min_length=1, max_length=MAX_SAMPLES)]
    schema_version: Literal[2] = ENVELOPE_VERSION


HEADS: dict[type[Struct], tuple[type[Struct], type[Struct]]] = {
    AcceleratorTick: (AcceleratorHead, DeviceSample),
    ServingTick: (ServingHead, ReplicaSample),
}
"""Each envelope type: its head (samples as raw JSON) and its sample type."""


AnyAcceleratorSample = AcceleratorTelemetry | AcceleratorSample
"""What a detector or planner reads as one device's sample: a v1 message or a v2 view."""
AnyServingSample = ServingMetrics | ServingSample
"""What a detector or planner reads as one replica's metrics: a v1 message or a v2 view."""
DeviceReading = AnyAcceleratorSample | DeviceSample
"""One device's measurements, with or without its envelope's header (node, rack, time)."""
ReplicaReading = AnyServingSample | ReplicaSample
"""One replica's metrics, with or without its envelope's header (node, region, time)."""
