"""Small builders of valid contracts and malformed payloads for tests."""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from agents.envelopes import pack
from agents.sim.simulation import Simulation
from agents.simulated import SimulatedFleetAgent
from models.health import HealthDetector
from schemas.base import Contract
from schemas.codec import encode
from schemas.commands import Command
from schemas.events import AcceleratorTelemetry, NodeHealth, ServingMetrics
from schemas.signing import sign
from schemas.topics import TELEMETRY_TOPICS, TopicSpec
from schemas.verdicts import Verdict

START = datetime.fromisoformat(os.environ.get("FLEETLOOP_TEST_START", "2026-11-01T12:00:00+00:00"))
"""The instant test events start at: fixed, so tests are reproducible. ``FLEETLOOP_TEST_START``
moves it (``test_any_date`` runs the sink tests with it months in the past)."""


def ingest_now() -> datetime:
    """Ingestion time for rows written to the real ClickHouse engine.

    Retention (``TTL ... ingested_at + INTERVAL n DAY``) is judged on the engine's own
    clock, which no test can set; rows ingested "now" stay whatever their event times.
    Event times come from :data:`START`.
    """
    return datetime.now(UTC)


def fleet_events(
    count: int, *, nodes: int = 20, seed: int = 11
) -> list[tuple[TopicSpec, Contract]]:
    """Exactly ``count`` events from the simulated fleet, all five families included."""
    return SimulatedFleetAgent(nodes=nodes, devices_per_node=8, seed=seed, start=START).first(count)


def fleet_messages(count: int, **kw: Any) -> list[tuple[TopicSpec, Any]]:
    """What agents put on the wire for ``fleet_events(count)``: each node's accelerator
    samples and serving metrics of a tick packed into one envelope (v2)."""
    return pack(fleet_events(count, **kw))


def malformed_payloads(count: int) -> list[tuple[TopicSpec, bytes, str]]:
    """``count`` bad messages spread over the telemetry topics, with the expected error kind."""
    valid = {spec.name: json.loads(encode(v)) for spec, v in pack(fleet_events(400))}
    valid |= {spec.name: json.loads(encode(v)) for spec, v in fleet_events(400)}
    kinds: list[tuple[str, object]] = [
        ("bad_json", b"{not json"),
        ("bad_json", b"\xff\xfe\x00garbage"),
        ("not_an_object", b"[1, 2, 3]"),
        ("unknown_version", "version"),
        ("non_finite", "nan"),
        ("non_finite", "inf"),
        ("schema", "missing"),
        ("schema", "negative"),
    ]
    out: list[tuple[TopicSpec, bytes, str]] = []
    for i in range(count):
        spec = TELEMETRY_TOPICS[i % len(TELEMETRY_TOPICS)]
        kind, how = kinds[i % len(kinds)]
        doc = dict(valid[spec.name])
        doc["event_id"] = str(uuid.UUID(int=i + 1))
        if isinstance(how, bytes):
            raw = how
        elif how == "version":
            doc["schema_version"] += 1
            raw = json.dumps(doc).encode()
        elif how in ("nan", "inf"):
            inner = doc
            if spec.envelope:  # a copy: the valid document's samples stay as they were
                doc["samples"] = [dict(sample) for sample in doc["samples"]]
                inner = doc["samples"][0]
            field = next(k for k, v in inner.items() if isinstance(v, float))
            inner[field] = float("nan") if how == "nan" else float("inf")
            raw = json.dumps(doc).encode()  # json.dumps writes NaN / Infinity tokens
        elif how == "missing":
            doc.pop("observed_at")
            raw = json.dumps(doc).encode()
        elif spec.envelope:  # a bad sample is its own dead letter; an envelope of none is bad
            doc["samples"] = []
            raw = json.dumps(doc).encode()
        else:
            field = next(
                k
                for k, v in doc.items()
                if isinstance(v, int | float) and not isinstance(v, bool) and k != "schema_version"
            )
            doc[field] = -5
            raw = json.dumps(doc).encode()
        out.append((spec, raw, kind))
    return out


def later(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


COMMAND_KEYS = {"k1": b"unit-test-secret-0001"}
COMMAND_KEYS_SETTING = ",".join(f"{k}={v.decode()}" for k, v in COMMAND_KEYS.items())
"""The same keys as ``FLEETLOOP_COMMAND_KEYS`` spells them (``id=secret,...``)."""
C = TypeVar("C", bound=Command)


def signed_command(
    cls: type[C],
    *,
    issued_at: datetime,
    ttl_s: float = 60.0,
    key_id: str = "k1",
    key: bytes | None = None,
    command_id: uuid.UUID | None = None,
    **fields: Any,
) -> C:
    """A command of type ``cls`` signed with the test key (or ``key``: a forgery)."""
    unsigned = cls(
        command_id=command_id or uuid.uuid4(),
        issued_at=issued_at,
        expires_at=issued_at + timedelta(seconds=ttl_s),
        issuer="test",
        reason=fields.pop("reason", "test"),
        **fields,
    )
    return sign(unsigned, key_id=key_id, key=key or COMMAND_KEYS[key_id])


def feed_detector(det: HealthDetector, sim: Simulation, ticks: int) -> list[Verdict]:
    """``ticks`` steps of ``sim`` through ``det`` as ``eval faults --in-process`` feeds it
    (the families it judges, then its heartbeat tick); every verdict it gave."""
    out: list[Verdict] = []
    for n in range(ticks):
        for _spec, ev in sim.tick(n):
            if isinstance(ev, AcceleratorTelemetry | NodeHealth | ServingMetrics):
                out += det.observe(ev)
        out += det.tick(sim.now)
    return out
