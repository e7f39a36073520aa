"""Hypothesis strategies for messages a hostile or broken producer could send.

``documents(model)`` draws JSON objects shaped by the model's own JSON schema
(so most are valid or nearly so and reach the deep validators), then mutates
some of them: a field replaced by a hostile value (instants from year 1 to
9999 at any offset, integers past 64 bits, floats at the edge of double,
deep nesting, long or odd strings), a field dropped, a field added.
``messages(model)`` adds raw bytes that are not JSON at all.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import strategies as st
from pydantic import BaseModel

from schemas.export import json_schema

Json = Any

_offsets = st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59).map(
    lambda m: timezone(timedelta(minutes=m))
)
instants = st.one_of(
    st.sampled_from(
        [
            "9999-12-31T23:59:59-01:00",
            "0001-01-01T00:00:00+01:00",
            "9999-12-31T23:59:59.999999Z",
            "1969-12-31T23:59:59Z",
            "2100-01-01T00:00:00Z",
            "2106-02-07T06:28:16Z",
            "2299-12-31T23:59:59Z",
            "2026-13-01T00:00:00Z",
            "2026-11-01T12:00:00",  # naive
            "2026-11-01",
            "",
        ]
    ),
    st.datetimes(
        min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=_offsets
    ).map(lambda d: d.isoformat()),
    st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2035, 1, 1)).map(
        lambda d: d.replace(tzinfo=UTC).isoformat()
    ),
)
numbers = st.one_of(
    st.sampled_from([0, -1, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**40, 10**400]),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e308, -1e308, 5e-324, 3.4e38, 3.5e38, -0.0, 1e-300]),
)
texts = st.one_of(
    st.text(max_size=20),
    st.sampled_from(
        ["", " ", "\x00", "é", "\u2028", "\U0001d518", "a" * 129, "a" * 5000, "null", "NaN"]
    ),
)
scalars: st.SearchStrategy[Json] = st.one_of(
    st.none(), st.booleans(), numbers, texts, texts, instants, st.uuids().map(str)
)
EDGE_VALUES: tuple[Json, ...] = (
    None, True, 0, -1, 2**63, 10**400, 1e308, -1e308, 5e-324, "", "é", "\x00", "a" * 5000,
    "9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00", "2299-12-31T23:59:59Z",
    [], [[[[]]]], {}, {"a": None},
)  # fmt: skip
"""A fixed sweep: every field of a valid document replaced by each of these in turn."""


def field_sweep(doc: dict[str, Json]) -> list[bytes]:
    """``doc`` with each field, in turn, replaced by each of :data:`EDGE_VALUES` or dropped."""
    out = []
    for key in doc:
        out.append(json.dumps({k: v for k, v in doc.items() if k != key}).encode())
        out += [json.dumps({**doc, key: value}).encode() for value in EDGE_VALUES]
    return out


hostile_values: st.SearchStrategy[Json] = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=6,
)


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def from_schema(schema: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[Json]:
    """Values that a pydantic JSON schema describes (the subset pydantic emits)."""
    schema = _resolve(schema, defs)
    if "properties" in schema:  # an object: its anyOf/allOf are cross-field rules, not shapes
        schema = {k: v for k, v in schema.items() if k not in ("anyOf", "allOf")}
    if "anyOf" in schema:
        return st.one_of([from_schema(s, defs) for s in schema["anyOf"]])
    if "allOf" in schema:
        return from_schema(schema["allOf"][0], defs)
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "const" in schema:
        return st.just(schema["const"])
    kind = schema.get("type")
    if kind == "object":
        props = {k: from_schema(v, defs) for k, v in schema.get("properties", {}).items()}
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries(
            {k: v for k, v in props.items() if k in required},
            optional={k: v for k, v in props.items() if k not in required},
        )
    if kind == "array":
        low = schema.get("minItems", 0)
        return st.lists(
            from_schema(schema.get("items", {}), defs),
            min_size=low,
            max_size=max(low, min(schema.get("maxItems", 4), 4)),
        )
    if kind == "string":
        if schema.get("format") == "date-time":
            return instants
        if schema.get("format") == "uuid":
            return st.uuids().map(str)
        low = schema.get("minLength", 0)
        return st.text(min_size=low, max_size=max(low, min(schema.get("maxLength", 12), 12)))
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "number":
        return st.floats(
            schema.get("minimum"), schema.get("maximum"), allow_nan=False, allow_infinity=False
        )
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return hostile_values


@st.composite
def _mutated(draw: st.DrawFn, base: st.SearchStrategy[dict[str, Json]]) -> dict[str, Json]:
    doc = dict(draw(base))
    keys = sorted(doc)
    picks = draw(st.integers(1, 3)) if keys else 0
    for key in sorted({keys[draw(st.integers(0, len(keys) - 1))] for _ in range(picks)}):
        how = draw(st.sampled_from(["replace", "drop", "nest"]))
        if how == "replace":
            doc[key] = draw(hostile_values)
        elif how == "drop":
            del doc[key]
        elif isinstance(doc[key], dict) and doc[key]:
            inner = dict(doc[key])
            inner[draw(st.sampled_from(sorted(inner)))] = draw(hostile_values)
            doc[key] = inner
    if draw(st.booleans()) and draw(st.booleans()):
        doc[draw(texts)] = draw(hostile_values)
    return doc


def documents(
    model: type[BaseModel],
    seeds: Sequence[BaseModel] = (),
) -> st.SearchStrategy[dict[str, Json]]:
    """JSON objects shaped like ``model`` (or like one of ``seeds``, valid instances such as
    signed commands, which a schema alone cannot make): a quarter as they are, the rest
    mutated."""
    _, schema = json_schema(model)  # a v1 contract's or a v2 envelope's
    base = from_schema(schema, schema.get("$defs", {}))
    mutated = [base, _mutated(base), _mutated(base), _mutated(base)]
    if seeds:
        valid = st.sampled_from([s.model_dump(mode="json") for s in seeds])
        mutated += [valid, _mutated(valid), _mutated(valid), _mutated(valid)]
    return st.one_of(mutated)


def messages(
    model: type[BaseModel],
    seeds: Sequence[BaseModel] = (),
) -> st.SearchStrategy[bytes]:
    """Kafka message values for ``model``'s topic: mostly documents, some raw garbage."""
    as_json = documents(model, seeds).map(lambda d: json.dumps(d).encode())
    return st.one_of(
        as_json,
        as_json,
        as_json,
        hostile_values.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=64),
        as_json.map(lambda b: b.replace(b"1", b"NaN", 1)),  # json.loads-only tokens
    )
