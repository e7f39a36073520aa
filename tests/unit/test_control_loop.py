"""The control processor's logic in-process: simulated telemetry -> ControlPlanner ->
signed throttle commands -> executors on the simulated fleet -> the fleet changes."""

from __future__ import annotations

import itertools
import json
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agents.envelopes import pack
from agents.executors.gate import CommandGate
from agents.sim.control import SimControl
from agents.sim.scenario import load_scenario
from agents.sim.simulation import Simulation
from agents.sim.state import Device
from controllers.power import PowerConfig
from controllers.power_routing import PowerRoutingConfig
from fleetloop.sim import build_dispatcher
from planning.pools import ControlPlanner
from planning.racks import RackPlanner
from planning.throttle import ControlOutput, ControlWiring
from schemas.base import AcceleratorType, Contract
from schemas.codec import decode_samples, encode
from schemas.commands import (
    ResultStatus,
    RouteAction,
    RouteCommand,
    ThrottleAction,
    ThrottleCommand,
)
from schemas.envelopes import AcceleratorTick, ServingTick
from schemas.events import AcceleratorTelemetry, PduPhase, PduReading, ServingMetrics
from schemas.signing import verify
from schemas.verdicts import Decision, DecisionOutcome
from tests.factories import COMMAND_KEYS, START

SCENARIOS = Path(__file__).parents[2] / "scenarios"
KEY = next(iter(COMMAND_KEYS.items()))


def _feed(planner: ControlPlanner, records: list[tuple[object, Contract]]) -> list[ControlOutput]:
    return [o for _, event in records for o in planner.feed(event)]


def _run(
    *,
    controlled: bool,
    seconds: int = 600,
    global_budget: float = float("inf"),
    batch_ratio: float = 0.0,
    move_batch: bool = True,
    each_step: Callable[[Simulation], None] | None = None,
    power_routing: bool = True,
    across_pools: bool = True,
    scenario_file: str = "pdu-overload.yaml",
    tpot_slo_s: float = 0.08,
    targets: tuple[float, float] | None = None,
) -> tuple[Simulation, list[ControlOutput]]:
    scenario = load_scenario(SCENARIOS / scenario_file)
    power = PowerConfig(move_after_periods=3 if move_batch else 10**9)
    if targets is not None:
        power = replace(power, target_ratio=targets[0], waiting_target_ratio=targets[1])
    demand = scenario.demand.model_copy(update={"batch_ratio": batch_ratio})
    sim = Simulation(scenario.model_copy(update={"demand": demand}), start=START)
    dispatcher = build_dispatcher(SimControl(sim.fleet), COMMAND_KEYS, CollectorRegistry())
    planner = ControlPlanner(
        ControlWiring(
            signing_key=KEY, period_s=2.0, tpot_slo_s=tpot_slo_s,
            global_budget_devices=global_budget,
            power=power,
            power_routing=PowerRoutingConfig(enabled=power_routing, across_pools=across_pools),
        )
    )  # fmt: skip
    outputs: list[ControlOutput] = []
    for n in range(int(seconds / sim.interval_s)):
        made = _feed(planner, sim.tick(n))  # type: ignore[arg-type]
        if each_step is not None:
            each_step(sim)
        outputs += made
        if not controlled:
            continue
        for o in made:
            if o.command is not None:
                result = dispatcher.handle(o.command, now=sim.now, received_at=sim.now)
                assert result is not None and result.status is ResultStatus.APPLIED, result
    return sim, outputs


def test_power_caps_keep_a_degraded_rack_from_tripping() -> None:
    uncontrolled, _ = _run(controlled=False)
    trips = [c for c in uncontrolled.faults.consequences if c["what"] == "breaker_trip"]
    assert trips, "the scenario must trip the breaker when nothing acts"
    sim, outputs = _run(controlled=True)
    assert not [c for c in sim.faults.consequences if c["what"] == "breaker_trip"]
    caps = [o for o in outputs if o.command is not None
            and o.command.action is ThrottleAction.POWER_CAP]  # fmt: skip
    assert caps and all(verify(o.command, keys=COMMAND_KEYS) for o in caps if o.command)
    rack0 = sim.fleet.racks[0]
    assert caps[0].decision.rack_id == rack0.rack_id
    # after the feed is repaired the caps come off again
    assert all(d.power_cap_watts == d.spec.power_limit_watts
               for n in rack0.nodes for d in n.devices)  # fmt: skip


def test_the_budget_grows_with_headroom_and_records_pid_terms() -> None:
    sim, outputs = _run(controlled=True, seconds=120)
    budget = [o for o in outputs if o.decision.controller == "capacity" and o.decision.applied]
    assert budget, "a pool with headroom gets an optional-work budget"
    first = budget[0].decision
    assert first.p_term is not None and first.i_term is not None and first.d_term is not None
    assert first.outcome is DecisionOutcome.ISSUED and first.applied and first.applied > 0
    assert isinstance(budget[0].command, ThrottleCommand)
    assert budget[0].command.optional_budget_ratio == round(first.applied, 4)
    # spent on the two levers, and the router holds both
    command = budget[-1].command
    assert isinstance(command, ThrottleCommand) and command.funnel_extra_candidates is not None
    assert command.upgrade_ratio is not None and "extra candidates" in budget[-1].decision.message
    assert set(sim.fleet.router.optional_levers[command.target.pool or ""]) == {
        "funnel_extra_candidates",
        "upgrade_ratio",
    }
    # the router took it: optional work is served, and only from capacity baseline left
    optional = [d for d in sim.fleet.devices.values() if d.optional_rps > 0]
    assert optional and all(d.queue == 0 or d.optional_rps == 0 for d in optional)


def test_a_pool_over_its_tpot_slo_gives_optional_work_back_and_cuts_its_batch() -> None:
    planner = ControlPlanner(ControlWiring(signing_key=KEY, period_s=10.0, tpot_slo_s=0.05))
    made: list[ControlOutput] = []
    for k in range(40):
        tpot = 0.03 if k < 20 else 0.09
        m = ServingMetrics(
            event_id=uuid.uuid4(), observed_at=START + timedelta(seconds=5 * k),
            replica_id="r1", node_id="node-00000", model="llama-70b", pool="us-east-h100",
            region="us-east", accelerator_type="H100", interval_s=5.0, tpot_p95_s=tpot,
            queue_depth=0, batch_size=64 if k < 20 else 250, tokens_per_s=900.0, requests=10,
            errors=0,
        )  # fmt: skip
        made += planner.serving(m)
    reasons = [(o.decision.controller, o.decision.reason) for o in made]
    assert ("capacity", "slo_breach") in reasons
    assert ("tpot_guard", "tpot_high") in reasons
    # tokens 1.52x slower (20 ms at a batch of one, then 30.5): the cap follows the speed at
    # the close it shows, to 128 * (0.95 * 50 / 30.5 - 1) = 71 (TPOT under 0.95 of the SLO
    # by the planner's model), then TPOT still over the SLO cuts 20%
    guard = [o for o in made if o.decision.controller == "tpot_guard"]
    speed = next(o for o in guard if o.decision.reason == "token_speed")
    cut = next(o for o in guard if o.decision.reason == "tpot_high")
    assert isinstance(speed.command, ThrottleCommand) and speed.command.batch_size_max == 71
    assert isinstance(cut.command, ThrottleCommand) and cut.command.batch_size_max == 56


def test_the_budget_takes_the_room_back_when_the_tokens_speed_up_again() -> None:
    # one replica at batch 100 against a 0.08 s SLO (setpoint 0.9: 0.072 s). Fast, a token
    # takes 0.03 s at a batch of one: 179 slots, of which the baseline holds 100 * 0.072 /
    # 0.0534 = 135 (0.75). Slowed 12% (0.0336 s): 146 slots, 120 held (0.82), and the
    # budget is cut at once. Fast again, the baseline falls back by 9%, too little for the
    # budget to take it for a step down in load; but the guard sees the tokens speed up
    # past their noise, and the budget's windows, whose busiest level was read in the
    # slower pool's slots, start again: the room comes back at once, not after the
    # 120-s stabilisation window and a climb back a step at a time
    planner = ControlPlanner(ControlWiring(signing_key=KEY, period_s=10.0, tpot_slo_s=0.08))
    budgets: list[tuple[int, float]] = []
    speed: list[int] = []
    for k in range(200):
        unit_s = 0.0336 if 80 <= k < 120 else 0.03
        m = ServingMetrics(
            event_id=uuid.uuid4(), observed_at=START + timedelta(seconds=5 * k),
            replica_id="r1", node_id="node-00000", model="llama-70b", pool="us-east-h100",
            region="us-east", accelerator_type="H100", interval_s=5.0,
            tpot_p95_s=unit_s * (1 + 100 / 128), queue_depth=0, batch_size=100,
            tokens_per_s=900.0, requests=10, errors=0,
        )  # fmt: skip
        for o in planner.serving(m):
            if o.decision.controller == "capacity" and o.decision.applied is not None:
                budgets.append((k, o.decision.applied))
            if o.decision.reason == "token_speed":
                speed.append(k)
    before = max(b for k, b in budgets if k < 80)
    slowed = min(b for k, b in budgets if 80 <= k < 120)
    assert before > 0.25 and slowed < before - 0.02  # cut for the slower pool's room
    assert [k for k in speed if k >= 120] == [122]  # the close that reads report 120
    back = [b for k, b in budgets if 120 <= k <= 122]
    assert back and back[-1] > before - 0.02, f"the room came back only later: {budgets}"


def test_optional_work_never_goes_where_the_router_sends_nothing() -> None:
    sim = Simulation(load_scenario(SCENARIOS / "steady.yaml"), start=START)
    sim.tick(0)
    control = SimControl(sim.fleet)
    drained = next(d for d in sim.fleet.devices.values() if d.model is not None)
    control.set_admission_state(drained.uuid, RouteAction.DRAIN, weight_ratio=None)
    control.set_pool_lever(drained.pool, "optional_budget", 0.3)
    for n in range(1, 5):
        sim.tick(n)
    peers = [d for d in sim.fleet.devices.values()
             if d.pool == drained.pool and d is not drained and d.model is not None]  # fmt: skip
    assert drained.optional_rps == 0.0 and any(d.optional_rps > 0 for d in peers)


def test_the_fleets_optional_work_limit_caps_the_pools_together() -> None:
    _, free = _run(controlled=True, seconds=300)
    sim, capped = _run(controlled=True, seconds=300, global_budget=1.0)
    assert any(o.decision.reason == "global_budget" for o in capped)
    last: dict[str, float] = {}
    for o in capped:
        if o.decision.controller == "capacity" and o.decision.applied is not None:
            last[o.decision.target] = o.decision.applied
    replicas = {p: sum(1 for d in sim.fleet.devices.values() if d.pool == p and d.model)
                for p in last}  # fmt: skip
    held = sum(last[p] * replicas[p] for p in last)
    assert held <= 1.0 + 1e-6
    assert max(o.decision.applied or 0 for o in free if o.decision.controller == "capacity") > max(
        o.decision.applied or 0 for o in capped if o.decision.controller == "capacity"
    )


def test_the_budget_leaves_the_room_tpot_allows_not_the_batch_limit() -> None:
    # one replica at batch 64 with TPOT p95 0.06 s against a 0.08 s SLO (setpoint 0.9):
    # at a batch of one it would take 0.04 s, so ~102 sequences fit under 0.072 s. Its
    # baseline holds 64 at 0.06 s a token; with the replica full each token takes 0.072 s,
    # so by Little's law the same requests hold 64 * 0.072 / 0.06 = 76.8 slots: the
    # feedforward leaves 0.99 - 76.8/102.4 of the room (not 0.99 - 64/102.4)
    planner = ControlPlanner(ControlWiring(signing_key=KEY, period_s=10.0, tpot_slo_s=0.08))
    wanted = []
    for k in range(8):
        m = ServingMetrics(
            event_id=uuid.uuid4(), observed_at=START + timedelta(seconds=5 * k),
            replica_id="r1", node_id="node-00000", model="llama-70b", pool="us-east-h100",
            region="us-east", accelerator_type="H100", interval_s=5.0, tpot_p95_s=0.06,
            queue_depth=0, batch_size=64, tokens_per_s=900.0, requests=10, errors=0,
            optional_requests=0,
        )  # fmt: skip
        wanted += [o.decision.desired for o in planner.serving(m) if o.decision.desired]
    assert wanted and abs(wanted[-1] - (0.99 - 76.8 / 102.4)) < 0.02


def _report(second: int, *, tpot_s: float, queue: int, batch: int, optional: int) -> ServingMetrics:
    """Replica r1's serving report for ``second`` (a one-second interval, 10 requests)."""
    return ServingMetrics(
        event_id=uuid.uuid4(), observed_at=START + timedelta(seconds=second),
        replica_id="r1", node_id="node-00000", model="llama-70b", pool="us-east-h100",
        region="us-east", accelerator_type="H100", interval_s=1.0, tpot_p95_s=tpot_s,
        queue_depth=queue, batch_size=batch, tokens_per_s=900.0, requests=10, errors=0,
        optional_requests=optional,
    )  # fmt: skip


def _one_replica(queues: list[int], *, batch: int, optional: int) -> list[Decision]:
    """A minute of one replica's serving reports, a second apart (its queue cycling through
    ``queues``), through a planner: the capacity decisions it made."""
    planner = ControlPlanner(ControlWiring(signing_key=KEY, period_s=10.0, tpot_slo_s=0.08))
    out = []
    for k in range(60):
        m = _report(k, tpot_s=0.05, queue=queues[k % len(queues)], batch=batch, optional=optional)
        out += [o.decision for o in planner.serving(m) if o.decision.controller == "capacity"]
    return out


def test_a_period_is_judged_on_its_mean_load_not_its_last_report() -> None:
    # a replica whose queue comes and goes (0 and 40 waiting, second by second): the budget
    # is the same whichever report happens to close the period
    ends_empty = [d.desired for d in _one_replica([40, 0] * 5, batch=32, optional=0)]
    ends_full = [d.desired for d in _one_replica([0, 40] * 5, batch=32, optional=0)]
    assert ends_empty and ends_empty == pytest.approx(ends_full)


def test_optional_work_that_waits_is_not_taken_for_baseline() -> None:
    # a replica running 40 sequences, a tenth of its requests optional: whether 30 more
    # requests wait or none, the baseline it must leave room for is the same (the wait
    # shows in the load, which the PID trims on, not in the feedforward)
    def feedforward(queue: int) -> list[float]:
        return [
            d.desired - d.p_term - (d.i_term or 0.0) - (d.d_term or 0.0)
            for d in _one_replica([queue], batch=40, optional=1)
            if d.desired is not None and d.p_term is not None
        ]

    assert feedforward(0) and feedforward(30) == pytest.approx(feedforward(0))


def test_a_pool_back_from_silence_is_decided_when_it_reports_and_its_commands_are_live() -> None:
    # a replica with room reports for a minute (the budget rises), falls silent for five
    # minutes (its rack tripped) and reports again. Its last period closes then: the
    # controllers step at that period's end, but what they decide is decided and issued at
    # the report, so an executor takes it; stamped with the old end it arrived expired and
    # the planner believed a budget that never applied
    planner = ControlPlanner(ControlWiring(signing_key=KEY, period_s=10.0, tpot_slo_s=0.08))
    gate = CommandGate(keys=COMMAND_KEYS)
    for k in range(56):
        for o in planner.serving(_report(k, tpot_s=0.03, queue=0, batch=32, optional=1)):
            if o.command is not None:
                assert gate.refuse(o.command, now=START + timedelta(seconds=k)) is None
    back = 56 + 300  # the last report was in the period ending at 60 s
    late = planner.serving(_report(back, tpot_s=0.03, queue=0, batch=32, optional=1))
    commands = [o.command for o in late if o.command is not None]
    assert commands, "the period closed late decided nothing: the test shows nothing"
    # the start of the period the report is in
    learned = datetime.fromtimestamp((START.timestamp() + back) // 10.0 * 10.0, UTC)
    assert {o.decision.decided_at for o in late} == {learned}
    for command in commands:
        assert command.issued_at == learned
        assert gate.refuse(command, now=START + timedelta(seconds=back)) is None
    # a period closed on time is decided at its end, as ever
    on_time = planner.serving(_report(back + 10, tpot_s=0.03, queue=0, batch=32, optional=1))
    assert {o.decision.decided_at for o in on_time} <= {learned + timedelta(seconds=10)}


def _pinned_rack(
    planner: ControlPlanner, second: int, draw_w: float, *, peer: bool = True, cap_w: float = 200.0
) -> list[ControlOutput]:
    """One second of a rack of four H100s capped at ``cap_w`` (the driver's floor, 200 W),
    each drawing its floor, serving pool "pinned" (with a free peer on another rack, with
    ``peer``); the rack's PDU reads ``draw_w`` against a breaker limit of 1,000 W."""
    at = START + timedelta(seconds=second)
    out = []
    for i in range(5 if peer else 4):
        u, rack = f"gpu-{i}", "rack-0" if i < 4 else "rack-1"
        planner.accelerator(AcceleratorTelemetry(
            event_id=uuid.uuid4(), observed_at=at, node_id=f"node-{i}", device_uuid=u,
            device_index=0, accelerator_type=AcceleratorType.H100, region="r", pod_id="pod-0",
            rack_id=rack, pdu_id=f"pdu-{rack}", power_usage_watts=200.0 if i < 4 else 500.0,
            power_limit_watts=(700.0 if second == 0 else cap_w) if i < 4 else 700.0,
            power_limit_min_watts=200.0, power_limit_max_watts=700.0,
        ))  # fmt: skip
        out += planner.serving(ServingMetrics(
            event_id=uuid.uuid4(), observed_at=at, replica_id=f"r-{i}", node_id=f"node-{i}",
            device_uuid=u, model="m", pool="pinned", region="r", accelerator_type="H100",
            interval_s=1.0, tpot_p95_s=0.05, queue_depth=0, batch_size=32, tokens_per_s=900.0,
            requests=10, errors=0, optional_requests=0,
        ))  # fmt: skip
    return out + planner.pdu(PduReading(
        event_id=uuid.uuid4(), observed_at=at, pdu_id="pdu-rack-0", rack_id="rack-0",
        pod_id="pod-0", region="r", phase=PduPhase.L1, power_watts=draw_w,
        capacity_watts=2000.0, breaker_limit_watts=1000.0,
    ))  # fmt: skip


def test_a_reading_over_the_limit_above_the_early_close_closes_again() -> None:
    # held-out control seed 130: a reading over the target closed the rack's period early;
    # the load kept rising, and the next reading drew over the breaker limit itself. The
    # rest of the period was left to the caps in flight, and the breaker (5 s) tripped
    # before the period (10 s) ended. A reading over the limit that draws more than the
    # close acted on is acted on at once
    planner = ControlPlanner(ControlWiring(signing_key=KEY, period_s=10.0, tpot_slo_s=0.08))
    for k in range(11):  # a period within the limit: the devices are known
        _pinned_rack(planner, k, 900.0, cap_w=400.0)
    first = _pinned_rack(planner, 11, 980.0, cap_w=400.0)  # over the target (975 W)
    assert [o for o in first if o.decision.controller == "power"]
    same = _pinned_rack(planner, 12, 980.0, cap_w=400.0)  # no higher: the caps in flight
    assert not [o for o in same if o.decision.controller == "power"]
    risen = _pinned_rack(planner, 13, 1050.0, cap_w=400.0)  # over the limit, and higher
    assert [o for o in risen if o.decision.controller == "power" and o.command is not None]


def test_a_rack_over_its_breaker_with_every_cap_at_its_floor_sheds_at_every_reading() -> None:
    # four devices pinned at their floor caps, the rack 10% over its breaker: the draw says
    # a 10% cut, but a pinned device draws no less until its work is under the floor's knee.
    # The replicas shed at every reading that finds the rack still over (a breaker trips
    # in seconds, not at the next period), the cut doubling while it stays over; and stop
    # once a reading finds it under
    planner = ControlPlanner(ControlWiring(signing_key=KEY, period_s=10.0, tpot_slo_s=0.08))
    for k in range(11):  # a period of readings within the limit: the pool is known
        _pinned_rack(planner, k, 900.0)
    cuts: list[list[float]] = []
    for k in range(11, 15):
        made = _pinned_rack(planner, k, 1100.0)
        cuts.append([o.decision.applied for o in made if o.decision.reason == "rack_over_limit"
                     and o.decision.applied is not None])  # fmt: skip
    assert all(len(c) == 4 for c in cuts[1:]), cuts  # every reading, every replica there
    weights = [c[0] for c in cuts if c]
    steps = [b / a for a, b in zip([1.0, *weights], weights, strict=False)]
    # doubling while it stays over, up to half a weight a reading, down to the least weight
    # (the first cut is the plan's: what caps at their floors leave over, low clocks not
    # counted on, 0.625 of a weight)
    assert steps[1] < steps[0] < 0.95 and steps[2] == pytest.approx(0.5), steps
    assert min(steps) >= 0.5 - 1e-9, steps
    assert weights[-1] == pytest.approx(0.1)  # far more than the 10% the draw says
    under = _pinned_rack(planner, 15, 950.0)  # under the limit: no more cuts
    assert not [o for o in under if o.decision.reason == "rack_over_limit"]


def test_a_rack_no_routing_can_hold_has_its_pool_admit_less_and_all_again_later() -> None:
    # the pool wholly on the rack, no share movable between pools: its replicas reach the
    # least weight with the rack still over its breaker, and the pool admits less of its
    # requests; the level is handed over with the planner's levers, and comes back once
    # the rack's caps are off their floors
    wiring = ControlWiring(signing_key=KEY, period_s=10.0, tpot_slo_s=0.08,
                           power_routing=PowerRoutingConfig(across_pools=False))  # fmt: skip
    planner = ControlPlanner(wiring)
    for k in range(11):
        _pinned_rack(planner, k, 900.0, peer=False)
    made = [o for k in range(11, 19) for o in _pinned_rack(planner, k, 1100.0, peer=False)]
    cuts = [o for o in made if o.decision.reason == "admission_shed"]
    assert cuts and all(isinstance(o.command, ThrottleCommand)
                        and o.command.action is ThrottleAction.ADMISSION for o in cuts)  # fmt: skip
    level = cuts[-1].decision.applied
    assert level is not None and level < 1.0 and planner.admission == {"pinned": level}
    handed = json.loads(json.dumps(planner.held()))
    successor = ControlPlanner(wiring)
    successor.adopt(handed)
    assert successor.admission == {"pinned": level}
    backs = [o for k in range(19, 120)
             for o in _pinned_rack(successor, k, 600.0, peer=False, cap_w=700.0)
             if o.decision.reason == "admission_back"]  # fmt: skip
    assert backs and backs[-1].decision.applied == 1.0 and successor.admission == {}
    assert all(b.decision.applied <= 1.5 * a.decision.applied + 1e-9  # type: ignore[operator]
               for a, b in itertools.pairwise(backs))  # fmt: skip


def _serve(planner: ControlPlanner, second: int, replica: str, model: str, tpot: float,
           requests: int) -> list[ControlOutput]:  # fmt: skip
    return planner.serving(
        ServingMetrics(
            event_id=uuid.uuid4(),
            observed_at=START + timedelta(seconds=5 * second),
            replica_id=replica,
            node_id="node-00000",
            model=model,
            pool="us-east-h100",
            region="us-east",
            accelerator_type="H100",
            interval_s=5.0,
            tpot_p95_s=tpot,
            queue_depth=0,
            batch_size=32,
            tokens_per_s=900.0,
            requests=requests,
            errors=0,
            optional_requests=0,
        )
    )


def test_each_model_answers_to_the_slo_and_one_quiet_slow_replica_does_not() -> None:
    # a slow replica that serves 1 request in 200 of its model's: not the pool's p95
    quiet = ControlPlanner(ControlWiring(period_s=10.0, tpot_slo_s=0.08))
    made = []
    for k in range(12):
        made += _serve(quiet, k, "fast", "qwen-7b", 0.03, 199)
        made += _serve(quiet, k, "slow", "qwen-7b", 0.2, 1)
    assert not [o for o in made if o.decision.reason == "slo_breach"]
    # a model over its SLO on every replica: the pool answers for it, however few it serves
    mixed = ControlPlanner(ControlWiring(period_s=10.0, tpot_slo_s=0.08))
    made = []
    for k in range(12):
        made += _serve(mixed, k, "a", "qwen-7b", 0.03, 500)
        made += _serve(mixed, k, "b", "llama-70b", 0.09, 5)
    assert [o for o in made if o.decision.reason == "slo_breach"]


def test_a_pool_is_read_at_its_worst_second_as_the_slo_is_kept() -> None:
    # two replicas, their batches near the cap, report each second; one second in twenty
    # both are over the SLO: 5% of the period's requests, so the period's pooled p95 reads
    # 30 ms, and that second 90 ms
    def run(slow_second: int | None) -> list[ControlOutput]:
        planner = ControlPlanner(ControlWiring(period_s=20.0, tpot_slo_s=0.08))
        made = []
        for k in range(200):
            tpot = 0.09 if slow_second is not None and k % 20 == slow_second else 0.03
            for replica in ("a", "b"):
                made += planner.serving(ServingMetrics(
                    event_id=uuid.uuid4(), observed_at=START + timedelta(seconds=k),
                    replica_id=replica, node_id="node-00000", model="qwen-7b",
                    pool="us-east-h100", region="us-east", accelerator_type="H100",
                    interval_s=1.0, tpot_p95_s=tpot, queue_depth=0, batch_size=250,
                    tokens_per_s=900.0, requests=10, errors=0, optional_requests=0,
                ))  # fmt: skip
        return made

    assert not [o for o in run(None) if o.decision.reason == "slo_breach"]
    said = {(o.decision.controller, o.decision.reason) for o in run(7)}
    assert {("capacity", "slo_breach"), ("tpot_guard", "tpot_high")} <= said


def test_caps_go_first_to_the_device_busiest_with_optional_work() -> None:
    sim = Simulation(load_scenario(SCENARIOS / "steady.yaml"), start=START)
    sim.tick(0)
    rack = sim.fleet.racks[0]
    a, b = rack.nodes[0].devices[0], rack.nodes[0].devices[1]
    planner = ControlPlanner(ControlWiring(signing_key=KEY, period_s=10.0))
    made: list[ControlOutput] = []
    for k in range(3):
        at = START + timedelta(seconds=10 * k + 1)
        for dev, optional in ((a, 0), (b, 9)):  # b serves mostly optional work
            sample = sim.telemetry.device_sample(dev).model_copy(
                update={"observed_at": at, "power_usage_watts": 600.0, "power_limit_watts": 700.0}
            )
            planner.accelerator(sample)
            m = ServingMetrics(
                event_id=uuid.uuid4(), observed_at=at, replica_id=dev.uuid,
                node_id=dev.node.node_id, device_uuid=dev.uuid, model="qwen-7b", pool=dev.pool,
                region=dev.node.region, accelerator_type=dev.spec.kind, interval_s=1.0,
                tpot_p95_s=0.03, queue_depth=0, batch_size=32, tokens_per_s=900.0, requests=10,
                errors=0, optional_requests=optional,
            )  # fmt: skip
            made += planner.serving(m)
        reading = PduReading(
            event_id=uuid.uuid4(), observed_at=at, pdu_id=rack.pdu_id, rack_id=rack.rack_id,
            pod_id=rack.pod_id, region=rack.region, phase="L1", power_watts=1300.0,
            capacity_watts=2000.0, breaker_limit_watts=1200.0,
        )  # fmt: skip
        made += planner.pdu(reading)
    caps = [o.command for o in made if o.command is not None
            and o.command.action is ThrottleAction.POWER_CAP]  # fmt: skip
    assert caps and caps[0].target.device_uuid == b.uuid


def test_batch_work_leaves_a_capped_rack_for_pools_with_headroom_and_comes_back() -> None:
    during: list[tuple[float, float, float]] = []  # rack 0's TPOT, its batch rps, moved rps

    def watch(sim: Simulation) -> None:
        if 150 <= sim.fleet.t_s <= 400:  # the feed is lost from 120 s to 420 s
            devices = _rack_devices(sim, 0)
            serving = [d for d in devices if d.served_rps > 0]
            tpot = sum(d.tpot_s for d in serving) / len(serving)
            during.append((tpot, sum(d.batch_rps for d in devices), sim.fleet.batch.moved_rps))

    sim, outputs = _run(controlled=True, batch_ratio=0.2, each_step=watch)
    rack0 = sim.fleet.racks[0].rack_id
    moves = [o.command for o in outputs if isinstance(o.command, ThrottleCommand)
             and o.command.action is ThrottleAction.MOVE_BATCH]  # fmt: skip
    away = [c for c in moves if c.batch_move_ratio]
    back = [c for c in moves if c.batch_move_ratio == 0]
    assert away and back and all(c.to_pool for c in away)
    assert any(c.target.rack_id == rack0 for c in away)
    # while the caps hold, the rack runs no batch work and the work runs elsewhere
    assert all(batch == 0 and moved > 0 for _, batch, moved in during[10:])
    # after the repair it is back, and nothing is left moved
    assert not sim.fleet.batch.moves and sum(d.batch_rps for d in _rack_devices(sim, 0)) > 0
    assert not [c for c in sim.faults.consequences if c["what"] == "breaker_trip"]
    # against the same run with batch work left where it was: the capped rack serves faster,
    # and none of the work moved waits past its backlog limit. It waits longer than it would
    # have at home (some twenty thousand requests still queued at the end, against none): the
    # pools that take it run their own first. The trade is batch work's latency for the rack's
    # baseline
    kept: list[float] = []

    def watch_kept(sim: Simulation) -> None:
        if 150 <= sim.fleet.t_s <= 400:
            serving = [d for d in _rack_devices(sim, 0) if d.served_rps > 0]
            kept.append(sum(d.tpot_s for d in serving) / len(serving))

    _run(controlled=True, batch_ratio=0.2, move_batch=False, each_step=watch_kept)
    assert sum(t for t, _, _ in during) / len(during) < 0.95 * sum(kept) / len(kept)
    assert sim.fleet.batch.late_total == 0


def _rack_devices(sim: Simulation, rack: int) -> list[Device]:
    return [d for n in sim.fleet.racks[rack].nodes for d in n.devices]


def _rack_planner_run(
    rooms: dict[str, float], *, seconds: int = 300, limit_ratio: float | None = None
) -> tuple[Simulation, list[ControlOutput]]:
    """pdu-overload with batch work, through a rack planner alone whose caps land."""
    scenario = load_scenario(SCENARIOS / "pdu-overload.yaml")
    demand = scenario.demand.model_copy(update={"batch_ratio": 0.1})
    faults = scenario.faults
    if limit_ratio is not None:
        params = {**faults[0].params, "breaker_limit_ratio": limit_ratio}
        faults = (faults[0].model_copy(update={"params": params}), *faults[1:])
    sim = Simulation(scenario.model_copy(update={"demand": demand, "faults": faults}),
                     start=START)  # fmt: skip
    wiring = ControlWiring(signing_key=KEY, period_s=2.0, tpot_slo_s=0.08)
    racks = RackPlanner(wiring, rooms=lambda: rooms)
    dispatcher = build_dispatcher(SimControl(sim.fleet), COMMAND_KEYS, CollectorRegistry())
    made: list[ControlOutput] = []
    for n in range(int(seconds / sim.interval_s)):
        for _, event in sim.tick(n):
            if isinstance(event, AcceleratorTelemetry):
                racks.accelerator(event)
            elif isinstance(event, ServingMetrics):
                racks.serving(event)
            elif isinstance(event, PduReading):
                out = racks.pdu(event)
                made += out
                for o in out:  # the caps land, so they hold (and the rack does not trip)
                    if o.command is not None:
                        dispatcher.handle(o.command, now=sim.now, received_at=sim.now)
    return sim, made


def test_batch_work_with_no_pool_to_take_it_stays_and_the_move_is_asked_again() -> None:
    sim, made = _rack_planner_run({"us-east-h100": 0.0})  # every pool full
    moves = [o for o in made if o.decision.action == "move_batch"]
    assert moves and all(o.command is None for o in moves)  # nothing is sent anywhere
    stays = [o.decision for o in moves if "stays" in o.decision.message]
    assert stays and all(d.outcome is DecisionOutcome.ADVISORY for d in stays)
    # asked again while the caps hold, but not every period: once they have held again
    rack0 = sim.fleet.racks[0].rack_id
    times = sorted({d.decided_at for d in stays if d.rack_id == rack0})
    assert len(times) >= 2
    assert all((b - a).total_seconds() >= 3 * 2.0 for a, b in itertools.pairwise(times))


def test_a_shed_that_also_moves_batch_work_gives_each_lever_its_own_reason() -> None:
    # a feed cut so deep that caps and low clocks cannot cover it: one plan lowers the caps
    # and asks for the batch work to move; the caps say over_target, the move move_batch
    _, made = _rack_planner_run({"us-east-h100": 8.0}, seconds=200, limit_ratio=0.3)
    first = min(o.decision.decided_at for o in made if o.decision.action == "move_batch")
    together = {(o.decision.action, o.decision.reason) for o in made
                if o.decision.decided_at == first}  # fmt: skip
    assert ("power_cap", "over_target") in together and ("move_batch", "move_batch") in together
    levers = {(o.decision.action, o.decision.reason) for o in made}
    assert {r for a, r in levers if a != "move_batch"} <= {"over_target", "headroom"}, levers


def test_capped_devices_get_less_work_and_their_tpot_meets_their_peers_then_comes_back() -> None:
    # pdu-overload: rack 0 loses part of its feed and its devices are capped; a router that
    # balances by capacity alone leaves their tokens slower than the rest of the pool's
    def watch(ratios: list[float]) -> Callable[[Simulation], None]:
        def each(sim: Simulation) -> None:
            rack0 = sim.fleet.racks[0].rack_id
            serving = [d for d in sim.fleet.devices.values() if d.model and d.tpot_s > 0]
            capped = [d.tpot_s for d in serving if d.node.rack_id == rack0
                      and d.power_cap_watts < d.spec.power_limit_watts]  # fmt: skip
            others = [d.tpot_s for d in serving if d.node.rack_id != rack0]
            if 180 <= sim.fleet.t_s < 420 and capped and others:  # the feed loss, settled
                ratios.append((sum(capped) / len(capped)) / (sum(others) / len(others)))

        return each

    plain: list[float] = []
    routed: list[float] = []
    _, plain_outputs = _run(controlled=True, each_step=watch(plain), power_routing=False)
    sim, outputs = _run(controlled=True, each_step=watch(routed))
    assert plain and routed
    assert sum(plain) / len(plain) > 1.3  # what the cap alone leaves
    assert sum(routed) / len(routed) < 1.1
    assert not [c for c in sim.faults.consequences if c["what"] == "breaker_trip"]
    said = {(o.decision.controller, o.decision.reason) for o in outputs}
    assert {("power_routing", "device_capped"), ("power_routing", "caps_lifted")} <= said
    assert not any(o.decision.controller == "power_routing" for o in plain_outputs)
    weights = [o.command for o in outputs if o.decision.controller == "power_routing"]
    assert weights and all(isinstance(c, RouteCommand) and c.target.pool for c in weights)
    # after the feed is repaired the caps come off, and the weights with them
    assert sim.fleet.router.replica_weights == {}


def test_a_pool_every_cap_holds_sends_its_share_of_a_model_to_the_regions_other_pool() -> None:
    # pool-capped: rack 0 holds the region's whole A100 pool and loses most of its feed; no
    # A100 replica runs free to take a capped one's share, only the H100 pool on rack 1
    slo_s = 0.05  # llama-70b runs 43 ms on a free A100, 55 ms and more capped; 31 on an H100

    def watch(tally: dict[str, float]) -> Callable[[Simulation], None]:
        def each(sim: Simulation) -> None:  # requests served: over the SLO, their TTFT, lost
            for d in sim.fleet.devices.values():
                if d.model and d.tpot_s > 0:
                    tally["served"] += d.served_rps
                    tally["over"] += d.served_rps * (d.tpot_s > slo_s)
                    tally["ttft"] += d.served_rps * d.ttft_s
                    tally["rejected"] += d.rejected

        return each

    plain: dict[str, float] = defaultdict(float)
    routed: dict[str, float] = defaultdict(float)
    # the case is a rack whose caps hold its replicas far down: racks held to 0.92 of their
    # limits, as they were when it was written. At the production targets (0.95, 0.975)
    # the same cut caps them lighter: 0.16% of requests over the SLO without the move,
    # 0.11% with it, and the move costs TTFT (416 -> 469 ms): the pool's share moves
    # while its replicas are over the latency setpoint, which they now barely are
    run = partial(_run, controlled=True, seconds=480, scenario_file="pool-capped.yaml",
                  tpot_slo_s=slo_s, targets=(0.92, 0.96))  # fmt: skip
    _, plain_outputs = run(each_step=watch(plain), across_pools=False)
    sim, outputs = run(each_step=watch(routed))
    # what routing within the pool leaves (0.96% of requests; 1.07% while the simulator let
    # a pool whose batch cap was ever set serve a third of what it served uncapped)
    assert plain["over"] > 0.008 * plain["served"]
    assert routed["over"] < 0.6 * plain["over"], (plain, routed)
    # moved, not dropped, and not traded for a wait: no more lost, a shorter TTFT
    assert routed["rejected"] <= plain["rejected"] and routed["served"] > 0.97 * plain["served"]
    assert routed["ttft"] / routed["served"] < plain["ttft"] / plain["served"], (plain, routed)
    assert not [c for c in sim.faults.consequences if c["what"] == "breaker_trip"]
    said = Counter((o.decision.reason, o.decision.pool) for o in outputs
                   if o.decision.controller == "power_routing")  # fmt: skip
    assert said[("pool_capped", "us-east-a100")] > 0 and said[("pool_caps_lifted", "us-east-a100")]
    assert not any(o.decision.reason.startswith("pool_") for o in plain_outputs)
    moves = [o for o in outputs if o.decision.reason.startswith("pool_")]
    for o in moves:  # addressed to the pool for one model: the region's router table
        assert isinstance(o.command, RouteCommand) and verify(o.command, keys=COMMAND_KEYS)
        assert o.command.target.pool == "us-east-a100" and o.command.target.device_uuid is None
        assert o.command.model == o.decision.target and o.command.weight_ratio == pytest.approx(
            o.decision.applied, abs=1e-4
        )
    assert min(o.decision.applied or 1.0 for o in moves) < 0.5
    # after the feed is repaired the caps come off, and every share comes back
    assert sim.fleet.router.pool_weights and set(sim.fleet.router.pool_weights.values()) == {1.0}


def _speed_decisions(
    unit_s: Callable[[int], float], *, controller: str = "tpot_guard", optional: int = 0
) -> list[Decision]:
    """Two minutes of one replica's serving reports, a second apart, its TPOT at a batch of
    one ``unit_s(second)`` and its batch 64 (SLO 60 ms), ``optional`` of its 10 requests a
    second optional work: the decisions of ``controller``."""
    planner = ControlPlanner(ControlWiring(signing_key=KEY, period_s=10.0, tpot_slo_s=0.06))
    out = []
    for k in range(120):
        m = _report(k, tpot_s=unit_s(k) * 1.5, queue=0, batch=64, optional=optional)
        out += [o.decision for o in planner.serving(m) if o.decision.controller == controller]
    return out


def test_the_batch_cap_follows_a_slowdown_at_the_close_it_shows_and_not_a_spike() -> None:
    # 18 ms a token at a batch of one (TPOT 27 ms at batch 64, against a 60 ms SLO). One
    # second read 3x slow (a sensor spike), even the last of a period, moves nothing
    for spike in (57, 59):
        assert _speed_decisions(partial(lambda at, k: 0.018 * (3 if k == at else 1), spike)) == []
    # 1.4x slower from the period's last two seconds: cut at that close to the largest batch
    # under 0.95 of the SLO, 128 * (0.95 * 60 / 25.2 - 1) = 161; 256 again after it ends
    cuts = _speed_decisions(lambda k: 0.0252 if 78 <= k < 108 else 0.018)
    assert [(d.reason, d.applied, d.decided_at - START) for d in cuts] == [
        ("token_speed", 161.0, timedelta(seconds=80)),
        ("token_speed", 256.0, timedelta(seconds=110)),
    ]


def test_a_model_no_batch_cap_brings_under_the_slo_does_not_set_the_pools_cap() -> None:
    """A pool serving two models: one at 18 ms a token at a batch of one, and one at 60 ms,
    over 0.95 of the 60 ms SLO even alone (no cap helps it: routing and warming answer for
    it). The slower model's replica falls silent for a period (its share routed away) and
    comes back: that is no change of the pool's speed, and the cap stays. A slowdown of the
    other model by 1.4x cuts the cap to the largest batch that keeps it under the mark, as
    in a pool that serves it alone (161), not to the floor for the model no cap can help."""
    planner = ControlPlanner(ControlWiring(signing_key=KEY, period_s=10.0, tpot_slo_s=0.06))
    out = []
    for k in range(120):
        unit_s = 0.0252 if 78 <= k < 108 else 0.018
        reports = [_report(k, tpot_s=unit_s * 1.5, queue=0, batch=64, optional=0)]
        if not 40 <= k < 50:  # silent for one period
            slow = _report(k, tpot_s=0.060 * 1.5, queue=0, batch=64, optional=0)
            reports.append(slow.model_copy(update={"replica_id": "r2", "model": "mixtral-8x7b"}))
        for m in reports:
            out += [o.decision for o in planner.serving(m) if o.decision.controller == "tpot_guard"]
    assert [(d.reason, d.applied, d.decided_at - START) for d in out] == [
        ("token_speed", 161.0, timedelta(seconds=80)),
        ("token_speed", 256.0, timedelta(seconds=110)),
    ]


@pytest.mark.parametrize("adopted", [True, False])
def test_a_batch_cap_a_slowdown_cut_comes_back_under_the_region_s_next_owner(
    adopted: bool,
) -> None:
    """The slowdown above, the region moving to another planner at 95 s, with the cap cut to
    161: the next owner adopts the last one's levers (through JSON, as the state topic
    carries them) and gives the cap back at the same close one planner would, 110 s.
    Without the guard's memory it takes 256 for the cap in force and never sends it back:
    the pool would serve at 161 for good."""
    wiring = ControlWiring(signing_key=KEY, period_s=10.0, tpot_slo_s=0.06)
    planner = ControlPlanner(wiring)
    cuts = []
    for k in range(120):
        if k == 95:
            handed = json.loads(json.dumps(planner.held()))
            planner = ControlPlanner(wiring)
            if adopted:
                planner.adopt(handed)
        unit_s = 0.0252 if 78 <= k < 108 else 0.018
        m = _report(k, tpot_s=unit_s * 1.5, queue=0, batch=64, optional=0)
        cuts += [o.decision for o in planner.serving(m) if o.decision.controller == "tpot_guard"]
    restored = [("token_speed", 256.0, timedelta(seconds=110))] if adopted else []
    assert [(d.reason, d.applied, d.decided_at - START) for d in cuts] == [
        ("token_speed", 161.0, timedelta(seconds=80)),
        *restored,
    ]


def test_a_slowdown_cuts_the_budget_at_the_report_that_shows_it() -> None:
    # a replica at batch 64 with half its requests optional, 2.2x slower from the period's
    # last two seconds: the room at the speed now (128 * (0.9 * 60 / 39.6 - 1) = 47 of the
    # 256 the cap allows) is under the batch it runs, and the budget is cut at the second
    # slow report, before the period's end (whose mean speed is hardly slower)
    steady = _speed_decisions(lambda k: 0.018, controller="capacity", optional=5)
    slowed = _speed_decisions(
        lambda k: 0.0396 if k >= 78 else 0.018, controller="capacity", optional=5
    )
    assert steady[-1].applied is not None and steady[-1].applied > 0  # optional work admitted
    grown = [d for d in slowed if d.decided_at - START < timedelta(seconds=79)]
    same = [(d.decided_at, d.applied) for d in steady[: len(grown)]]
    assert [(d.decided_at, d.applied) for d in grown] == same  # until the slowdown shows
    after = [d for d in slowed if d.decided_at - START >= timedelta(seconds=79)]
    assert (after[0].decided_at - START, after[0].reason) == (timedelta(seconds=79), "token_speed")
    assert after[0].applied is not None and grown[-1].applied is not None
    assert after[0].applied < grown[-1].applied, (after[0].message, grown[-1].message)
    # the PID and the windows step at the period's end as ever, from the budget cut to: a
    # rise past it waits out the stabilisation window, as after a cut at a close
    assert all(
        d.applied is not None and d.applied <= after[0].applied
        for d in after[1:]
        if d.decided_at - START < timedelta(seconds=79 + 120)
    ), [(d.decided_at, d.applied) for d in after]
    # 2.8x slower from the period's last second: its close reads one slow report (a sensor
    # spike's worth), so the cut comes at the next period's second report, 2 s after the
    # slowdown began, not at that period's end, 11 s after; the room at 50 ms (a batch of
    # 10) holds less than the baseline's 32 sequences: no optional work
    late = _speed_decisions(lambda k: 0.05 if k >= 79 else 0.018, controller="capacity", optional=5)
    cut = next(d for d in late if d.reason == "token_speed")
    assert (cut.decided_at - START, cut.reason, cut.applied) == (
        timedelta(seconds=81),
        "token_speed",
        0.0,
    )
    # one report 3x slow, first, in the middle or last of a period, cuts nothing early
    for spike in (70, 71, 75, 79):
        odd = _speed_decisions(
            partial(lambda at, k: 0.018 * (3 if k == at else 1), spike),
            controller="capacity", optional=5,
        )  # fmt: skip
        assert all(d.reason != "token_speed" for d in odd), spike


def test_node_tick_envelopes_make_the_decisions_their_flat_samples_make() -> None:
    """The control role feeds each envelope whole (:meth:`ControlPlanner.tick`); a planner
    fed the same envelopes' samples one by one, as views, decides the same, in the loop
    (the envelopes' planner's commands applied to the fleet)."""
    scenario = load_scenario(SCENARIOS / "pdu-overload.yaml")
    demand = scenario.demand.model_copy(update={"batch_ratio": 0.1})
    sim = Simulation(scenario.model_copy(update={"demand": demand}), start=START)
    dispatcher = build_dispatcher(SimControl(sim.fleet), COMMAND_KEYS, CollectorRegistry())

    def planner() -> ControlPlanner:
        ids = itertools.count()
        wiring = ControlWiring(signing_key=KEY, period_s=2.0, tpot_slo_s=0.08)
        return ControlPlanner(wiring, new_id=lambda: uuid.UUID(int=next(ids)))

    whole, flat = planner(), planner()
    made: list[ControlOutput] = []
    for n in range(int(300 / sim.interval_s)):
        step: list[ControlOutput] = []
        viewed: list[ControlOutput] = []
        for spec, value in pack(sim.tick(n)):
            if isinstance(value, AcceleratorTick | ServingTick):
                step += whole.tick(value)
                for view in decode_samples(encode(value), spec.value_type):
                    viewed += flat.feed(view)
            else:
                step += whole.feed(value)
                viewed += flat.feed(value)
        assert [o.decision for o in step] == [o.decision for o in viewed], n
        assert [o.command for o in step] == [o.command for o in viewed], n
        for o in step:
            if o.command is not None:
                dispatcher.handle(o.command, now=sim.now, received_at=sim.now)
        made += step
    controllers = Counter(o.decision.controller for o in made if o.command is not None)
    assert {"power", "capacity"} <= set(controllers), controllers  # caps and budgets both


def _budgets(moved_at: int | None, *, adopted: bool) -> list[tuple[int, float]]:
    """400 s of one replica serving half optional work well within its SLO: the optional
    budgets decided (second, budget), the region moving to another planner at ``moved_at``
    (mid-period), adopted or not."""
    wiring = ControlWiring(signing_key=KEY, period_s=10.0, tpot_slo_s=0.06)
    planner = ControlPlanner(wiring)
    out = []
    for k in range(400):
        if k == moved_at:
            handed = json.loads(json.dumps(planner.held()))
            planner = ControlPlanner(wiring)
            if adopted:
                planner.adopt(handed)
        for o in planner.serving(_report(k, tpot_s=0.027, queue=0, batch=64, optional=5)):
            if o.decision.controller == "capacity" and o.decision.applied is not None:
                at = int((o.decision.decided_at - START).total_seconds())
                out.append((at, round(o.decision.applied, 4)))
    return out


def test_a_region_s_next_owner_goes_on_with_its_optional_work_budget() -> None:
    """Moved mid-period with 0.79 of the pool's capacity in optional work: adopted, the next
    owner decides every budget one planner decides; without the controller's memory it
    starts from nothing and gives most of it back for two and a half minutes."""
    alone = _budgets(None, adopted=False)
    assert alone[-1][1] > 0.8
    assert _budgets(205, adopted=True) == alone
    after = [budget for at, budget in _budgets(205, adopted=False) if 205 < at <= 360]
    assert after[0] <= 0.05 and max(after) < 0.79


@pytest.mark.parametrize(
    ("section", "bad"),
    [
        ("budgets", {"budget": 3.0}),
        ("budgets", {"baselines": [["yesterday", 0.1]]}),
        ("budgets", {"fresh_at": "2026-12-01T00:00:00"}),  # no zone
        ("batch_guards", {"target": 100_000}),
        ("batch_guards", {"recent": "x"}),
    ],
)
def test_a_controller_memory_of_another_shape_or_out_of_range_is_refused(
    section: str, bad: dict[str, object]
) -> None:
    wiring = ControlWiring(signing_key=KEY, period_s=10.0, tpot_slo_s=0.06)
    planner = ControlPlanner(wiring)
    for k in range(30):
        planner.serving(_report(k, tpot_s=0.027, queue=0, batch=64, optional=5))
    held = json.loads(json.dumps(planner.held()))
    memory = held[section]["us-east-h100"]
    for wrong in ({**memory, **bad}, bad):  # a field wrong; most fields missing
        with pytest.raises(ValueError):
            ControlPlanner(wiring).adopt({**held, section: {"us-east-h100": wrong}})


def test_a_second_feed_lost_within_a_period_is_acted_on_before_the_period_ends() -> None:
    # four devices on one rack drawing 600 W each; 10-s periods. At second 11 the limit
    # falls to 2,450 W (the draw is over 0.975 of it): the rack closes early and sheds. At
    # second 14 a second feed goes, 2,000 W: the draw is now over the limit itself, and a
    # breaker's trip clock (seconds) would run out before the period's end at 20
    racks = RackPlanner(ControlWiring(signing_key=KEY, period_s=10.0, tpot_slo_s=0.08),
                        rooms=dict)  # fmt: skip
    caps = {f"gpu-{i}": 700.0 for i in range(4)}
    shed_at: dict[int, int] = {}
    for t in range(20):
        at = START + timedelta(seconds=t)
        limit = 2700.0 if t < 11 else 2450.0 if t < 14 else 2000.0
        draws = {u: min(600.0, cap) for u, cap in caps.items()}
        for i, (u, draw) in enumerate(draws.items()):
            racks.accelerator(AcceleratorTelemetry(
                event_id=uuid.uuid4(), observed_at=at, node_id=f"node-{i}", device_uuid=u,
                device_index=0, accelerator_type=AcceleratorType.H100, region="r",
                pod_id="pod-0", rack_id="rack-0", pdu_id="pdu-rack-0",
                power_usage_watts=draw, power_limit_watts=caps[u], power_limit_min_watts=200.0,
                power_limit_max_watts=700.0,
            ))  # fmt: skip
        for o in racks.pdu(PduReading(
            event_id=uuid.uuid4(), observed_at=at, pdu_id="pdu-rack-0", rack_id="rack-0",
            pod_id="pod-0", region="r", phase=PduPhase.L1, power_watts=sum(draws.values()),
            capacity_watts=limit, breaker_limit_watts=limit,
        )):  # fmt: skip
            c = o.command
            if isinstance(c, ThrottleCommand) and c.action is ThrottleAction.POWER_CAP:
                assert c.target.device_uuid is not None and c.power_limit_watts is not None
                caps[c.target.device_uuid] = c.power_limit_watts
                shed_at[t] = shed_at.get(t, 0) + 1
    assert 11 in shed_at and 14 in shed_at, shed_at
    # once under: nothing more that period (the caps in flight are what the draw shows)
    assert max(shed_at) == 14
    assert sum(min(600.0, cap) for cap in caps.values()) <= PowerConfig().target_ratio * 2000.0
