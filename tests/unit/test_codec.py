import json
import math

import pytest

from schemas.codec import MAX_MESSAGE_BYTES, DecodeError, DecodeErrorKind, decode, encode
from schemas.events import AcceleratorTelemetry
from schemas.topics import TELEMETRY_TOPICS
from tests.factories import fleet_events, fleet_messages, malformed_payloads


def test_every_family_round_trips_through_json() -> None:
    events = fleet_events(500) + fleet_messages(500)
    assert {spec.name for spec, _ in events} == {t.name for t in TELEMETRY_TOPICS}
    for spec, value in events:
        assert decode(encode(value), spec.value_type) == value


@pytest.mark.parametrize(("spec", "raw", "kind"), malformed_payloads(40))
def test_malformed_payloads_are_classified(spec, raw, kind) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DecodeError) as info:
        decode(raw, spec.value_type)
    assert info.value.kind.value == kind
    assert info.value.retriable is False


def test_tombstone_and_oversized_messages_are_rejected() -> None:
    with pytest.raises(DecodeError) as info:
        decode(None, AcceleratorTelemetry)
    assert info.value.kind is DecodeErrorKind.BAD_JSON
    with pytest.raises(DecodeError) as info:
        decode(b" " * (MAX_MESSAGE_BYTES + 1), AcceleratorTelemetry)
    assert info.value.kind is DecodeErrorKind.TOO_LARGE


def test_unknown_fields_are_rejected_not_dropped() -> None:
    spec, value = fleet_events(1)[0]
    raw = encode(value)[:-1] + b', "surprise": 1}'
    with pytest.raises(DecodeError) as info:
        decode(raw, spec.value_type)
    assert info.value.kind is DecodeErrorKind.SCHEMA
    assert "surprise" in info.value.message


def test_null_means_not_reported_and_survives_round_trip() -> None:
    _spec, value = fleet_events(1)[0]
    assert isinstance(value, AcceleratorTelemetry)
    blank = value.model_copy(update={"memory_temp_celsius": None, "xid_last": None})
    back = decode(encode(blank), AcceleratorTelemetry)
    assert back.memory_temp_celsius is None
    assert back.xid_last is None


def test_constructing_a_non_finite_value_fails() -> None:
    _spec, value = fleet_events(1)[0]
    doc = value.model_dump()
    doc["gpu_temp_celsius"] = math.nan
    with pytest.raises(ValueError, match="finite"):
        AcceleratorTelemetry.model_validate(doc)


@pytest.mark.parametrize(
    ("field", "value"),
    [("device_index", 70_000), ("ecc_sbe_volatile_total", 10**30), ("gpu_temp_celsius", 1e300)],
)
def test_values_the_tables_cannot_hold_are_rejected_at_decode(field: str, value: object) -> None:
    # Otherwise ClickHouse would refuse the batch and the worker would stop on a poison message.
    spec, event = next((s, v) for s, v in fleet_events(10) if isinstance(v, AcceleratorTelemetry))
    doc = event.model_dump(mode="json")
    doc[field] = value
    with pytest.raises(DecodeError) as info:
        decode(json.dumps(doc).encode(), spec.value_type)
    assert info.value.kind is DecodeErrorKind.SCHEMA
    assert field in info.value.message
