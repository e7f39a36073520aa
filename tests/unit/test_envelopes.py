"""Node-tick envelopes (contract v2): what agents pack, the codec keeps, ingest splits (a
bad sample is dead-lettered alone), the sink stores (one row per sample) and the detectors
read (the v1 field names)."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import re
from enum import Enum
from typing import Any

import msgspec
from prometheus_client import CollectorRegistry

from agents.envelopes import pack
from schemas.codec import DecodeErrorKind, decode, decode_samples, decode_tick, encode
from schemas.envelopes import (
    MAX_SAMPLES,
    AcceleratorSample,
    AcceleratorTick,
    DeviceSample,
    ReplicaSample,
    ServingSample,
    ServingTick,
)
from schemas.events import AcceleratorTelemetry, ServingMetrics
from schemas.topics import ACCELERATOR_TICKS, SERVING_TICKS
from streams.clickhouse_store import ClickHouseStore
from streams.ingest import RawMessage, split
from streams.rows import Coordinates
from streams.sink import ClickHouseSink
from tests.factories import START, fleet_events, ingest_now

HEADER = {"event_id", "observed_at", "node_id", "region", "pod_id", "rack_id", "pdu_id"}


def _ticks(count: int = 2000) -> list[tuple[Any, Any]]:
    return pack(fleet_events(count))


def test_a_nodes_samples_of_one_tick_travel_as_one_envelope() -> None:
    events = fleet_events(2000)
    packed = pack(events)
    devices = [v for s, v in events if isinstance(v, AcceleratorTelemetry)]
    ticks = [v for s, v in packed if s is ACCELERATOR_TICKS]
    assert sum(len(t.samples) for t in ticks) == len(devices)
    assert len(ticks) == len({(d.node_id, d.observed_at) for d in devices})
    replicas = [v for s, v in events if isinstance(v, ServingMetrics)]
    served = [v for s, v in packed if s is SERVING_TICKS]
    assert sum(len(t.samples) for t in served) == len(replicas)
    # what is not packed passes through in order
    rest = [v for s, v in events if not isinstance(v, AcceleratorTelemetry | ServingMetrics)]
    assert [v for s, v in packed if s not in (ACCELERATOR_TICKS, SERVING_TICKS)] == rest


def test_the_views_of_an_envelope_are_the_v1_samples_it_was_packed_from() -> None:
    events = fleet_events(600)
    devices = [v for s, v in events if isinstance(v, AcceleratorTelemetry)]
    replicas = [v for s, v in events if isinstance(v, ServingMetrics)]
    views: list[Any] = []
    for spec, value in pack(events):
        if spec.envelope:
            views += decode_samples(encode(value), spec.value_type)
    by_kind: dict[type[Any], tuple[list[Any], Any]] = {
        AcceleratorSample: (devices, AcceleratorTelemetry),
        ServingSample: (replicas, ServingMetrics),
    }
    for view_type, (originals, contract) in by_kind.items():
        mine = [v for v in views if isinstance(v, view_type)]
        assert len(mine) == len(originals)
        names = [f for f in contract.model_fields if f != "schema_version"]
        for view, original in zip(mine, originals, strict=True):
            assert {f: getattr(view, f) for f in names if f != "event_id"} == {
                f: getattr(original, f) for f in names if f != "event_id"
            }


def test_the_envelopes_carry_every_v1_field_with_the_same_bounds() -> None:
    pairs = [(AcceleratorTick, DeviceSample, AcceleratorTelemetry)]
    pairs.append((ServingTick, ReplicaSample, ServingMetrics))  # type: ignore[arg-type]
    for tick, sample, contract in pairs:
        mine = {*tick.__struct_fields__, *sample.__struct_fields__} - {"samples"}
        assert mine == set(contract.model_fields), contract.__name__
        ours = msgspec.json.schema(sample)["$defs"][sample.__name__]["properties"]
        theirs = contract.model_json_schema()["properties"]
        for name, prop in ours.items():

            def bounds(prop: dict[str, Any]) -> set[tuple[str, Any]]:
                alts = prop.get("anyOf", [prop])
                keys = ("minimum", "maximum", "exclusiveMinimum", "minLength", "maxLength")
                return {(k, a[k]) for a in alts for k in keys if k in a}

            assert bounds(prop) == bounds(theirs[name]), f"{contract.__name__}.{name}"


def test_a_bad_sample_is_dead_lettered_alone_with_its_index() -> None:
    _, tick = next((s, v) for s, v in _ticks() if s is ACCELERATOR_TICKS)
    doc = json.loads(encode(tick))
    doc["samples"][3]["gpu_temp_celsius"] = 900.0  # past any sensor
    doc["samples"][5]["power_usage_watts"] = -1.0
    raw = json.dumps(doc).encode()
    out = split([RawMessage(Coordinates("t", 4, 77), b"node-1", raw)], AcceleratorTick, now=START)
    ((kept, at),) = out.valid
    assert at.offset == 77 and len(kept.samples) == len(tick.samples) - 2
    assert [s.device_uuid for s in kept.samples] == [
        s.device_uuid for i, s in enumerate(tick.samples) if i not in (3, 5)
    ]
    letters = [letter for letter, _ in out.dead]
    assert [letter.source_index for letter in letters] == [3, 5]
    assert letters[0].error_kind == "schema" and "$.samples[3].gpu_temp_celsius" in letters[0].error
    assert json.loads(base64.b64decode(letters[0].raw_base64))["gpu_temp_celsius"] == 900.0
    assert all(letter.source_offset == 77 and letter.source_key == "node-1" for letter in letters)


def test_a_bad_envelope_is_one_dead_letter_with_its_kind() -> None:
    _, tick = next((s, v) for s, v in _ticks() if s is ACCELERATOR_TICKS)
    doc = json.loads(encode(tick))
    cases = {
        DecodeErrorKind.BAD_JSON: encode(tick)[:-3],
        DecodeErrorKind.NOT_AN_OBJECT: b"[]",
        DecodeErrorKind.UNKNOWN_VERSION: json.dumps({**doc, "schema_version": 1}).encode(),
        DecodeErrorKind.SCHEMA: json.dumps({**doc, "node_id": ""}).encode(),
        DecodeErrorKind.NON_FINITE: re.sub(
            rb'"gpu_temp_celsius":[0-9.]+', b'"gpu_temp_celsius":NaN', encode(tick), count=1
        ),
    }
    for kind, raw in cases.items():
        out = split([RawMessage(Coordinates("t", 0, 1), None, raw)], AcceleratorTick, now=START)
        assert out.valid == [], kind
        ((letter, _),) = out.dead
        assert letter.error_kind == kind.value and letter.source_index is None, letter.error
    too_many = {**doc, "samples": doc["samples"] * (MAX_SAMPLES // len(doc["samples"]) + 1)}
    out = split(
        [RawMessage(Coordinates("t", 0, 2), None, json.dumps(too_many).encode())],
        AcceleratorTick,
        now=START,
    )
    assert out.valid == [] and out.dead[0][0].error_kind == "schema"


def test_an_envelope_of_only_bad_samples_keeps_nothing_and_loses_no_letter() -> None:
    _, tick = next((s, v) for s, v in _ticks() if s is SERVING_TICKS)
    doc = json.loads(encode(tick))
    for sample in doc["samples"]:
        sample["queue_depth"] = -1
    result = decode_tick(json.dumps(doc).encode(), ServingTick)
    assert result.tick is None and len(result.bad) == len(doc["samples"])
    assert decode_samples(json.dumps(doc).encode(), ServingTick) == []


def _same(stored: Any, sent: Any) -> bool:
    if isinstance(sent, float) and stored is not None:  # Float32 columns keep ~7 digits
        return math.isclose(stored, sent, rel_tol=1e-6)
    if isinstance(sent, Enum):
        return bool(stored == sent.value)
    return bool(stored == sent)


def test_every_field_of_every_sample_lands_in_its_own_column(store: ClickHouseStore) -> None:
    """The staging line is positional (a sample is an array in its struct's field order):
    a field written into its neighbour's column must fail here, nulls included."""
    prefix = "cols."
    records: list[tuple[Any, Coordinates]] = []
    views: dict[str, list[Any]] = {}
    for offset, (spec, value) in enumerate(pack(fleet_events(600))):
        if spec.envelope:
            records.append((value, Coordinates(prefix + spec.name, 0, offset)))
            views.setdefault(spec.table, []).extend(decode_samples(encode(value), spec.value_type))
    asyncio.run(
        ClickHouseSink(store, registry=CollectorRegistry()).write(records, now=ingest_now())
    )
    nulls = 0
    for table, contract in (
        ("accelerator_telemetry", AcceleratorTelemetry),
        ("serving_metrics", ServingMetrics),
    ):
        names = [f for f in contract.model_fields if f not in ("schema_version", "observed_at")]
        rows = store.query(
            f"SELECT toString(event_id), toUnixTimestamp64Milli(observed_at), "
            f"{', '.join(names[1:])} FROM {store.database}.{table} "
            f"WHERE startsWith(src_topic, '{prefix}') ORDER BY src_offset, sample_index"
        ).rows
        sent = views[table]
        assert len(rows) == len(sent) > 0, table
        for row, view in zip(rows, sent, strict=True):
            assert row[0] == str(view.event_id)
            assert abs(row[1] - view.observed_at.timestamp() * 1000) < 1
            for name, stored in zip(names[1:], row[2:], strict=True):
                assert _same(stored, getattr(view, name)), (table, name, stored, view)
                nulls += stored is None
    assert nulls > 0  # the fleet's mix has absent fields (MTIA's memory temperature): null


def test_envelopes_land_as_one_row_per_sample_beside_v1_once_each(
    store: ClickHouseStore,
) -> None:
    prefix = "env."
    events = fleet_events(3000)
    offsets: dict[str, int] = {}
    records: list[tuple[Any, Coordinates]] = []
    for spec, value in [*pack(events[:1500]), *events[1500:]]:  # v2 agents beside v1 ones
        topic = prefix + spec.name
        offsets[topic] = offsets.get(topic, -1) + 1
        records.append((value, Coordinates(topic, 0, offsets[topic])))
    sink = ClickHouseSink(store, registry=CollectorRegistry())
    half = len(records) // 2
    assert asyncio.run(sink.write(records[:half], now=ingest_now())) > half
    restarted = ClickHouseSink(store, registry=CollectorRegistry())
    asyncio.run(restarted.write(records, now=ingest_now()))  # the first half again: dropped
    resent = [
        (value, Coordinates(at.topic, 0, at.offset + 10_000, resent=True))
        for value, at in records[:200]
    ]
    assert asyncio.run(restarted.write(resent, now=ingest_now())) == 0  # copies of stored ones
    for table, contract in (
        ("accelerator_telemetry", AcceleratorTelemetry),
        ("serving_metrics", ServingMetrics),
    ):
        count, unique, v2 = store.query(
            f"SELECT count(), uniqExact(event_id, sample_index), countIf(schema_version = 2) "
            f"FROM {store.database}.{table} WHERE startsWith(src_topic, '{prefix}')"
        ).rows[0]
        assert count == unique == sum(isinstance(v, contract) for _, v in events), table
        assert 0 < v2 < count
    rows = store.query(
        f"SELECT device_uuid, sample_index, node_id, rack_id FROM {store.database}."
        f"accelerator_telemetry WHERE src_topic = '{prefix}{ACCELERATOR_TICKS.name}' "
        "AND src_offset = 0 ORDER BY sample_index"
    ).rows
    first = next(v for s, v in pack(events[:1500]) if s is ACCELERATOR_TICKS)
    assert [tuple(r) for r in rows] == [
        (s.device_uuid, i, first.node_id, first.rack_id) for i, s in enumerate(first.samples)
    ]


def test_decode_is_strict_where_decode_tick_is_lenient() -> None:
    _, tick = next((s, v) for s, v in _ticks() if s is ACCELERATOR_TICKS)
    doc = json.loads(encode(tick))
    doc["samples"][0]["device_index"] = -3
    raw = json.dumps(doc).encode()
    assert decode_tick(raw, AcceleratorTick).tick is not None
    try:
        decode(raw, AcceleratorTick)
    except ValueError as exc:
        assert "$.samples[0].device_index" in str(exc)
    else:
        raise AssertionError("a bad sample passed the strict decode")
    assert set(AcceleratorTick.__struct_fields__) >= HEADER
