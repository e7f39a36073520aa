"""Messages a hostile or broken producer could send, from one grammar with two drivers.

``documents`` make JSON objects shaped by the model's own JSON schema (so most
are valid or nearly so and reach the deep validators), then mutate some of
them: a field replaced by a hostile value (instants from year 1 to 9999 at any
offset, integers past 64 bits, floats at the edge of double, deep nesting, long
or odd strings), a field dropped, a field added. ``messages`` add raw bytes
that are not JSON at all.

The grammar asks a :class:`Source` for each choice. :func:`messages` drives it
with Hypothesis (its edge-seeking draws, and a failure shrunk to a small
input); :func:`sweep` drives the same grammar with a seeded ``random.Random``,
about a hundred times cheaper per input than Hypothesis' engine, for the bulk of
the inputs a property test runs.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, Protocol, TypeVar

from hypothesis import strategies as st
from pydantic import BaseModel

from schemas.export import json_schema

Json = Any
T = TypeVar("T")

FIXED_INSTANTS = (
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
)
EDGE_INTEGERS = (0, -1, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**40, 10**400)
EDGE_FLOATS = (1e308, -1e308, 5e-324, 3.4e38, 3.5e38, -0.0, 1e-300)
ODD_TEXTS = ("", " ", "\x00", "é", "\u2028", "\U0001d518", "a" * 129, "a" * 5000, "null", "NaN")
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


OFFSET_MINUTES = 23 * 60 + 59  # the widest UTC offset an ISO 8601 instant can carry
ANY_SPAN = (datetime(1, 1, 2), datetime(9999, 12, 30))  # any instant Python can write
UTC_SPAN = (datetime(2020, 1, 1), datetime(2035, 1, 1))  # plausible instants, in UTC
_UTC_MOMENTS = st.datetimes(*UTC_SPAN)
_ANY_MOMENTS = st.datetimes(
    *ANY_SPAN,
    timezones=st.integers(-OFFSET_MINUTES, OFFSET_MINUTES).map(
        lambda m: timezone(timedelta(minutes=m))
    ),
)


class Source(Protocol):
    """Where the grammar's choices come from."""

    def pick(self, options: Sequence[T]) -> T: ...
    def integer(self, low: int | None = None, high: int | None = None) -> int: ...
    def floating(self, low: float | None = None, high: float | None = None) -> float: ...
    def text(self, low: int = 0, high: int = 20) -> str: ...
    def instant(self, *, utc_only: bool = False) -> str: ...
    def uuid(self) -> str: ...
    def binary(self, high: int) -> bytes: ...


class HypothesisSource:
    """Each choice a Hypothesis draw, from Hypothesis' own strategies."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw

    def pick(self, options: Sequence[T]) -> T:
        return self.draw(st.sampled_from(options))

    def integer(self, low: int | None = None, high: int | None = None) -> int:
        return self.draw(st.integers(low, high))

    def floating(self, low: float | None = None, high: float | None = None) -> float:
        return self.draw(st.floats(low, high, allow_nan=False, allow_infinity=False))

    def text(self, low: int = 0, high: int = 20) -> str:
        return self.draw(st.text(min_size=low, max_size=high))

    def instant(self, *, utc_only: bool = False) -> str:
        if utc_only:
            return self.draw(_UTC_MOMENTS).replace(tzinfo=UTC).isoformat()
        return self.draw(_ANY_MOMENTS).isoformat()

    def uuid(self) -> str:
        return str(self.draw(st.uuids()))

    def binary(self, high: int) -> bytes:
        return self.draw(st.binary(max_size=high))


_ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 -_.:/\\\"'{}[],"
    "\x00\x01\x1f\x7féü€\u2028\u2029\ufeff\U0001d518\U0001f600"
)


class RandomSource:
    """Each choice from a seeded ``random.Random``, a fifth of them at the range's edges
    (as Hypothesis favours them): cheap enough for tens of thousands of inputs."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def _edge(self) -> bool:
        return self.rng.random() < 0.2

    def pick(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def integer(self, low: int | None = None, high: int | None = None) -> int:
        rng = self.rng
        if low is None and high is None:
            if self._edge():
                return self.pick(EDGE_INTEGERS)
            return rng.randint(-(2 ** rng.randint(1, 70)), 2 ** rng.randint(1, 70))
        lo = low if low is not None else high - 2 ** rng.randint(1, 70)
        hi = high if high is not None else lo + 2 ** rng.randint(1, 70)
        if self._edge():
            return self.pick((lo, hi, min(lo + 1, hi), max(hi - 1, lo)))
        return rng.randint(lo, hi)

    def floating(self, low: float | None = None, high: float | None = None) -> float:
        rng = self.rng
        if low is None and high is None:
            if self._edge():
                return self.pick(EDGE_FLOATS)
            return rng.uniform(-1, 1) * 10.0 ** rng.randint(-300, 300)
        lo = low if low is not None else high - 10.0 ** rng.randint(0, 300)  # type: ignore[operator]
        hi = high if high is not None else lo + 10.0 ** rng.randint(0, 300)
        if self._edge():
            return self.pick((lo, hi, (lo + hi) / 2, -0.0 if lo <= 0 <= hi else lo))
        return rng.uniform(lo, hi)

    def text(self, low: int = 0, high: int = 20) -> str:
        size = low if self._edge() else self.rng.randint(low, high)
        return "".join(self.rng.choices(_ALPHABET, k=size))

    def instant(self, *, utc_only: bool = False) -> str:
        rng = self.rng
        low, high = UTC_SPAN if utc_only else ANY_SPAN
        moment = low + (high - low) * rng.random()
        if utc_only:
            return moment.replace(tzinfo=UTC).isoformat()
        offset = timezone(timedelta(minutes=rng.randint(-OFFSET_MINUTES, OFFSET_MINUTES)))
        return moment.replace(tzinfo=offset).isoformat()

    def uuid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128)))

    def binary(self, high: int) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, high))


Grammar = Callable[[Source], Json]


def instant(src: Source) -> str:
    which = src.pick(("fixed", "any", "utc"))
    if which == "fixed":
        return src.pick(FIXED_INSTANTS)
    return src.instant(utc_only=which == "utc")


def number(src: Source) -> Json:
    which = src.pick(("edge", "integer", "float", "float edge"))
    if which == "edge":
        return src.pick(EDGE_INTEGERS)
    if which == "integer":
        return src.integer()
    return src.floating() if which == "float" else src.pick(EDGE_FLOATS)


def text(src: Source) -> str:
    return src.text() if src.pick((True, False)) else src.pick(ODD_TEXTS)


def scalar(src: Source) -> Json:
    which = src.pick(("none", "bool", "number", "text", "text", "instant", "uuid"))
    if which == "none":
        return None
    if which == "bool":
        return src.pick((True, False))
    if which == "number":
        return number(src)
    return text(src) if which == "text" else instant(src) if which == "instant" else src.uuid()


def hostile(src: Source, leaves: int = 6) -> Json:
    """A scalar, or lists and objects of hostile values, at most ``leaves`` scalars."""
    if leaves <= 1 or src.pick(("scalar", "scalar", "nested")) == "scalar":
        return scalar(src)
    share = max(1, leaves // 2)
    if src.pick(("list", "object")) == "list":
        return [hostile(src, share) for _ in range(src.integer(0, 4))]
    return {text(src): hostile(src, share) for _ in range(src.integer(0, 4))}


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def from_schema(schema: dict[str, Any], defs: dict[str, Any]) -> Grammar:
    """Values that a pydantic JSON schema describes (the subset pydantic emits)."""
    schema = _resolve(schema, defs)
    if "properties" in schema:  # an object: its anyOf/allOf are cross-field rules, not shapes
        schema = {k: v for k, v in schema.items() if k not in ("anyOf", "allOf")}
    if "anyOf" in schema:
        choices = [from_schema(s, defs) for s in schema["anyOf"]]
        return lambda src: src.pick(choices)(src)
    if "allOf" in schema:
        return from_schema(schema["allOf"][0], defs)
    if "enum" in schema:
        values = list(schema["enum"])
        return lambda src: src.pick(values)
    if "const" in schema:
        const = schema["const"]
        return lambda src: const
    kind = schema.get("type")
    if kind == "object":
        props = {k: from_schema(v, defs) for k, v in schema.get("properties", {}).items()}
        required = set(schema.get("required", ()))
        return lambda src: {
            k: gen(src) for k, gen in props.items() if k in required or src.pick((True, False))
        }
    if kind == "array":
        item = from_schema(schema.get("items", {}), defs)
        low = schema.get("minItems", 0)
        high = max(low, min(schema.get("maxItems", 4), 4))
        return lambda src: [item(src) for _ in range(src.integer(low, high))]
    if kind == "string":
        if schema.get("format") == "date-time":
            return instant
        if schema.get("format") == "uuid":
            return lambda src: src.uuid()
        low = schema.get("minLength", 0)
        high = max(low, min(schema.get("maxLength", 12), 12))
        return lambda src: src.text(low, high)
    if kind == "integer":
        lo, hi = schema.get("minimum"), schema.get("maximum")
        return lambda src: src.integer(lo, hi)
    if kind == "number":
        flo, fhi = schema.get("minimum"), schema.get("maximum")
        return lambda src: src.floating(flo, fhi)
    if kind == "boolean":
        return lambda src: src.pick((True, False))
    if kind == "null":
        return lambda src: None
    return hostile


def mutated(src: Source, base: Grammar) -> dict[str, Json]:
    doc = dict(base(src))
    keys = sorted(doc)
    picks = src.integer(1, 3) if keys else 0
    for key in sorted({keys[src.integer(0, len(keys) - 1)] for _ in range(picks)}):
        how = src.pick(("replace", "drop", "nest"))
        if how == "replace":
            doc[key] = hostile(src)
        elif how == "drop":
            del doc[key]
        elif isinstance(doc[key], dict) and doc[key]:
            inner = dict(doc[key])
            inner[src.pick(sorted(inner))] = hostile(src)
            doc[key] = inner
    if src.pick((True, False)) and src.pick((True, False)):
        doc[text(src)] = hostile(src)
    return doc


def documents(model: type[BaseModel], seeds: Sequence[BaseModel] = ()) -> Grammar:
    """JSON objects shaped like ``model`` (or like one of ``seeds``, valid instances such as
    signed commands, which a schema alone cannot make): a quarter as they are, the rest
    mutated."""
    _, schema = json_schema(model)  # a v1 contract's or a v2 envelope's
    base = from_schema(schema, schema.get("$defs", {}))
    bases = [base]
    if seeds:
        valid = [s.model_dump(mode="json") for s in seeds]
        bases.append(lambda src: src.pick(valid))

    def document(src: Source) -> dict[str, Json]:
        start = src.pick(bases)
        return dict(start(src)) if src.integer(0, 3) == 0 else mutated(src, start)

    return document


def message_grammar(model: type[BaseModel], seeds: Sequence[BaseModel] = ()) -> Grammar:
    """Kafka message values for ``model``'s topic: mostly documents, some raw garbage."""
    document = documents(model, seeds)

    def message(src: Source) -> bytes:
        which = src.pick(("json", "json", "json", "hostile", "binary", "nan"))
        if which == "hostile":
            return json.dumps(hostile(src)).encode()
        if which == "binary":
            return src.binary(64)
        raw = json.dumps(document(src)).encode()
        return raw.replace(b"1", b"NaN", 1) if which == "nan" else raw  # json.loads-only

    return message


def messages(model: type[BaseModel], seeds: Sequence[BaseModel] = ()) -> st.SearchStrategy[bytes]:
    """:func:`message_grammar` as a Hypothesis strategy."""
    message = message_grammar(model, seeds)

    @st.composite
    def drawn(draw: st.DrawFn) -> bytes:
        return bytes(message(HypothesisSource(draw)))

    return drawn()


def sweep(
    model: type[BaseModel], seeds: Sequence[BaseModel], count: int, *, seed: str
) -> list[bytes]:
    """``count`` messages from :func:`message_grammar`, drawn by a ``random.Random`` seeded
    with ``seed``: the same inputs every run."""
    message = message_grammar(model, seeds)
    src = RandomSource(random.Random(seed))
    return [message(src) for _ in range(count)]
