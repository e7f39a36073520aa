"""Contracts -> ClickHouse inserts.

Events go in as JSONEachRow: the validated model is re-serialised by pydantic
(canonical: UTC instants, enums as values, nulls kept) and the row's Kafka
coordinates and ingestion time are appended, so ClickHouse parses the batch
natively instead of clickhouse-connect encoding every value in Python (on the
development machine: about 144k rows/s against 65k rows/s for the simulated
fleet's mix, dedup token included); chDB parses it with the GIL released, so
the next batch decodes meanwhile. A node-tick envelope (v2) becomes one
positional line (JSONCompactEachRow) into its staging table, which a view
explodes into one row per sample with ``sample_index``: its samples as arrays,
not objects, since matching every sample's 25 keys by name was most of what
ClickHouse spent on an envelope (see ``_tick_lines``). Dead letters carry
arbitrary bytes, which JSON cannot, so they go in as rows. Column names come
from the models; tests check the DDL in ``infra/clickhouse/schema`` agrees, in
order where the format is positional.
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
from typing import Any, NamedTuple

import msgspec
from msgspec.structs import astuple

from schemas.base import Contract
from schemas.commands import COMMAND_TYPES, Command, CommandResult, DeadLetter
from schemas.envelopes import AcceleratorTick, ServingTick
from schemas.events import AcceleratorTelemetry, ServingMetrics
from schemas.topics import COMMAND_RESULTS, JUDGEMENT_TOPICS, TELEMETRY_TOPICS

COORDINATES = ("src_topic", "src_partition", "src_offset")
JSON_INSERT_SETTINGS = {
    "input_format_skip_unknown_fields": 0,  # a field without a column is an error, not a loss
    "input_format_json_ignore_unknown_keys_in_named_tuple": 1,  # probes' schema_version
    "date_time_input_format": "best_effort",
}
COMPACT_INSERT_SETTINGS = {
    **JSON_INSERT_SETTINGS,
    "input_format_json_named_tuples_as_objects": 0,  # a sample is an array, by position
}


class Coordinates(NamedTuple):
    """Where a message came from. A named tuple, not a frozen dataclass: one is made for
    every message the ingest reads, and a frozen dataclass's ``__init__`` (a guarded
    ``object.__setattr__`` per field) cost 2 us a message more (a microbenchmark of 10,000
    messages: 3.4 us for the pair with its :class:`~streams.ingest.RawMessage`, 1.4 us as
    named tuples)."""

    topic: str
    partition: int
    offset: int
    resent: bool = False  # sent again from an agent's spool: may be a copy of a stored event


@dataclass(frozen=True, slots=True)
class TableLayout:
    """How one value type is written to one table: as JSON lines (one value may be several
    rows: an envelope's samples) or as rows."""

    table: str
    columns: tuple[str, ...]
    coordinate_columns: tuple[str, str, str]
    to_lines: Callable[[Any, Coordinates, bytes], list[bytes]] | None = None
    to_row: Callable[[Any, Coordinates, datetime], list[Any]] | None = None
    lands_in: str = ""  # where its rows land, when ``table`` is a staging table
    compact: bool = False  # lines are arrays in ``columns``' order (JSONCompactEachRow)

    @property
    def json_format(self) -> str:
        return "JSONCompactEachRow" if self.compact else "JSONEachRow"

    @property
    def json_settings(self) -> dict[str, Any]:
        return COMPACT_INSERT_SETTINGS if self.compact else JSON_INSERT_SETTINGS

    @property
    def rows_table(self) -> str:
        """The table that holds the rows (and their coordinates, the watermarks' source)."""
        return self.lands_in or self.table

    def rows(self, value: Any) -> int:
        """How many rows ``value`` becomes: one, or an envelope's samples."""
        return len(value.samples) if self.lands_in else 1


def instant_json(at: datetime) -> bytes:
    """A JSON string literal for ``at`` (what ``to_lines`` expects for the ingestion time)."""
    return json.dumps(at.isoformat()).encode()


@functools.cache
def _topic_json(topic: str) -> bytes:
    return json.dumps(topic).encode()


def _tail(at: Coordinates, ingested_at_json: bytes) -> bytes:
    return b',"src_topic":%s,"src_partition":%d,"src_offset":%d,"ingested_at":%s}' % (
        _topic_json(at.topic),
        at.partition,
        at.offset,
        ingested_at_json,
    )


def _event_lines(value: Contract, at: Coordinates, ingested_at_json: bytes) -> list[bytes]:
    return [value.model_dump_json().encode()[:-1] + _tail(at, ingested_at_json)]


_ENCODER = msgspec.json.Encoder()


def _tick_lines(value: Any, at: Coordinates, ingested_at_json: bytes) -> list[bytes]:
    """One positional line per envelope, into its staging table (``011_envelope_staging.sql``),
    in the order of ``_staging_columns``: the validated envelope's head, its samples as
    arrays in their struct's field order (the DDL's tuple order, tested), then its
    coordinates. Re-encoded, so canonical (UTC, no duplicate keys). Python spends about
    what an object per envelope cost it (1.2 us per sample); chDB parses an accelerator
    sample in 2.2 us instead of 4.5 (no key to match per value), on the development
    machine, 100k samples."""
    head = _HEADS[type(value)](value)
    samples = [astuple(s) for s in value.samples]
    where = (at.topic, at.partition, at.offset, msgspec.Raw(ingested_at_json))
    return [_ENCODER.encode((*head, samples, *where))]  # one pass, nothing copied after


STAGING: dict[type[Any], str] = {
    AcceleratorTick: "accelerator_ticks_in",
    ServingTick: "serving_ticks_in",
}
"""Each envelope type's staging table (Null engine; a view writes the rows on)."""


def _head_fields(tick: type[Any]) -> tuple[str, ...]:
    return tuple(f for f in tick.__struct_fields__ if f != "samples")


def _staging_columns(tick: type[Any]) -> tuple[str, ...]:
    return (*_head_fields(tick), "samples", *COORDINATES, "ingested_at")


_HEADS = {tick: attrgetter(*_head_fields(tick)) for tick in STAGING}
"""Each envelope type's head, as a tuple in its staging columns' order."""


SAMPLE_INDEX = "sample_index"
"""Which sample of its envelope a row is (0 for a v1 message, one sample each)."""


def _event_layout(table: str, value_type: type[Contract]) -> TableLayout:
    fields = tuple(value_type.model_fields)
    coordinates = (*COORDINATES, SAMPLE_INDEX) if table in _ENVELOPE_TABLES else COORDINATES
    return TableLayout(table, (*fields, *coordinates, "ingested_at"), COORDINATES, _event_lines)


_ENVELOPE_TABLES = {spec.table for spec in TELEMETRY_TOPICS if spec.envelope}
_ROWS_OF: dict[type[Any], type[Contract]] = {
    AcceleratorTick: AcceleratorTelemetry, ServingTick: ServingMetrics
}  # fmt: skip


def _dead_letter_row(value: DeadLetter, at: Coordinates, ingested_at: datetime) -> list[Any]:
    del at  # a dead letter's coordinates are its source coordinates
    return [
        value.received_at,
        value.source_topic,
        value.source_partition,
        value.source_offset,
        value.source_index,
        value.source_key,
        value.error_kind,
        value.error,
        base64.b64decode(value.raw_base64),
        value.raw_size_bytes,
        ingested_at,
    ]


DEAD_LETTERS = TableLayout(
    "dead_letters",
    (
        "received_at",
        "source_topic",
        "source_partition",
        "source_offset",
        "source_index",
        "source_key",
        "error_kind",
        "error",
        "raw",
        "raw_size_bytes",
        "ingested_at",
    ),
    ("source_topic", "source_partition", "source_offset"),
    to_row=_dead_letter_row,
)

COMMAND_HEADER = (
    "schema_version", "command_id", "command_type", "action", "issued_at", "expires_at",
    "issuer", "target_node_id", "target_device_uuid", "target_pool", "target_rack_id",
    "target_region", "reason", "message", "cause_event_id", "cause_observed_at", "decision_id",
    "key_id", "signature", "parameters",
)  # fmt: skip
_HEADER_FIELDS = set(Command.model_fields) | {"action", "command_type"}


def _command_lines(value: Command, at: Coordinates, ingested_at_json: bytes) -> list[bytes]:
    doc = value.model_dump(mode="json")
    target = doc.pop("target")
    row = {name: doc.get(name) for name in COMMAND_HEADER if name in _HEADER_FIELDS}
    row["command_type"] = type(value).__name__
    row.update({f"target_{k}": v for k, v in target.items() if k != "schema_version"})
    params = {k: v for k, v in doc.items() if k not in _HEADER_FIELDS}
    row["parameters"] = json.dumps(params, sort_keys=True)
    return [json.dumps(row).encode()[:-1] + _tail(at, ingested_at_json)]


COMMANDS = TableLayout(
    "commands", (*COMMAND_HEADER, *COORDINATES, "ingested_at"), COORDINATES, _command_lines
)

LAYOUTS: dict[type[Any], TableLayout] = {
    spec.value_type: _event_layout(spec.table, spec.value_type)
    for spec in (*TELEMETRY_TOPICS, *JUDGEMENT_TOPICS)
    if not spec.envelope
}
for _tick_type, _row_type in _ROWS_OF.items():  # an envelope's rows are its v1 type's rows
    LAYOUTS[_tick_type] = TableLayout(
        STAGING[_tick_type],
        _staging_columns(_tick_type),
        COORDINATES,
        _tick_lines,
        lands_in=LAYOUTS[_row_type].table,
        compact=True,
    )
LAYOUTS[DeadLetter] = DEAD_LETTERS
LAYOUTS[CommandResult] = _event_layout(COMMAND_RESULTS.table, CommandResult)
for _command_type in COMMAND_TYPES:
    LAYOUTS[_command_type] = COMMANDS
