"""No message stops a component: property tests over the real decode paths.

Every ingested topic's messages go through the ingest step (``streams.ingest.split``)
and the sink's row conversion; every command topic's messages go through the
command dispatcher (``CommandDispatcher.handle_raw``: decode, ownership, gate, actuator).
Each of at least 11,000 generated inputs per type must be accepted or refused
with a reason; any other exception fails the test. The inputs come from one
grammar (``tests.hostile_json``): 1,000 drawn by Hypothesis (which seeks edges and
shrinks a failure to a small input), then 10,000 drawn by a seeded random source,
the same every run (Hypothesis' engine spent about 6 ms on each input, most of
these tests' time). What the ingest step accepts must also be storable: the first
3,000 accepted values of each type go through the real sink into the real
ClickHouse engine.
"""

from __future__ import annotations

import asyncio
import os
from datetime import datetime

import pytest
from hypothesis import HealthCheck, given, settings
from prometheus_client import CollectorRegistry

from agents.sim.control import SimControl
from agents.sim.scenario import Scenario
from agents.sim.simulation import Simulation
from fleetloop.sim import build_dispatcher
from schemas.base import Contract
from schemas.codec import DecodeErrorKind
from schemas.commands import (
    Command,
    CommandResult,
    ResultStatus,
    RouteAction,
    RouteCommand,
    Target,
    ThrottleAction,
    ThrottleCommand,
    WarmAction,
    WarmCommand,
)
from schemas.topics import COMMAND_TOPICS, INGESTED_TOPICS, TopicSpec
from streams.clickhouse_store import ClickHouseStore
from streams.ingest import RawMessage, split
from streams.rows import LAYOUTS, Coordinates, instant_json
from streams.sink import ClickHouseSink
from tests.factories import COMMAND_KEYS, START, ingest_now, signed_command
from tests.hostile_json import field_sweep, messages, sweep

EXAMPLES = int(os.environ.get("FLEETLOOP_FUZZ_EXAMPLES", "1000"))  # Hypothesis' draws
SWEPT = int(os.environ.get("FLEETLOOP_FUZZ_SWEPT", "10000"))  # the seeded random source's
STORED_SAMPLE = 3000  # accepted values per type written to ClickHouse
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # no example database in the checkout; derandomised: same inputs each run
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
DEAD_LETTER_KINDS = {k.value for k in DecodeErrorKind}


@pytest.mark.parametrize("spec", INGESTED_TOPICS, ids=lambda s: s.name)
def test_every_ingested_message_is_accepted_or_dead_lettered(
    spec: TopicSpec, store: ClickHouseStore
) -> None:
    seen = {"valid": 0, "dead": 0}
    accepted: list[tuple[Contract, Coordinates]] = []
    topic = f"fuzz.{spec.name}"
    # a command's cross-field rules (lifetime bounds, target shape) are rarely met by chance:
    # start some documents from valid ones, so both outcomes are reached on any hash seed
    seeds = [c for c in _signed_commands(START) if isinstance(c, spec.value_type)]

    @FUZZ
    @given(raw=messages(spec.value_type, seeds))
    def one(raw: bytes) -> None:
        at = Coordinates(topic, 0, seen["valid"] + seen["dead"])
        out = split([RawMessage(at, b"k", raw)], spec.value_type, now=START)
        # one message, or an envelope whose bad samples are dead letters of their own
        assert len(out.valid) <= 1 and (out.valid or out.dead)
        assert len(out.valid) + len(out.dead) == 1 or spec.envelope
        for letter, _ in out.dead:
            assert letter.error_kind in DEAD_LETTER_KINDS and letter.error
        if not out.valid:
            seen["dead"] += 1
            return
        value = out.valid[0][0]
        layout = LAYOUTS[type(value)]
        if layout.to_lines is not None:  # the sink's conversion must not fail either
            layout.to_lines(value, at, instant_json(START))
        seen["valid"] += 1
        if len(accepted) < STORED_SAMPLE:
            accepted.append((value, at))

    one()
    for raw in sweep(spec.value_type, seeds, SWEPT, seed=spec.name):
        one.hypothesis.inner_test(raw)  # type: ignore[attr-defined]
    assert seen["valid"] + seen["dead"] >= EXAMPLES + SWEPT
    assert seen["valid"] > 0 and seen["dead"] > 0  # the generator reaches both outcomes
    sink = ClickHouseSink(store, registry=CollectorRegistry())
    written = asyncio.run(sink.write(accepted, now=ingest_now()))
    assert written == sum(LAYOUTS[type(value)].rows(value) for value, _ in accepted)


@pytest.mark.parametrize("spec", COMMAND_TOPICS, ids=lambda s: s.name)
def test_every_command_message_gets_a_result_or_an_owner_elsewhere(spec: TopicSpec) -> None:
    sim = Simulation(Scenario(), start=START)
    sim.tick(0)
    dispatcher = build_dispatcher(SimControl(sim.fleet), COMMAND_KEYS, CollectorRegistry())
    now = sim.fleet.now
    statuses: dict[str, int] = {}
    seeds = [c for c in _signed_commands(now) if isinstance(c, spec.value_type)]

    @FUZZ
    @given(raw=messages(spec.value_type, seeds))
    def one(raw: bytes) -> None:
        result = dispatcher.handle_raw(spec, raw, now=now, received_at=now)
        status = "no owner here" if result is None else result.status.value
        statuses[status] = statuses.get(status, 0) + 1
        if result is not None:
            assert isinstance(result, CommandResult) and result.detail

    one()
    for raw in sweep(spec.value_type, seeds, SWEPT, seed=spec.name):
        one.hypothesis.inner_test(raw)  # type: ignore[attr-defined]
    for seed in seeds:  # and systematically: each field of a signed command made hostile
        for raw in field_sweep(seed.model_dump(mode="json")):
            one.hypothesis.inner_test(raw)  # type: ignore[attr-defined]
    assert sum(statuses.values()) >= EXAMPLES + SWEPT
    # refused as malformed, and refused by the gate (unsigned): both paths were reached
    assert statuses.get(ResultStatus.MALFORMED.value, 0) > 0
    assert statuses.get(ResultStatus.BAD_SIGNATURE.value, 0) > 0
    assert statuses.get(ResultStatus.APPLIED.value, 0) > 0


def _signed_commands(now: datetime) -> list[Command]:
    """Valid commands of every type, signed with the executors' key: seeds the mutations start
    from, so signed-but-altered commands reach the gate's signature check."""
    device, pool = Target(device_uuid="node-00000-gpu0"), Target(pool="us-east-h100")
    return [
        signed_command(RouteCommand, issued_at=now, target=device, action=RouteAction.DRAIN),
        signed_command(
            RouteCommand,
            issued_at=now,
            target=pool,
            action=RouteAction.DEWEIGHT,
            weight_ratio=0.5,
            model="gemma-27b",
        ),
        signed_command(
            ThrottleCommand,
            issued_at=now,
            target=device,
            action=ThrottleAction.POWER_CAP,
            power_limit_watts=500.0,
        ),
        signed_command(
            ThrottleCommand,
            issued_at=now,
            target=pool,
            action=ThrottleAction.OPTIONAL_BUDGET,
            optional_budget_ratio=0.2,
        ),
        signed_command(
            WarmCommand, issued_at=now, target=pool, action=WarmAction.WARM, model="gemma-27b"
        ),
    ]
