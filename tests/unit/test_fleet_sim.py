"""The simulated fleet's physics and its answers to commands, step by step (no IO)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any, TypeVar

import pytest

from agents.executors.executors import NodeExecutor, RouterExecutor, Warmer
from agents.executors.gate import PermanentActuatorError
from agents.sim.control import SimControl
from agents.sim.hardware import MODELS
from agents.sim.scenario import DemandSpec, FaultKind, FaultSpec, FleetSpec, Scenario, TargetSpec
from agents.sim.simulation import Simulation
from agents.sim.state import Device
from agents.sim.telemetry import Record
from schemas.codec import encode
from schemas.commands import (
    ClockMode,
    Command,
    RouteAction,
    RouteCommand,
    Target,
    ThrottleAction,
    ThrottleCommand,
    WarmAction,
    WarmCommand,
)
from schemas.dcgm import CLOCKS_HW_SLOWDOWN, CLOCKS_SW_POWER_CAP
from schemas.events import AcceleratorTelemetry, Demand, NodeHealth, ServingMetrics
from tests.factories import START


def _sim(*faults: FaultSpec, nodes: int = 10, seed: int = 7, load: float = 0.55) -> Simulation:
    scenario = Scenario(
        fleet=FleetSpec(nodes=nodes, seed=seed),
        faults=faults,
        demand=DemandSpec(kind="synthetic", load_ratio=load),
    )
    return Simulation(scenario, start=START)


C = TypeVar("C", bound=Command)


def _cmd(cls: type[C], **fields: Any) -> C:
    """A valid command; the executors here are called directly, past the gate."""
    fields = {k: v for k, v in fields.items() if v is not None}
    return cls(
        command_id=uuid.uuid4(),
        issued_at=START,
        expires_at=START + timedelta(hours=1),
        issuer="test",
        reason="test",
        **fields,
    )


def _run(sim: Simulation, steps: int) -> list[list[Record]]:
    return [sim.tick(n) for n in range(steps)]


def _samples(ticks: list[list[Record]], uuid: str) -> list[AcceleratorTelemetry]:
    return [
        v
        for tick in ticks
        for _, v in tick
        if isinstance(v, AcceleratorTelemetry) and v.device_uuid == uuid
    ]


def _serving(ticks: list[list[Record]], uuid: str) -> list[ServingMetrics]:
    return [
        v
        for tick in ticks
        for _, v in tick
        if isinstance(v, ServingMetrics) and v.replica_id.startswith(uuid + "/")
    ]


def _peer(sim: Simulation, dev: Device) -> Device:
    return next(
        d
        for d in sim.fleet.devices.values()
        if d is not dev and d.spec.kind == dev.spec.kind and d.model == dev.model
    )


def test_same_seed_same_run_and_another_seed_another() -> None:
    spike = FaultSpec(
        kind=FaultKind.ECC_STORM,
        target=TargetSpec(node=0, device=1),
        start_s=5,
        duration_s=60,
        params={"lead_s": 20},
    )
    a = [encode(v) for tick in _run(_sim(spike), 40) for _, v in tick]
    b = [encode(v) for tick in _run(_sim(spike), 40) for _, v in tick]
    c = [encode(v) for tick in _run(_sim(spike, seed=8), 40) for _, v in tick]
    assert a == b
    assert a != c


def test_every_family_every_step_and_nulls_for_what_a_type_cannot_report() -> None:
    sim = _sim()
    tick = sim.tick(0)
    kinds = {type(v) for _, v in tick}
    assert {AcceleratorTelemetry, NodeHealth, ServingMetrics, Demand} <= kinds
    mtia = next(
        v for _, v in tick if isinstance(v, AcceleratorTelemetry) and v.accelerator_type == "MTIA"
    )
    assert mtia.xid_last is None and mtia.memory_temp_celsius is None
    assert mtia.nvlink_errors_total is None and mtia.ecc_sbe_volatile_total is not None
    h100 = next(
        v for _, v in tick if isinstance(v, AcceleratorTelemetry) and v.accelerator_type == "H100"
    )
    assert h100.nvlink_errors_total == 0 and h100.memory_temp_celsius is not None


def test_drain_moves_load_off_the_device_and_its_telemetry_shows_it() -> None:
    sim = _sim()
    dev = sim.fleet.devices["node-00000-gpu0"]
    before = _run(sim, 20)
    assert min(s.gpu_util_ratio or 0 for s in _samples(before, dev.uuid)[-5:]) > 0.2
    peer = _peer(sim, dev)
    peer_rps = peer.offered_rps
    command = _cmd(
        RouteCommand,
        target=Target(device_uuid=dev.uuid),
        action=RouteAction.DRAIN,
        weight_ratio=None,
    )
    NodeExecutor(SimControl(sim.fleet)).apply(command, now=sim.fleet.now)
    after = _run(sim, 10)
    assert dev.offered_rps == 0.0
    assert peer.offered_rps > peer_rps  # its share went to the others
    tail = _samples(after, dev.uuid)[-3:]
    assert all(s.gpu_util_ratio == 0.0 for s in tail)
    assert all(m.requests == 0 for m in _serving(after, dev.uuid)[-3:])


def test_deweight_restore_and_router_ejection() -> None:
    sim = _sim()
    control = SimControl(sim.fleet)
    dev = sim.fleet.devices["node-00000-gpu0"]
    _run(sim, 3)
    full = dev.offered_rps
    NodeExecutor(control).apply(
        _cmd(
            RouteCommand,
            target=Target(device_uuid=dev.uuid),
            action=RouteAction.DEWEIGHT,
            weight_ratio=0.5,
        ),
        now=sim.fleet.now,
    )
    _run(sim, 1)
    assert dev.offered_rps == pytest.approx(full * 0.5, rel=0.25)
    router = RouterExecutor(control)
    eject = _cmd(
        RouteCommand,
        target=Target(pool=dev.pool, device_uuid=dev.uuid),
        action=RouteAction.QUARANTINE,
        model=None,
    )
    assert "ejected 1" in router.apply(eject, now=sim.fleet.now)
    _run(sim, 1)
    assert dev.offered_rps == 0.0
    assert control.table()["routes"][dev.model][0]["ejected"] is True
    router.apply(eject.model_copy(update={"action": RouteAction.RESTORE}), now=sim.fleet.now)
    NodeExecutor(control).apply(
        _cmd(
            RouteCommand,
            target=Target(device_uuid=dev.uuid),
            action=RouteAction.RESTORE,
            weight_ratio=None,
        ),
        now=sim.fleet.now,
    )
    _run(sim, 1)
    assert dev.offered_rps == pytest.approx(full, rel=0.25)


def test_pool_weight_zero_sends_a_models_traffic_elsewhere() -> None:
    sim = _sim()
    _run(sim, 2)
    dev = sim.fleet.devices["node-00000-gpu0"]
    assert dev.model is not None
    cmd = _cmd(
        RouteCommand,
        target=Target(pool=dev.pool),
        action=RouteAction.DRAIN,
        model=dev.model,
        weight_ratio=None,
    )
    RouterExecutor(SimControl(sim.fleet)).apply(cmd, now=sim.fleet.now)
    _run(sim, 1)
    in_pool = [d for d in sim.fleet.devices.values() if d.pool == dev.pool and d.model == dev.model]
    assert in_pool and all(d.offered_rps == 0.0 for d in in_pool)
    assert sim.fleet.unserved == {}  # the model is still served by other pools


def test_power_cap_bounds_power_and_slows_serving() -> None:
    sim = _sim(load=0.9)
    dev = sim.fleet.devices["node-00000-gpu0"]  # H100, 700 W board limit
    before = _run(sim, 30)
    uncapped_tpot = dev.tpot_s
    assert max(s.power_usage_watts or 0 for s in _samples(before, dev.uuid)) > 400
    control = SimControl(sim.fleet)
    cap = _cmd(
        ThrottleCommand,
        target=Target(device_uuid=dev.uuid),
        action=ThrottleAction.POWER_CAP,
        power_limit_watts=300.0,
    )
    NodeExecutor(control).apply(cap, now=sim.fleet.now)
    after = _samples(_run(sim, 30), dev.uuid)
    assert all((s.power_usage_watts or 0) <= 300 + 10 for s in after[-20:])
    assert all(s.power_limit_watts == 300 for s in after)
    assert after[-1].clock_throttle_reasons is not None
    assert after[-1].clock_throttle_reasons & CLOCKS_SW_POWER_CAP
    assert dev.tpot_s > uncapped_tpot * 1.1


def test_a_batch_cap_costs_throughput_as_a_batch_does_and_one_at_the_ceiling_costs_none() -> None:
    # saturated devices: what each serves is what its cap lets it, relative to uncapped
    served: dict[int | None, float] = {}
    for cap in (None, 256, 128):
        sim = _sim(load=1.5)
        if cap is not None:
            for pool in {d.pool for d in sim.fleet.devices.values() if d.pool}:
                SimControl(sim.fleet).set_pool_lever(pool, "batch_size", cap)
        _run(sim, 20)
        served[cap] = sum(d.served_rps for d in sim.fleet.devices.values())
    assert served[256] == pytest.approx(served[None], rel=1e-9)
    # a batch of b carries b / (1 + b / 128) sequences per token time: 64 at 128, 85.3 at 256
    assert served[128] == pytest.approx(served[None] * 64.0 / (256.0 / 3.0), rel=0.05)


def test_power_cap_outside_the_driver_range_is_refused() -> None:
    sim = _sim()
    cap = _cmd(
        ThrottleCommand,
        target=Target(device_uuid="node-00000-gpu0"),
        action=ThrottleAction.POWER_CAP,
        power_limit_watts=50.0,
    )
    with pytest.raises(PermanentActuatorError, match=r"outside 200\.\.700 W"):
        NodeExecutor(SimControl(sim.fleet)).apply(cap, now=sim.fleet.now)


def test_low_clock_mode_lowers_clocks_and_power() -> None:
    sim = _sim()
    dev = sim.fleet.devices["node-00001-gpu0"]
    _run(sim, 20)
    watts = dev.power_watts
    cmd = _cmd(
        ThrottleCommand,
        target=Target(node_id="node-00001"),
        action=ThrottleAction.CLOCK_MODE,
        clock_mode=ClockMode.LOW,
    )
    detail = NodeExecutor(SimControl(sim.fleet)).apply(cmd, now=sim.fleet.now)
    assert detail.startswith("8 device(s)")
    samples = _samples(_run(sim, 5), dev.uuid)
    assert samples[-1].sm_clock_mhz == pytest.approx(dev.spec.sm_clock_mhz * 0.7, rel=0.01)
    assert dev.power_watts < watts


def test_thermal_runaway_heats_throttles_and_recovers() -> None:
    fault = FaultSpec(
        kind=FaultKind.THERMAL_RUNAWAY, target=TargetSpec(node=1), start_s=10, duration_s=300
    )
    sim = _sim(fault, load=0.7)
    dev = sim.fleet.devices["node-00001-gpu0"]
    peer_node = sim.fleet.devices["node-00006-gpu0"]  # also a B200, healthy
    during = _samples(_run(sim, 300), dev.uuid)
    assert max(s.gpu_temp_celsius or 0 for s in during) >= dev.spec.slowdown_celsius
    assert any((s.clock_throttle_reasons or 0) & CLOCKS_HW_SLOWDOWN for s in during)
    assert peer_node.temp_celsius < dev.spec.slowdown_celsius - 10
    _run(sim, 300)
    assert dev.temp_celsius < dev.spec.slowdown_celsius - 10
    assert dev.thermal_clock == 1.0


def test_ecc_storm_climbs_then_ends_in_a_double_bit_fault() -> None:
    fault = FaultSpec(
        kind=FaultKind.ECC_STORM,
        target=TargetSpec(node=0, device=1),
        start_s=10,
        duration_s=400,
        params={"lead_s": 200},
    )
    sim = _sim(fault)
    dev = sim.fleet.devices["node-00000-gpu1"]
    samples = _samples(_run(sim, 300), dev.uuid)
    sbe = [s.ecc_sbe_volatile_total or 0 for s in samples]
    first, second = sbe[110] - sbe[10], sbe[210] - sbe[110]
    assert second > 3 * first > 0  # the rate climbs
    dbe_at = next(i for i, s in enumerate(samples) if s.ecc_dbe_volatile_total)
    assert dbe_at == 209  # step 210 (t=210 s): start 10 s + lead 200 s
    assert samples[dbe_at].xid_last == 48
    assert samples[dbe_at].remapped_rows_total == 1
    assert dev.failed
    assert sim.faults.consequences[0]["what"] == "double_bit_ecc"


def test_failed_device_errors_until_its_route_breaker_opens_then_only_probes() -> None:
    fault = FaultSpec(
        kind=FaultKind.ECC_STORM,
        target=TargetSpec(node=0, device=1),
        start_s=1,
        duration_s=100,
        params={"lead_s": 5},
    )
    sim = _sim(fault)
    served = _serving(_run(sim, 40), "node-00000-gpu1")
    failing = [m for m in served if m.errors > 0]
    assert failing and all(m.errors >= m.requests for m in failing)  # every request errors
    # five failed steps open the breaker: from then on the route carries only probes
    first = served.index(failing[0])
    assert sum(1 for m in served[first + 6 :] if m.requests > 0) < len(served[first + 6 :]) / 2
    router = sim.fleet.router
    assert router.breakers["node-00000-gpu1"].state.value in ("open", "half_open")
    # its errors were retried on the model's other replicas, as the budget allowed
    errors = sum(m.errors for m in served)
    assert 0 < router.retried_total <= errors


def test_grey_slowdown_raises_tpot_with_every_counter_clean() -> None:
    fault = FaultSpec(
        kind=FaultKind.GREY_SLOWDOWN,
        target=TargetSpec(node=2, device=3),
        start_s=5,
        duration_s=100,
        params={"slowdown_ratio": 0.25},
    )
    sim = _sim(fault)
    ticks = _run(sim, 60)
    dev = sim.fleet.devices["node-00002-gpu3"]
    peer = _peer(sim, dev)
    mine, theirs = _serving(ticks, dev.uuid)[-10:], _serving(ticks, peer.uuid)[-10:]
    ratio = sum(m.tpot_p50_s or 0 for m in mine) / sum(m.tpot_p50_s or 0 for m in theirs)
    assert 1.15 < ratio < 1.4
    samples = _samples(ticks, dev.uuid)
    assert all(s.ecc_dbe_volatile_total == 0 and s.xid_last is None for s in samples)
    assert all(s.clock_throttle_reasons == 0 for s in samples[-10:])
    probes = [
        p
        for tick in ticks[-10:]  # probes run every 10 steps
        for _, v in tick
        if isinstance(v, NodeHealth)
        for p in v.probes
        if p.device_uuid == dev.uuid
    ]
    assert probes and probes[0].passed and probes[0].expected_ratio is not None
    assert probes[0].expected_ratio < 0.9


def test_flapping_xid_comes_and_goes() -> None:
    fault = FaultSpec(
        kind=FaultKind.FLAPPING_XID,
        target=TargetSpec(node=5, device=4),
        start_s=1,
        duration_s=400,
        params={"period_s": 10},
    )
    sim = _sim(fault)
    xids = [s.xid_last for s in _samples(_run(sim, 300), "node-00005-gpu4")]
    assert 10 <= xids.count(31) <= 60
    assert xids.count(None) > 200


def test_xid_fault_on_a_device_that_reports_none_is_a_scenario_error() -> None:
    fault = FaultSpec(
        kind=FaultKind.FLAPPING_XID, target=TargetSpec(node=3, device=0), start_s=1, duration_s=10
    )
    with pytest.raises(ValueError, match="MI300X devices report no XIDs"):
        _sim(fault)


def test_node_crash_stops_heartbeats_and_moves_traffic_then_reboots() -> None:
    fault = FaultSpec(
        kind=FaultKind.NODE_CRASH, target=TargetSpec(node=4), start_s=10, duration_s=20
    )
    sim = _sim(fault)
    ticks = _run(sim, 120)
    beats = [
        (i, v.heartbeat_seq)
        for i, t in enumerate(ticks)
        for _, v in t
        if isinstance(v, NodeHealth) and v.node_id == "node-00004"
    ]
    steps = [i for i, _ in beats]
    assert set(range(9, 29)).isdisjoint(steps)  # silent from t=10 s to t=29 s
    assert beats[-1][1] > beats[8][1]  # the sequence carries on after the reboot
    node = sim.fleet.node("node-00004")
    assert node is not None and all(d.serving(sim.fleet.t_s) for d in node.devices if d.model)


def test_pdu_overload_trips_the_breaker_unless_the_rack_is_capped() -> None:
    fault = FaultSpec(
        kind=FaultKind.PDU_OVERLOAD, target=TargetSpec(rack=0), start_s=30, duration_s=200
    )
    tripped = _sim(fault, load=0.7)
    _run(tripped, 60)
    assert tripped.fleet.racks[0].tripped
    assert not any(
        isinstance(v, NodeHealth) and v.rack_id == "rack-0000" for _, v in tripped.tick(60)
    )

    capped = _sim(fault, load=0.7)
    control = SimControl(capped.fleet)
    for node in capped.fleet.racks[0].nodes:
        for d in node.devices:
            control.set_power_limit(d.uuid, d.spec.min_power_limit_watts)
    _run(capped, 200)
    rack = capped.fleet.racks[0]
    assert not rack.tripped and rack.power_watts <= rack.effective_limit_watts


def test_demand_spike_multiplies_regional_demand() -> None:
    fault = FaultSpec(
        kind=FaultKind.DEMAND_SPIKE,
        target=TargetSpec(region="eu-west"),
        start_s=10,
        duration_s=10,
        params={"factor": 3.0},
    )
    sim = _sim(fault, nodes=16)
    _run(sim, 9)
    before = sim.fleet.offered[("qwen-7b", "eu-west")]
    us_before = sim.fleet.offered[("qwen-7b", "us-east")]
    _run(sim, 1)
    assert sim.fleet.offered[("qwen-7b", "eu-west")] == pytest.approx(3 * before, rel=0.05)
    assert sim.fleet.offered[("qwen-7b", "us-east")] == pytest.approx(us_before, rel=0.05)


def test_cold_model_is_unserved_until_a_warmer_loads_it() -> None:
    fault = FaultSpec(
        kind=FaultKind.COLD_MODEL,
        target=TargetSpec(model="gemma-27b"),
        start_s=1,
        duration_s=500,
        params={"rps": 4},
    )
    sim = _sim(fault)
    _run(sim, 5)
    assert sim.fleet.unserved[("gemma-27b", "us-east")] == pytest.approx(4.0)
    warm = _cmd(
        WarmCommand,
        target=Target(pool="us-east-h100"),
        action=WarmAction.WARM,
        model="gemma-27b",
        replicas=2,
    )
    detail = Warmer(SimControl(sim.fleet)).apply(warm, now=sim.fleet.now)
    load_s = sim.fleet.devices["node-00000-gpu6"].spec.load_time_s(MODELS["gemma-27b"])
    assert detail == f"loading gemma-27b on 2 device(s) in us-east-h100, serving in {load_s:.0f}s"
    _run(sim, int(load_s) - 1)
    assert ("gemma-27b", "us-east") in sim.fleet.unserved  # still loading
    ticks = _run(sim, 3)
    assert ("gemma-27b", "us-east") not in sim.fleet.unserved
    assert any(isinstance(v, ServingMetrics) and v.model == "gemma-27b" for _, v in ticks[-1])


def test_cool_unloads_the_idlest_replicas() -> None:
    sim = _sim()
    _run(sim, 3)
    control = SimControl(sim.fleet)
    loaded = [
        d for d in sim.fleet.devices.values() if d.pool == "us-east-h100" and d.model == "qwen-7b"
    ]
    cool = _cmd(
        WarmCommand,
        target=Target(pool="us-east-h100"),
        action=WarmAction.COOL,
        model="qwen-7b",
        replicas=1,
    )
    assert Warmer(control).apply(cool, now=sim.fleet.now).startswith("unloaded qwen-7b from 1")
    assert sum(d.model == "qwen-7b" for d in loaded) == len(loaded) - 1


def test_the_fleet_clock_runs_in_steps() -> None:
    sim = _sim()
    _run(sim, 5)
    assert sim.fleet.now == START + timedelta(seconds=5)
