"""Every power cap the power controller asks for lies inside the device's own limits.

The limits come from telemetry (DCGM fields 161 and 162, NVML's limit constraints, the
simulator's hardware catalogue); policy's deepest cap (``min_cap_ratio`` of the default)
is only used where the driver allows it, and a device that reports no range is never
capped. One rack holds a device of every accelerator type, with the range its type
ships with, and loses most of its feed: more than policy's floors can shed, so every
device is capped to its driver's floor, and the rack's pools get no optional work.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry

from agents.sim.control import SimControl
from agents.sim.hardware import ACCELERATORS
from agents.sim.scenario import load_scenario
from agents.sim.simulation import Simulation
from fleetloop.sim import build_dispatcher
from planning.pools import ControlPlanner
from planning.throttle import ControlWiring
from schemas.base import AcceleratorType
from schemas.commands import ResultStatus, ThrottleAction, ThrottleCommand
from schemas.events import AcceleratorTelemetry, PduPhase, PduReading, ServingMetrics
from tests.factories import COMMAND_KEYS, START
from tests.unit.test_control_loop import SCENARIOS

KEY = next(iter(COMMAND_KEYS.items()))
RANGES_WATTS = {  # (min, max): board power-limit ranges as their drivers report them
    AcceleratorType.H100: (200.0, 700.0),
    AcceleratorType.H200: (200.0, 700.0),
    AcceleratorType.B200: (200.0, 1000.0),
    AcceleratorType.A100: (100.0, 400.0),
    AcceleratorType.MI300X: (400.0, 750.0),  # a floor above min_cap_ratio of the default
    AcceleratorType.MTIA: (45.0, 90.0),  # the one the demo capped to 36 W, outside its range
    AcceleratorType.CPU: (120.0, 350.0),
}


def _telemetry(
    accelerator: AcceleratorType, at_s: float, *, reported: bool = True
) -> AcceleratorTelemetry:
    low, high = RANGES_WATTS[accelerator]
    return AcceleratorTelemetry(
        event_id=uuid.uuid4(),
        observed_at=START + timedelta(seconds=at_s),
        node_id=f"node-{accelerator.value.lower()}",
        device_uuid=f"dev-{accelerator.value.lower()}" + ("" if reported else "-silent"),
        device_index=0,
        accelerator_type=accelerator,
        region="us-east",
        pod_id="pod-0",
        rack_id="rack-0",
        pdu_id="pdu-0",
        power_usage_watts=0.95 * high,
        power_limit_watts=high,
        power_limit_min_watts=low if reported else None,
        power_limit_max_watts=high if reported else None,
    )


def _pdu(at_s: float, draw_watts: float, limit_watts: float) -> PduReading:
    return PduReading(
        event_id=uuid.uuid4(),
        observed_at=START + timedelta(seconds=at_s),
        pdu_id="pdu-0",
        rack_id="rack-0",
        pod_id="pod-0",
        region="us-east",
        phase=PduPhase.L1,
        power_watts=draw_watts,
        capacity_watts=2 * limit_watts,
        breaker_limit_watts=limit_watts,
    )


def test_caps_stay_inside_every_accelerator_types_range() -> None:
    planner = ControlPlanner(ControlWiring(signing_key=KEY, period_s=2.0))
    draw = sum(0.95 * high for _, high in RANGES_WATTS.values())
    caps: list[ThrottleCommand] = []
    for step in range(40):
        at_s = float(step)
        events: list[AcceleratorTelemetry | PduReading] = [
            _telemetry(t, at_s) for t in AcceleratorType
        ]
        events.append(_telemetry(AcceleratorType.H100, at_s, reported=False))
        events.append(_pdu(at_s, draw, limit_watts=0.2 * draw))  # far more than caps can shed
        for event in events:
            for o in planner.feed(event):
                if o.command is not None and o.command.action is ThrottleAction.POWER_CAP:
                    caps.append(o.command)
    capped = {c.target.device_uuid: c.power_limit_watts for c in caps}
    assert "dev-h100-silent" not in capped  # no range reported: never capped
    for t in AcceleratorType:
        low, high = RANGES_WATTS[t]
        floor = max(low, planner.wiring.min_cap_ratio * high)
        uuid_ = f"dev-{t.value.lower()}"
        assert uuid_ in capped, f"{t.value} was never capped"
        for c in caps:
            if c.target.device_uuid == uuid_:
                assert c.power_limit_watts is not None
                assert low <= c.power_limit_watts <= high, (t.value, c.power_limit_watts)
        # past policy's floor (a rack that it brings under its limit stops there:
        # test_control), the rack still over its limit: on to the driver's own
        assert capped[uuid_] == pytest.approx(low), (t.value, floor)


def test_a_pool_on_a_rack_over_its_limit_with_every_lever_spent_gets_no_optional_work() -> None:
    # the same rack, still over its limit with every cap at its driver's floor: optional
    # work on it is load that must come off, so its pool's budget goes to zero, once, saying why
    planner = ControlPlanner(ControlWiring(signing_key=KEY, period_s=2.0))
    draw = sum(0.95 * high for _, high in RANGES_WATTS.values())
    budgets = []
    for step in range(40):
        at_s = float(step)
        for t in AcceleratorType:
            planner.feed(_telemetry(t, at_s))
        planner.feed(_pdu(at_s, draw, limit_watts=0.2 * draw))
        outputs = planner.feed(_serving(at_s))
        budgets += [o.decision for o in outputs if o.decision.controller == "capacity"]
    assert budgets and budgets[-1].reason == "power_limit"
    assert budgets[-1].applied == 0.0 and "rack-0" in budgets[-1].message
    assert sum(1 for d in budgets if d.reason == "power_limit") == 1  # recorded once


def _serving(at_s: float) -> ServingMetrics:
    return ServingMetrics(
        event_id=uuid.uuid4(), observed_at=START + timedelta(seconds=at_s),
        replica_id="r-h100", node_id="node-h100", device_uuid="dev-h100", model="llama-70b",
        pool="us-east-h100", region="us-east", accelerator_type=AcceleratorType.H100,
        interval_s=1.0, tpot_p95_s=0.03, queue_depth=0, batch_size=32, tokens_per_s=900.0,
        requests=10, errors=0, optional_requests=2,
    )  # fmt: skip


def test_every_cap_on_the_simulated_fleet_is_applied_by_its_device() -> None:
    # The simulator's hardware catalogue (every type it models) reports its ranges; the
    # executors refuse a cap outside them, so every cap must come back `applied`.
    scenario = load_scenario(SCENARIOS / "pdu-overload.yaml")
    sim = Simulation(scenario, start=START)
    types = {d.spec.kind for n in sim.fleet.nodes for d in n.devices}
    assert types == set(ACCELERATORS)
    dispatcher = build_dispatcher(SimControl(sim.fleet), COMMAND_KEYS, CollectorRegistry())
    planner = ControlPlanner(ControlWiring(signing_key=KEY, period_s=2.0, min_cap_ratio=0.05))
    statuses: dict[ResultStatus, int] = {}
    for n in range(300):
        for _, event in sim.tick(n):
            for o in planner.feed(event):
                if o.command is None or o.command.action is not ThrottleAction.POWER_CAP:
                    continue
                result = dispatcher.handle(o.command, now=sim.now, received_at=sim.now)
                assert result is not None
                statuses[result.status] = statuses.get(result.status, 0) + 1
    assert statuses and set(statuses) == {ResultStatus.APPLIED}, statuses
