"""Every number a contract carries has a physical bound, so a broken sensor or a forged
message (power 1e308 W, an interval of a millennium) is a dead letter, never a reading."""

from __future__ import annotations

import json
from typing import Any

import pytest

from schemas.base import Contract
from schemas.codec import DecodeError, DecodeErrorKind, decode, encode
from schemas.commands import CommandResult, DeadLetter, ResultStatus
from schemas.events import PduReading, ServingMetrics
from schemas.export import json_schema
from schemas.topics import ALL_TOPICS
from tests.factories import START, fleet_events


def _unbounded(schema: dict[str, Any], defs: dict[str, Any], path: str) -> list[str]:
    if "$ref" in schema:
        return _unbounded(defs[schema["$ref"].split("/")[-1]], defs, path)
    found = [p for sub in schema.get("anyOf", []) for p in _unbounded(sub, defs, path)]
    numeric = schema.get("type") in ("number", "integer") and "const" not in schema
    if numeric and "maximum" not in schema and "exclusiveMaximum" not in schema:
        found.append(path)
    for name, sub in schema.get("properties", {}).items():
        found += _unbounded(sub, defs, f"{path}.{name}")
    if "items" in schema:
        found += _unbounded(schema["items"], defs, f"{path}[]")
    return found


EXTRA: set[type[Contract]] = {CommandResult, DeadLetter}
KINDS: list[type[Contract]] = sorted(
    {s.value_type for s in ALL_TOPICS} | EXTRA, key=lambda t: t.__name__
)


@pytest.mark.parametrize("kind", KINDS, ids=[k.__name__ for k in KINDS])
def test_every_number_has_an_upper_bound(kind: type[Contract]) -> None:
    _, schema = json_schema(kind)
    assert _unbounded(schema, schema.get("$defs", {}), kind.__name__) == []


def test_the_check_finds_an_unbounded_number() -> None:
    schema = {"properties": {"watts": {"anyOf": [{"type": "number"}, {"type": "null"}]}}}
    assert _unbounded(schema, {}, "X") == ["X.watts"]


def _sample(kind: type[Contract]) -> dict[str, Any]:
    event = next(e for _, e in fleet_events(400, seed=1) if isinstance(e, kind))
    return dict(json.loads(encode(event)))


@pytest.mark.parametrize(
    ("kind", "field", "bound"),
    [(PduReading, "power_watts", 1e6), (ServingMetrics, "interval_s", 86_400.0),
     (ServingMetrics, "tokens_per_s", 1e9), (ServingMetrics, "tpot_p95_s", 86_400.0)],
)  # fmt: skip
def test_past_its_bound_a_value_is_a_schema_error(
    kind: type[Contract], field: str, bound: float
) -> None:
    doc = _sample(kind)
    assert decode(json.dumps({**doc, field: bound}).encode(), kind)  # at the bound: taken
    with pytest.raises(DecodeError) as refused:
        decode(json.dumps({**doc, field: 1e308}).encode(), kind)
    assert refused.value.kind is DecodeErrorKind.SCHEMA and field in str(refused.value)


def test_a_retry_wait_past_an_hour_is_refused() -> None:
    result = {
        "result_id": "00000000-0000-0000-0000-000000000001",
        "command_id": "00000000-0000-0000-0000-000000000002",
        "command_type": "ThrottleCommand", "executor": "node-executor",
        "status": ResultStatus.FAILED_TRANSIENT.value, "received_at": START.isoformat(),
        "completed_at": START.isoformat(), "retry_after_s": 1e308,
    }  # fmt: skip
    with pytest.raises(DecodeError):
        decode(json.dumps(result).encode(), CommandResult)
    assert decode(json.dumps({**result, "retry_after_s": 2.5}).encode(), CommandResult)
