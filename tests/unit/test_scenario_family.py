"""Scenario families, the shared conditions (rollout, power brake, hot inlet air), the
telemetry path's noise, and the family evaluation's aggregate."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiokafka.partitioner import DefaultPartitioner

from agents.sim.family import Family, draw_scenario, load_family, parse_seeds
from agents.sim.noise import TelemetryNoise, partition_of
from agents.sim.scenario import (
    FaultKind,
    FaultSpec,
    FleetSpec,
    NoiseSpec,
    Scenario,
    ScenarioError,
    TargetSpec,
)
from agents.sim.simulation import Simulation
from evaluations.fault_scoring import aggregate, faults_from_truth
from schemas.dcgm import CLOCKS_HW_POWER_BRAKE
from schemas.events import AcceleratorTelemetry as Telemetry
from schemas.topics import ACCELERATOR
from tests.factories import START

REPO = Path(__file__).resolve().parents[2]
FAMILIES = sorted((REPO / "scenarios" / "families").glob("*.yaml"))


@pytest.mark.parametrize("path", FAMILIES, ids=lambda p: p.stem)
def test_each_seed_draws_one_scenario_that_binds_and_runs(path: Path) -> None:
    family = load_family(path)
    first = draw_scenario(family, 7)
    assert draw_scenario(family, 7) == first  # the same scenario on any machine
    assert draw_scenario(family, 8) != first
    kinds: set[FaultKind] = set()
    for seed in range(1, 13):
        scenario = draw_scenario(family, seed)
        sim = Simulation(scenario, start=START)  # binding checks every target
        by_node: dict[int, set[tuple[str, float]]] = {}
        for f in scenario.faults:  # drawn and sampled alike: one fault per node
            if f.target.node is not None:
                by_node.setdefault(f.target.node, set()).add((f.kind.value, f.start_s))
        assert all(len(draws) == 1 for draws in by_node.values()), by_node
        kinds |= {f.spec.kind for f in sim.faults.resolved}
        assert sim.ticks == round(family.duration_s)
    sim.tick(0)
    assert kinds >= {spec.kind for spec in family.faults}  # every kind it declares, drawn


def test_draws_stay_in_their_ranges_and_never_share_a_device() -> None:
    family = Family.model_validate(
        {
            "name": "t",
            "duration_s": 600,
            "fleet": {"nodes": [4, 6]},
            "faults": [
                {"kind": "grey_slowdown", "count": [3, 5], "devices": 2,
                 "params": {"slowdown_ratio": [0.1, 0.2]}, "duration_s": [100, 200]},
            ],
            "noise": {"clock_skew_s": [0, 2]},
        }
    )  # fmt: skip
    skews = []
    for seed in range(20):
        s = draw_scenario(family, seed)
        assert 4 <= s.fleet.nodes <= 6
        assert 6 <= len(s.faults) <= 10  # two devices of one node per fault
        devices = [(f.target.node, f.target.device) for f in s.faults]
        assert len(set(devices)) == len(devices)
        for f in s.faults:
            assert 0.1 <= f.param("slowdown_ratio") <= 0.2
            assert 100 <= f.duration_s <= 200 and f.end_s <= 600
        skews.append(s.noise.clock_skew_s)
    assert all(0 <= x <= 2 for x in skews)
    assert any(x % 1 for x in skews)  # a range of seconds is drawn as seconds, not whole ones


def test_a_family_says_what_is_wrong_with_it(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_text("name: f\nfaults: [{kind: grey_slowdown, params: {speed: 2}}]\n")
    with pytest.raises(ScenarioError, match=r"unknown params \['speed'\]"):
        load_family(path)
    path.write_text("name: f\nflet: {nodes: 3}\n")
    with pytest.raises(ScenarioError, match="flet"):
        load_family(path)


@pytest.mark.parametrize(
    ("text", "seeds"),
    [("3", [3]), ("1-3", [1, 2, 3]), ("1-2, 9 ,20-21", [1, 2, 9, 20, 21])],
)
def test_seed_lists(text: str, seeds: list[int]) -> None:
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "5-1", "a-b", "1-"])
def test_bad_seed_lists_say_why(text: str) -> None:
    with pytest.raises(ScenarioError, match="seeds"):
        parse_seeds(text)


def _sim(*faults: FaultSpec, nodes: int = 8, noise: NoiseSpec | None = None) -> Simulation:
    scenario = Scenario(
        duration_s=600, fleet=FleetSpec(nodes=nodes, seed=3), faults=faults,
        noise=noise or NoiseSpec(),
    )  # fmt: skip
    return Simulation(scenario, start=START)


def test_a_rollout_slows_its_cohort_and_nothing_else() -> None:
    rollout = FaultSpec(
        kind=FaultKind.ROLLOUT_SLOWDOWN, target=TargetSpec(accelerator_type="A100"),
        start_s=0, duration_s=600, params={"slowdown_ratio": 0.15},
    )  # fmt: skip
    sim = _sim(rollout)
    sim.tick(0)
    for dev in sim.fleet.devices.values():
        slowed = dev.spec.kind.value == "A100"
        assert dev.health == pytest.approx(1 / 1.15 if slowed else 1.0)
    # a chip of that type going slow on its own is slower still, whichever fault comes first
    a100 = next(d for d in sim.fleet.devices.values() if d.spec.kind.value == "A100")
    node = int(a100.node.node_id.split("-")[1])
    grey = FaultSpec(
        kind=FaultKind.GREY_SLOWDOWN, target=TargetSpec(node=node, device=a100.index),
        start_s=0, duration_s=600, params={"slowdown_ratio": 0.2},
    )  # fmt: skip
    for faults in ((rollout, grey), (grey, rollout)):
        both = _sim(*faults)
        both.tick(0)
        assert both.fleet.devices[a100.uuid].health == pytest.approx(1 / (1.15 * 1.2))
    by_model = _sim(
        FaultSpec(
            kind=FaultKind.ROLLOUT_SLOWDOWN, target=TargetSpec(model="qwen-7b", region="us-east"),
            start_s=0, duration_s=600, params={"slowdown_ratio": 0.1},
        )
    )  # fmt: skip
    for n in range(3):
        by_model.tick(n)
    plain = _sim()
    for n in range(3):
        plain.tick(n)
    for uuid, dev in by_model.fleet.devices.items():
        slowed = dev.model == "qwen-7b" and dev.node.region == "us-east"
        assert dev.health == 1.0  # the chip is sound: its probes say so
        if dev.model is not None and dev.served_rps > 0:
            ratio = dev.tpot_s / plain.fleet.devices[uuid].tpot_s  # its batch grows as well
            assert ratio > 1.09 if slowed else ratio == pytest.approx(1.0, rel=0.02)


def test_a_power_brake_holds_a_racks_clocks_and_says_so() -> None:
    brake = FaultSpec(
        kind=FaultKind.POWER_BRAKE, target=TargetSpec(rack=1), start_s=0, duration_s=600,
        params={"clock_ratio": 0.6},
    )  # fmt: skip
    sim = _sim(brake)
    events = sim.tick(0)
    for dev in sim.fleet.devices.values():
        if dev.node.rack_id == "rack-0001":
            assert dev.clock_ratio <= 0.6
        else:
            assert dev.clock_ratio > 0.6
    samples = [e for spec, e in events if spec is ACCELERATOR]
    reasons = {
        e.node_id: e.clock_throttle_reasons or 0 for e in samples if isinstance(e, Telemetry)
    }
    assert reasons["node-00004"] & CLOCKS_HW_POWER_BRAKE
    assert not reasons["node-00000"] & CLOCKS_HW_POWER_BRAKE


def test_hot_inlet_air_heats_one_rack() -> None:
    heat = FaultSpec(
        kind=FaultKind.INLET_HEAT, target=TargetSpec(rack=0), start_s=0, duration_s=600,
        params={"inlet_rise_celsius": 12},
    )  # fmt: skip
    hot, cool = _sim(heat), _sim()
    for n in range(120):
        hot.tick(n)
        cool.tick(n)
    for uuid, dev in hot.fleet.devices.items():
        rise = dev.temp_celsius - cool.fleet.devices[uuid].temp_celsius
        if dev.node.rack_id == "rack-0000":
            assert rise > 8
        else:
            assert abs(rise) < 1


def test_noise_drops_copies_skews_and_delays_events() -> None:
    nodes = [f"n{i}" for i in range(40)]

    class Event:
        def __init__(self, node_id: str, at: Any) -> None:
            self.node_id, self.observed_at = node_id, at

        def model_copy(self, update: dict[str, Any]) -> Event:
            return Event(self.node_id, update["observed_at"])

    spec = NoiseSpec(
        drop_ratio=0.1, duplicate_ratio=0.1, skewed_nodes_ratio=0.5, clock_skew_s=2.0,
        delayed_partitions=3, partitions=12, delay_s=3.0, seed=4,
    )  # fmt: skip
    noise = TelemetryNoise(spec, nodes)
    assert 5 <= len(noise.skew) <= 35 and len(noise.lagging) == 3
    assert noise.delayed == {n for n in nodes if partition_of(n, 12) in noise.lagging}
    assert noise.delayed  # 40 nodes over 12 partitions: three of them hold some
    assert all(abs(s.total_seconds()) <= 2.0 for s in noise.skew.values())
    delivered: dict[int, list[Event]] = {}
    for t in range(20):
        records = [(None, Event(n, START + timedelta(seconds=t))) for n in nodes]
        delivered[t] = [e for _, e in noise.apply(records, t_s=float(t))]
    every = [e for es in delivered.values() for e in es]
    # about 0.9 * 1.1 of 800 sent, less what is still held back at the end
    assert 600 < len(every) < 900
    for t, events in delivered.items():
        for e in events:
            sent_at = e.observed_at - noise.skew.get(e.node_id, timedelta(0))
            late = t - (sent_at - START).total_seconds()
            assert late == (3.0 if e.node_id in noise.delayed else 0.0)
    quiet = TelemetryNoise(NoiseSpec(), nodes)
    records = [(None, Event(n, START)) for n in nodes]
    assert quiet.apply(records, t_s=0.0) is records  # no noise asked: untouched


def test_aggregate_is_the_mean_and_the_worst_seed() -> None:
    def run(precision: float, recall: float, false: int, ttd: float | None) -> dict[str, Any]:
        kinds = {} if ttd is None else {"grey_slowdown": {"ttd_p95_s": ttd}}
        return {
            "precision": precision, "recall": recall, "false_isolations": false,
            "device_days": 2.0, "false_isolations_per_1k_device_days": 500.0 * false,
            "faults": 4, "missed": [], "per_kind": kinds,
        }  # fmt: skip

    out = aggregate({1: run(1.0, 0.5, 0, 10.0), 2: run(0.8, 1.0, 2, 30.0), 3: run(0.9, 1, 1, None)})
    assert out["seeds"] == 3
    assert out["precision_mean"] == pytest.approx(0.9)
    assert (out["precision_worst"], out["precision_worst_seed"]) == (0.8, 2)
    assert (out["recall_worst"], out["recall_worst_seed"]) == (0.5, 1)
    assert out["false_isolations_per_1k_device_days_worst"] == 1000.0
    assert out["false_isolations_per_1k_device_days_pooled"] == 500.0  # 3 in 6 device-days
    assert out["ttd_p95_s_worst_by_kind"] == {"grey_slowdown": 30.0}
    assert aggregate({}) == {}


def test_a_device_a_shared_condition_destroys_is_a_fault_from_then_on() -> None:
    layout = {"n1-gpu0": ("n1", "r1"), "n2-gpu0": ("n2", "r1")}
    rows: list[dict[str, Any]] = [
        {"record": "fault", "fault_id": "f0", "kind": "inlet_heat", "device_uuid": None,
         "node_id": None, "rack_id": "r1", "start_at": "2026-01-01T00:00:00+00:00",
         "end_at": "2026-01-01T00:10:00+00:00"},
        {"record": "fault", "fault_id": "f1", "kind": "thermal_runaway", "device_uuid": None,
         "node_id": "n2", "rack_id": None, "start_at": "2026-01-01T00:00:00+00:00",
         "end_at": "2026-01-01T00:10:00+00:00"},
        {"record": "consequence", "what": "device_lost_overheat", "target": "n1-gpu0",
         "at": "2026-01-01T00:05:00+00:00"},
        {"record": "consequence", "what": "device_lost_overheat", "target": "n2-gpu0",
         "at": "2026-01-01T00:06:00+00:00"},
    ]  # fmt: skip
    faults = {f.fault_id: f for f in faults_from_truth(rows, layout)}
    # the inlet heat is no fault; the device it destroyed is; the node fault covers its own
    assert set(faults) == {"lost-n1-gpu0", "f1"}
    assert faults["lost-n1-gpu0"].kind == "overheat_loss"
    assert faults["lost-n1-gpu0"].start.minute == 5


@pytest.mark.parametrize("partitions", [1, 4, 12, 13])
def test_the_lagging_nodes_are_those_the_producer_puts_on_that_partition(partitions: int) -> None:
    """The noise delays a partition's worth of nodes: the ones Kafka's default partitioner
    (the agents' producer's) keys onto it, so live and in process lag the same nodes."""
    keys = [f"node-{i:05d}" for i in range(500)] + ["", "a", "ab", "abc", "r\u00e9gion-\u00fc"]
    every = list(range(partitions))
    for key in keys:
        placed = DefaultPartitioner()(key.encode(), every, every)
        assert partition_of(key, partitions) == placed, key
