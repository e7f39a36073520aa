"""Contracts -> ClickHouse rows.

A table's columns are its model's fields in declaration order (enums as their
values, nested probes as parallel arrays), then the Kafka coordinates the row
came from and the ingestion time. Columns are derived from the models, so the
DDL in ``infra/clickhouse/schema`` is the only other place that names them;
a test checks the two agree.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from schemas.base import Contract
from schemas.commands import DeadLetter
from schemas.events import NodeHealth, ProbeResult
from schemas.topics import TELEMETRY_TOPICS

COORDINATES = ("src_topic", "src_partition", "src_offset")
PROBE_FIELDS = tuple(f for f in ProbeResult.model_fields if f != "schema_version")


@dataclass(frozen=True, slots=True)
class Coordinates:
    """Where a message came from."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class TableLayout:
    """How one value type becomes rows of one table."""

    table: str
    columns: tuple[str, ...]
    coordinate_columns: tuple[str, str, str]
    to_row: Callable[[Any, Coordinates, datetime], list[Any]]


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def _event_layout(table: str, value_type: type[Contract]) -> TableLayout:
    fields = [f for f in value_type.model_fields if f != "schema_version"]
    nested = "probes" if value_type is NodeHealth else None
    columns: list[str] = []
    for f in fields:
        if f == nested:
            columns.extend(f"probes.{p}" for p in PROBE_FIELDS)
        else:
            columns.append(f)

    def to_row(value: Any, at: Coordinates, ingested_at: datetime) -> list[Any]:
        row: list[Any] = []
        for f in fields:
            v = getattr(value, f)
            if f == nested:
                row.extend([_plain(getattr(p, pf)) for p in v] for pf in PROBE_FIELDS)
            else:
                row.append(_plain(v))
        row.extend((at.topic, at.partition, at.offset, ingested_at))
        return row

    return TableLayout(table, (*columns, *COORDINATES, "ingested_at"), COORDINATES, to_row)


def _dead_letter_row(value: DeadLetter, at: Coordinates, ingested_at: datetime) -> list[Any]:
    del at  # a dead letter's coordinates are its source coordinates
    return [
        value.received_at,
        value.source_topic,
        value.source_partition,
        value.source_offset,
        value.source_key,
        value.error_kind,
        value.error,
        base64.b64decode(value.raw_base64),
        ingested_at,
    ]


DEAD_LETTERS = TableLayout(
    "dead_letters",
    (
        "received_at",
        "source_topic",
        "source_partition",
        "source_offset",
        "source_key",
        "error_kind",
        "error",
        "raw",
        "ingested_at",
    ),
    ("source_topic", "source_partition", "source_offset"),
    _dead_letter_row,
)

LAYOUTS: dict[type[Contract], TableLayout] = {
    spec.value_type: _event_layout(spec.table, spec.value_type) for spec in TELEMETRY_TOPICS
}
LAYOUTS[DeadLetter] = DEAD_LETTERS
