"""A ClickHouse database seeded from a simulated scenario run, with known answers.

The fleet (8 nodes, 64 devices) runs 180 one-second steps with: an ECC storm on
node-00000-gpu1 that ends in a double-bit fault at t=50 s; node-00003 crashing
at t=60 s; rack-0001's feed degrading at t=30 s until its breaker trips; demand
for gemma-27b in us-east, loaded nowhere, from t=5 s. Its executors get a warm
command for gemma-27b at t=20 s, a quarantine for the faulty device at t=60 s
(sent twice), and a forged drain. Three malformed messages become dead letters.
The health detector and the isolation ladder, the demand planner and the control
planner (advisory: no signing key), see every event as the worker's processors
do, so verdicts, forecasts and decisions are real.
Everything goes through the real ingest split and ClickHouse sink.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from agents.sim.control import SimControl
from agents.sim.scenario import DemandSpec, FaultKind, FaultSpec, FleetSpec, Scenario, TargetSpec
from agents.sim.simulation import Simulation
from controllers.guardrail import Guardrail, GuardrailConfig
from controllers.isolation import IsolationLadder, LadderConfig
from fleetloop.sim import build_dispatcher
from models.health import HealthDetector
from planning.demand import DemandPlanner, DemandWiring, decide_warm
from planning.isolation import HealthWiring, decide
from planning.pools import ControlPlanner
from planning.throttle import ControlWiring
from schemas.base import Contract
from schemas.codec import encode
from schemas.commands import (
    Command,
    RouteAction,
    RouteCommand,
    Target,
    ThrottleAction,
    ThrottleCommand,
    WarmAction,
    WarmCommand,
)
from schemas.events import AcceleratorTelemetry, Demand, NodeHealth, PduReading, ServingMetrics
from schemas.topics import (
    ACCELERATOR,
    COMMAND_RESULTS,
    DECISIONS,
    FORECASTS,
    ROUTE_COMMANDS,
    SERVING,
    THROTTLE_COMMANDS,
    VERDICTS,
    WARM_COMMANDS,
    TopicSpec,
)
from schemas.verdicts import Decision, Verdict
from streams.clickhouse_store import ClickHouseStore
from streams.ingest import RawMessage, split
from streams.rows import Coordinates
from streams.sink import ClickHouseSink
from tests.factories import COMMAND_KEYS, START, signed_command

FAULTY = "node-00000-gpu1"
CRASHED = "node-00003"
TRIPPED_RACK = "rack-0001"
COLD_MODEL = "gemma-27b"
STEPS = 180


@dataclass
class Seeded:
    quarantine: RouteCommand | None = None
    warm: WarmCommand | None = None
    forged: RouteCommand | None = None
    rows: int = 0
    consequences: list[dict[str, object]] = field(default_factory=list)


def seed(store: ClickHouseStore) -> Seeded:
    scenario = Scenario(
        fleet=FleetSpec(nodes=8, seed=3),
        demand=DemandSpec(load_ratio=0.7),
        faults=(
            FaultSpec(
                kind=FaultKind.ECC_STORM,
                target=TargetSpec(node=0, device=1),
                start_s=10,
                duration_s=600,
                params={"lead_s": 40, "growth_per_s": 0.08},
            ),
            FaultSpec(
                kind=FaultKind.NODE_CRASH, target=TargetSpec(node=3), start_s=60, duration_s=600
            ),
            FaultSpec(
                kind=FaultKind.PDU_OVERLOAD, target=TargetSpec(rack=1), start_s=30, duration_s=600
            ),
            FaultSpec(
                kind=FaultKind.COLD_MODEL,
                target=TargetSpec(model=COLD_MODEL, region="us-east"),
                start_s=5,
                duration_s=600,
                params={"rps": 5},
            ),
        ),
    )
    sim = Simulation(scenario, start=START)
    dispatcher = build_dispatcher(SimControl(sim.fleet), COMMAND_KEYS, CollectorRegistry())
    offsets: dict[str, int] = {}
    records: list[tuple[Contract, Coordinates]] = []
    out = Seeded()

    def add(spec: TopicSpec, value: Contract) -> None:
        offsets[spec.name] = offsets.get(spec.name, -1) + 1
        records.append((value, Coordinates(spec.name, 0, offsets[spec.name])))

    def command(spec: TopicSpec, command: Command) -> None:
        add(spec, command)
        result = dispatcher.handle(command, now=sim.now, received_at=sim.now)
        assert result is not None
        add(COMMAND_RESULTS, result)

    detector = HealthDetector()
    # one tripped rack is half of this 8-node fleet: lock out only past three quarters
    guard = Guardrail(GuardrailConfig(lockout_ratio=0.75), devices={})
    ladder = IsolationLadder(LadderConfig(), guard)
    advisory = HealthWiring()
    planner = DemandPlanner(DemandWiring(replica_rps=2.0))
    control = ControlPlanner(ControlWiring(period_s=10.0, tpot_slo_s=0.08))

    quarantine_decision: list[Decision] = []

    def judge(verdicts: list[Verdict]) -> None:
        for v in verdicts:
            add(VERDICTS, v)
            for step in ladder.verdict(v, now=sim.now):
                decision = decide(step, sim.now, advisory).decision
                add(DECISIONS, decision)
                if decision.target == FAULTY and decision.action == "quarantine":
                    quarantine_decision.append(decision)

    dbe_sample: AcceleratorTelemetry | None = None
    for n in range(STEPS):
        if n == 20:
            out.warm = signed_command(
                WarmCommand,
                issued_at=sim.now,
                target=Target(pool="us-east-h100"),
                action=WarmAction.WARM,
                model=COLD_MODEL,
                replicas=2,
                reason="cold_model_demand",
            )
            command(WARM_COMMANDS, out.warm)
        if n == 60:
            assert dbe_sample is not None, "the storm ends in a double-bit fault at t=50 s"
            # the operator carries out the isolation controller's advisory decision
            out.quarantine = signed_command(
                RouteCommand,
                issued_at=sim.now,
                decision_id=quarantine_decision[0].decision_id,
                cause_event_id=dbe_sample.event_id,
                cause_observed_at=dbe_sample.observed_at,
                target=Target(device_uuid=FAULTY),
                action=RouteAction.QUARANTINE,
                reason="double_bit_ecc",
            )
            out.forged = signed_command(
                RouteCommand,
                issued_at=sim.now,
                target=Target(device_uuid="node-00002-gpu0"),
                action=RouteAction.DRAIN,
                reason="forged",
                key=b"not-the-key-of-k1-at-all",
            )
            for c in (out.quarantine, out.quarantine, out.forged):
                command(ROUTE_COMMANDS, c)
        if n in (40, 90):
            # rack-0001's feed degrades from t=30 s: its A100 pool's batch work goes to the
            # H100 pool, then comes back
            ratio = 1.0 if n == 40 else 0.0
            move = signed_command(
                ThrottleCommand,
                issued_at=sim.now,
                target=Target(pool="us-east-a100", rack_id="rack-0001"),
                action=ThrottleAction.MOVE_BATCH,
                batch_move_ratio=ratio,
                to_pool="us-east-h100" if ratio else None,
                reason="move_batch" if ratio else "headroom",
            )
            command(THROTTLE_COMMANDS, move)
        for spec, value in sim.tick(n):
            add(spec, value)
            if isinstance(value, AcceleratorTelemetry | NodeHealth | ServingMetrics):
                judge(detector.observe(value))
            if isinstance(value, AcceleratorTelemetry):
                control.accelerator(value)
            elif isinstance(value, PduReading):
                for o in control.pdu(value):
                    add(DECISIONS, o.decision)
            if isinstance(value, ServingMetrics):
                planner.serving(value)
                for o in control.serving(value):
                    add(DECISIONS, o.decision)
            elif isinstance(value, Demand):
                forecasts, warms = planner.demand(value)
                for f in forecasts:
                    add(FORECASTS, f)
                for w in warms:
                    add(DECISIONS, decide_warm(w, DemandWiring()).decision)
            if (
                dbe_sample is None
                and isinstance(value, AcceleratorTelemetry)
                and value.device_uuid == FAULTY
                and value.ecc_dbe_volatile_total
            ):
                dbe_sample = value
        judge(detector.tick(sim.now))
        for step in ladder.tick(sim.now):
            add(DECISIONS, decide(step, sim.now, advisory).decision)
    bad = [
        RawMessage(Coordinates(ACCELERATOR.name, 0, offsets[ACCELERATOR.name] + 1), b"k", b"{no"),
        RawMessage(
            Coordinates(ACCELERATOR.name, 0, offsets[ACCELERATOR.name] + 2),
            b"k",
            b'{"schema_version": 9}',
        ),
        RawMessage(
            Coordinates(SERVING.name, 0, offsets[SERVING.name] + 1), b"k", encode(records[0][0])
        ),  # a valid event on the wrong topic
    ]
    records.extend(split(bad[:2], ACCELERATOR.value_type, now=sim.now).dead)
    records.extend(split(bad[2:], SERVING.value_type, now=sim.now).dead)
    sink = ClickHouseSink(store, registry=CollectorRegistry())
    now = datetime.now(UTC)
    for i in range(0, len(records), 20_000):
        asyncio.run(sink.write(records[i : i + 20_000], now=now))
    out.rows = len(records)
    out.consequences = list(sim.faults.consequences)
    return out
