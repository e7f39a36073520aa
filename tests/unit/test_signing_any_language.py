"""A command any language can verify: the published vectors hold, and a verifier written
in JavaScript from the documented rule (``tests/node/commands.mjs``, run by Node.js)
verifies every command our controllers issue, and signs one our executors apply."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agents.sim.control import SimControl
from agents.sim.scenario import load_scenario
from agents.sim.simulation import Simulation
from fleetloop.settings import WorkerSettings
from fleetloop.sim import build_dispatcher
from fleetloop.wiring import control_wiring, demand_wiring, health_wiring
from planning import isolation
from planning.demand import DemandPlanner, decide_warm
from planning.isolation import decide
from planning.pools import ControlPlanner
from schemas.codec import decode, encode
from schemas.commands import (
    COMMAND_TYPES,
    Command,
    ResultStatus,
    RouteAction,
    RouteCommand,
    Target,
)
from schemas.events import AcceleratorTelemetry, Demand, NodeHealth, ServingMetrics
from schemas.signing import canonical_bytes, verify
from schemas.topics import ROUTE_COMMANDS
from tests.factories import START
from tests.signing_vectors import PATH, vectors

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"
NODE_VERIFIER = ROOT / "tests" / "node" / "commands.mjs"
KEY_ID, KEY = "k-any", "cross-language-test-key-0123456789"
SETTINGS = WorkerSettings(command_keys=f"{KEY_ID}={KEY}")


def test_the_published_vectors_are_what_the_code_does() -> None:
    published = json.loads(PATH.read_text())
    assert published == json.loads(json.dumps(vectors(), ensure_ascii=False))
    for vector in published["vectors"]:
        payload = json.loads(vector["wire"])
        assert canonical_bytes(payload).decode() == vector["canonical"]
        signed_type = {c.__name__: c for c in COMMAND_TYPES}[payload["command_type"]]
        received = decode(vector["wire"].encode(), signed_type)
        keys = {vector["key_id"]: vector["key"].encode()}
        assert verify(received, keys=keys, payload=payload)
        assert canonical_bytes(received).decode() == vector["canonical"]


def test_the_type_is_signed() -> None:
    # a route command's signature does not carry over to another type
    vector = json.loads(PATH.read_text())["vectors"][0]
    payload = json.loads(vector["wire"])
    payload["command_type"] = "ThrottleCommand"
    with pytest.raises(ValueError):
        decode(json.dumps(payload).encode(), RouteCommand)


def _controller_commands() -> list[Command]:
    """Commands the production planners issue, built from worker settings."""
    commands: list[Command] = []
    # control: power caps, budgets, batch sizes on a rack whose feed degrades
    sim = Simulation(load_scenario(SCENARIOS / "pdu-overload.yaml"), start=START)
    planner = ControlPlanner(control_wiring(SETTINGS))
    for n in range(300):
        for _spec, event in sim.tick(n):
            commands += [o.command for o in planner.feed(event) if o.command is not None]
    # health: the isolation ladder on an ECC storm
    sim = Simulation(load_scenario(SCENARIOS / "ecc-storm.yaml"), start=START)
    wiring = health_wiring(SETTINGS)
    detector, ladder = isolation.detector(wiring), isolation.ladder(wiring)
    for n in range(480):  # the storm starts at 120 s; the double-bit fault lands at 420 s
        verdicts = []
        for _spec, event in sim.tick(n):
            if isinstance(event, AcceleratorTelemetry | NodeHealth | ServingMetrics):
                verdicts += detector.observe(event)
        steps = [
            s for v in verdicts + detector.tick(sim.now) for s in ladder.verdict(v, now=sim.now)
        ]
        for step in steps + ladder.tick(sim.now):
            out = decide(step, sim.now, wiring)
            commands += [out.command] if out.command is not None else []
    # demand: a model wanted and loaded nowhere is warmed
    demand = demand_wiring(SETTINGS)
    warming = DemandPlanner(demand)
    for s in range(61):
        at = START + timedelta(seconds=s)
        event = Demand(event_id=uuid.uuid4(), observed_at=at, model="gemma-27b",
                       region="us-east", interval_s=1.0, requests=30, prompt_tokens=0,
                       generated_tokens=0)  # fmt: skip
        for warm_step in warming.demand(event)[1]:
            warm = decide_warm(warm_step, demand).command
            commands += [warm] if warm is not None else []
    return commands


def _node(request: dict[str, Any]) -> dict[str, Any]:
    node = shutil.which("node")
    assert node, "Node.js is part of this machine kind; the cross-language check needs it"
    proc = subprocess.run(
        [node, str(NODE_VERIFIER)], input=json.dumps(request), capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_a_verifier_in_another_language_checks_our_commands_and_signs_its_own() -> None:
    commands = _controller_commands()
    kinds = {type(c).__name__ for c in commands}
    assert kinds == {"RouteCommand", "ThrottleCommand", "WarmCommand"}, kinds
    wires = [encode(c).decode() for c in commands]
    published = json.loads(PATH.read_text())["vectors"]
    tampered = []
    for wire in wires[:20]:  # one value changed after signing: refused
        payload = json.loads(wire)
        payload["reason"] = payload["reason"] + "x"
        tampered.append(json.dumps(payload))
    keys = {KEY_ID: KEY} | {v["key_id"]: v["key"] for v in published}
    unsigned = RouteCommand(
        command_id=uuid.uuid4(), issued_at=START, expires_at=START + timedelta(seconds=60),
        issuer="node-tool", target=Target(device_uuid="node-00000-gpu3"), reason="operator",
        message="drained by an operator's tool \u2014 written in JavaScript",
        action=RouteAction.DEWEIGHT, weight_ratio=0.25,
    )  # fmt: skip
    answer = _node({
        "keys": keys, "verify": wires + [v["wire"] for v in published] + tampered,
        "sign": {"key_id": KEY_ID, "wire": encode(unsigned).decode()},
    })  # fmt: skip
    verified = answer["verified"]
    assert verified[: len(wires) + len(published)] == [True] * (len(wires) + len(published))
    assert verified[len(wires) + len(published) :] == [False] * len(tampered)
    # what Node signed, our executors apply (as it arrived on the topic)
    sim = Simulation(load_scenario(SCENARIOS / "steady.yaml"), start=START)
    sim.tick(0)
    dispatcher = build_dispatcher(
        SimControl(sim.fleet), {KEY_ID: KEY.encode()}, CollectorRegistry()
    )
    result = dispatcher.handle_raw(
        ROUTE_COMMANDS, answer["signed"].encode(), now=START, received_at=START
    )
    assert result is not None and result.status is ResultStatus.APPLIED, result
