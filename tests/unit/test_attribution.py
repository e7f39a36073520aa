"""Common-mode attribution: what many devices of a node, a rack or a cohort share is
judged at that level, and no device of it is isolated for it."""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import uuid4

import pytest

from agents.sim.scenario import FaultKind, FaultSpec, FleetSpec, Scenario, TargetSpec
from agents.sim.simulation import Simulation
from controllers.guardrail import Guardrail, GuardrailConfig
from controllers.isolation import IsolationLadder, LadderConfig
from evaluations.fault_scoring import Condition, Fault, conditions_from_truth, score
from models.attribution import CommonMode, GroupKey
from models.health import HealthConfig, HealthDetector
from models.health_state import Reading
from planning.isolation import attribute
from schemas.base import AcceleratorType
from schemas.events import AcceleratorTelemetry, NodeHealth, ServingMetrics
from schemas.verdicts import ATTRIBUTE, Decision, DecisionOutcome, HealthStatus, Level, Verdict
from tests.factories import START, feed_detector

FLAGGED = (HealthStatus.DYING, HealthStatus.FAILED)


def _run(*faults: FaultSpec, ticks: int, config: HealthConfig | None = None) -> list[Verdict]:
    scenario = Scenario(duration_s=ticks, fleet=FleetSpec(nodes=24, seed=5), faults=faults)
    return feed_detector(HealthDetector(config), Simulation(scenario, start=START), ticks)


def _hot_rack(rise: float = 12.0) -> FaultSpec:
    return FaultSpec(
        kind=FaultKind.INLET_HEAT, target=TargetSpec(rack=1), start_s=200, duration_s=200,
        params={"inlet_rise_celsius": rise},
    )  # fmt: skip


def test_a_hot_rack_is_the_racks_verdict_and_none_of_its_devices() -> None:
    verdicts = _run(_hot_rack(), ticks=470)
    devices = [v for v in verdicts if v.level is Level.DEVICE]
    on_rack = [v for v in devices if v.rack_id == "rack-0001"]
    assert not [v for v in on_rack if v.status in FLAGGED]
    assert any("shared with rack rack-0001" in v.attribution for v in on_rack)
    groups = [v for v in verdicts if v.level is not Level.DEVICE]
    dying = [v for v in groups if v.status is HealthStatus.DYING]
    assert {(v.level, v.scope) for v in dying} == {(Level.RACK, "rack-0001")}
    first = dying[0]
    assert first.device_uuid == "rack-0001" and first.members and first.members >= 20
    assert "thermal_resid_celsius" in first.attribution and "rack" in first.attribution
    assert first.observed_at - START < timedelta(seconds=200 + 120)
    # when the air is cool again the rack says so, once
    assert groups[-1].status is HealthStatus.HEALTHY and groups[-1].scope == "rack-0001"


def test_two_nodes_of_a_rack_whose_cooling_fails_together_are_two_nodes_not_the_rack() -> None:
    # rack-0001 holds nodes 4 to 7: the cooling of 4 and 5 fails at once, 6 and 7 run as
    # cool as ever. The rack's median of devices is over the floor, but its air would have
    # reached 6 and 7 too: each hot node is named, the rack is not (fault family seeds 581,
    # 599, 607, 610: the rack was named, and cut a hot node's own verdict short)
    runaway = [
        FaultSpec(kind=FaultKind.THERMAL_RUNAWAY, target=TargetSpec(node=n), start_s=200,
                  duration_s=300)
        for n in (4, 5)
    ]  # fmt: skip
    verdicts = _run(*runaway, ticks=450)
    groups = [v for v in verdicts if v.level is not Level.DEVICE and v.status in FLAGGED]
    assert {v.scope for v in groups} == {"node-00004", "node-00005"}
    devices = [v for v in verdicts if v.level is Level.DEVICE]
    assert not [v for v in devices if "shared with rack" in v.attribution]


def test_without_attribution_the_same_rack_loses_its_devices() -> None:
    verdicts = _run(_hot_rack(), ticks=340, config=HealthConfig(common_mode=False))
    flagged = {v.device_uuid for v in verdicts if v.status in FLAGGED}
    assert len({d for d in flagged if d.startswith(("node-00004", "node-00005"))}) >= 8
    assert not [v for v in verdicts if v.level is not Level.DEVICE]


def test_two_slow_devices_of_a_node_are_two_device_faults() -> None:
    slow = [
        FaultSpec(
            kind=FaultKind.GREY_SLOWDOWN,
            target=TargetSpec(node=2, device=device),
            start_s=240,
            duration_s=300,
            params={"slowdown_ratio": 0.25},
        )
        for device in (1, 4)
    ]
    verdicts = _run(*slow, ticks=400)
    flagged = {v.device_uuid for v in verdicts if v.status in FLAGGED}
    assert flagged == {"node-00002-gpu1", "node-00002-gpu4"}
    assert all(v.level is Level.DEVICE for v in verdicts if v.status in FLAGGED)
    dying = [v for v in verdicts if v.status is HealthStatus.DYING]
    assert "its own" in dying[0].attribution


def _common(values: dict[str, float]) -> CommonMode:
    def reading_of(device: str, name: str, at_s: float) -> Reading | None:
        del at_s
        if device not in values or name != "thermal_resid_celsius":
            return None
        return Reading(name, values[device], 8.0)

    common = CommonMode(
        reading_of, {"thermal_resid_celsius": 8.0}, sustain_s=10.0, verdict_interval_s=30.0
    )
    for device in values:
        common.place(device, "node", "n1")
        common.place(device, "rack", "r1")
    return common


def test_a_device_beyond_its_hot_node_is_still_its_own() -> None:
    values = {f"d{i}": 10.0 for i in range(7)} | {"d7": 25.0}
    common = _common(values)
    hot = Reading("thermal_resid_celsius", 10.0, 8.0)
    explained = common.explain("d0", hot, 0.0)
    # the broadest, even where the rack reads no further than the node, when nothing says
    # the heat is the node's own (here no device's heating is known: models.attribution)
    assert explained is not None and explained.key == GroupKey("rack", "r1")
    assert common.explain("d7", Reading("thermal_resid_celsius", 25.0, 8.0), 0.0) is None


def _one_node_rack(
    resid: dict[str, float], heating: dict[str, float], others: dict[str, float] | None = None
) -> CommonMode:
    """Node n1's devices (``resid``, ``heating``) and, on rack r1 beside them, ``others``
    (devices of node n2 reporting that residual; none: n1 is the rack's one reporting node)."""
    others = others or {}

    def reading_of(device: str, name: str, at_s: float) -> Reading | None:
        del at_s
        if name == "heating_celsius" and device in heating:
            return Reading(name, heating[device], 0.0)
        if name == "thermal_resid_celsius" and device in resid | others:
            return Reading(name, (resid | others)[device], 8.0)
        return None

    common = CommonMode(
        reading_of, {"thermal_resid_celsius": 8.0}, sustain_s=10.0, verdict_interval_s=30.0
    )
    for device in resid:
        common.place(device, "node", "n1")
        common.place(device, "rack", "r1")
    for device in others:
        common.place(device, "node", "n2")
        common.place(device, "rack", "r1")
    return common


@pytest.mark.parametrize(
    ("inlet", "resistance_rise", "others", "named"),
    [
        (12.0, 1.0, False, "node"),  # failed cooling: a busy device heats more than an idle one
        (12.0, 0.0, False, "rack"),  # hot air: the same degrees on every device
        (12.0, 0.3, False, "rack"),  # a rise in step with power, but too slight for a fault
        (12.0, 1.0, True, "rack"),  # another node of the rack reads as hot: the rack's
    ],
)
def test_a_one_node_rack_names_the_node_whose_cooling_heats_with_power(
    inlet: float, resistance_rise: float, others: bool, named: str
) -> None:
    """When a rack's one reporting node runs hot, the two medians are one reading. A node
    whose cooling failed (a higher thermal resistance) heats each device in proportion to
    the power it sheds; hot air adds the same degrees to all. Two spares idle on the node
    (heating 5 C) beside six busy devices (30 C)."""
    heating = {f"d{i}": 5.0 if i >= 6 else 30.0 for i in range(8)}
    resid = {d: inlet + resistance_rise * h for d, h in heating.items()}
    hot_neighbours = {f"e{i}": inlet + resistance_rise * 30.0 for i in range(8)} if others else {}
    common = _one_node_rack(resid, heating, hot_neighbours)
    device = "d0"
    explained = common.explain(device, Reading("thermal_resid_celsius", resid[device], 8.0), 0.0)
    assert explained is not None and explained.key.kind == named
    # judged over time, the node is not handed to the rack when its cooling is its own
    common.judge(0.0)
    dying = {j.key.kind for j in common.judge(12.0) if j.status is HealthStatus.DYING}
    assert dying == {named}
    if named == "node":
        # drained, its devices idle alike (no slope shows), but their air is no cooler: the
        # node keeps its cooling's name while it is watched, not handed to the rack
        heating.update(dict.fromkeys(heating, 5.0))
        resid.update({d: inlet + resistance_rise * 5.0 for d in resid})
        again = common.judge(45.0)
        assert [(j.key.kind, j.status) for j in again] == [("node", HealthStatus.DYING)]


def test_a_rack_named_before_its_one_nodes_cooling_showed_hands_the_heat_to_the_node() -> None:
    """The first minute of a node's failed cooling: every device is hot, the heat has not yet
    spread by power, and the rack is named. Once a busy device runs hotter than an idle one
    in proportion, the node is named and the rack, its one reporting node's, is healthy."""
    heating = {f"d{i}": 5.0 if i >= 6 else 30.0 for i in range(8)}
    resid = dict.fromkeys(heating, 12.0)
    common = _one_node_rack(resid, heating)
    first = common.explain("d0", Reading("thermal_resid_celsius", 12.0, 8.0), 0.0)
    assert first is not None and first.key.kind == "rack"
    assert [(j.key.kind, j.status) for j in common.judge(0.0)] == [("rack", HealthStatus.SUSPECT)]
    resid.update({d: 12.0 + h for d, h in heating.items()})  # the cooling's share shows
    named = common.explain("d0", Reading("thermal_resid_celsius", resid["d0"], 8.0), 5.0)
    assert named is not None and named.key.kind == "node"
    judged = {j.key.kind: j.status for j in common.judge(6.0)}
    assert judged == {"rack": HealthStatus.HEALTHY, "node": HealthStatus.SUSPECT}
    assert set(common.watched) == {GroupKey("node", "n1")}


@pytest.mark.parametrize("kind", [FaultKind.THERMAL_RUNAWAY, FaultKind.INLET_HEAT])
def test_a_one_node_racks_heat_is_named_by_its_physics(kind: FaultKind) -> None:
    """Nine nodes, four to a rack: node-00008 is rack-0002's only node. Its failed cooling
    (thermal resistance doubled, inlet 12 C up) is the node's, drained as one unit; hot air
    on its rack (inlet 12 C up) is the rack's and drains nothing. Seed 288 of the fault
    family named such a node's cooling as its rack's before, and nothing was drained."""
    target = TargetSpec(node=8) if kind is FaultKind.THERMAL_RUNAWAY else TargetSpec(rack=2)
    params = {"inlet_rise_celsius": 12.0}
    fault = FaultSpec(kind=kind, target=target, start_s=200, duration_s=300, params=params)
    fleet = FleetSpec(nodes=9, seed=5, type_mix=(AcceleratorType.H100,))  # peers on 8 nodes
    scenario = Scenario(duration_s=420, fleet=fleet, faults=(fault,))
    verdicts = feed_detector(HealthDetector(), Simulation(scenario, start=START), 420)
    on_node = [v for v in verdicts if v.level is Level.DEVICE and v.node_id == "node-00008"]
    assert on_node and not [v for v in on_node if v.status in FLAGGED]
    groups = [v for v in verdicts if v.level is not Level.DEVICE]
    dying = {v.scope for v in groups if v.status is HealthStatus.DYING}
    last = {v.scope: v.status for v in groups}
    if kind is FaultKind.THERMAL_RUNAWAY:
        assert "node-00008" in dying and last["node-00008"] is HealthStatus.DYING
        # the rack may be named in the first seconds, before the heat spreads by power
        assert last.get("rack-0002", HealthStatus.HEALTHY) is HealthStatus.HEALTHY
    else:
        assert dying == {"rack-0002"} and last["rack-0002"] is HealthStatus.DYING


def test_a_group_is_over_then_sustained_then_healthy_again() -> None:
    values = {f"d{i}": 10.0 for i in range(8)}
    common = _common(values)
    assert common.explain("d0", Reading("thermal_resid_celsius", 10.0, 8.0), 0.0) is not None
    assert [j.status for j in common.judge(0.0)] == [HealthStatus.SUSPECT]
    assert common.judge(5.0) == []  # nothing new within the verdict interval
    assert [j.status for j in common.judge(12.0)] == [HealthStatus.DYING]
    values.update({d: 0.0 for d in values})
    assert [j.status for j in common.judge(14.0)] == [HealthStatus.HEALTHY]
    assert common.watched == {}


def test_a_watched_node_whose_cause_turns_out_broader_gives_it_to_the_broader_group() -> None:
    """A rollout or a rack's air reaches one node first: the node is watched, then every
    node of the rack moves as far. The node is not judged on what its rack shares (a
    held-out seed drained two nodes, 8 healthy devices each, in a rollout's first seconds),
    and the rack is watched instead."""
    values = {f"d{i}": 10.0 if i < 4 else 0.0 for i in range(12)}

    def reading_of(device: str, name: str, at_s: float) -> Reading | None:
        del at_s
        return Reading(name, values[device], 8.0) if name == "thermal_resid_celsius" else None

    common = CommonMode(
        reading_of, {"thermal_resid_celsius": 8.0}, sustain_s=10.0, verdict_interval_s=30.0
    )
    for i, device in enumerate(values):
        common.place(device, "node", f"n{i // 4}")
        common.place(device, "rack", "r1")
    hot = Reading("thermal_resid_celsius", 10.0, 8.0)
    assert common.explain("d0", hot, 0.0) == common.explain("d1", hot, 0.0)
    assert [(j.key.kind, j.status) for j in common.judge(0.0)] == [("node", HealthStatus.SUSPECT)]
    values.update({d: 10.0 for d in values})  # the whole rack, as far as the node
    judged = [(j.key.kind, j.status) for at in range(2, 41) for j in common.judge(float(at))]
    assert ("node", HealthStatus.HEALTHY) in judged
    assert ("node", HealthStatus.DYING) not in judged
    assert ("rack", HealthStatus.DYING) in judged
    values.update({f"d{i}": 30.0 for i in range(4)})  # and a node beyond its rack is its own
    beyond = common.explain("d0", Reading("thermal_resid_celsius", 30.0, 8.0), 41.0)
    assert beyond is not None and beyond.key == GroupKey("node", "n0")
    statuses = {j.key.kind: j.status for j in common.judge(41.0)}
    assert statuses.get("node") is HealthStatus.SUSPECT


def test_a_median_needs_three_current_readings() -> None:
    common = _common({"d0": 12.0, "d1": 12.0})
    assert common.explain("d0", Reading("thermal_resid_celsius", 12.0, 8.0), 0.0) is None
    common.forget(["d0", "d1"])
    assert common.members == {}


def _group_verdict(status: HealthStatus, previous: HealthStatus) -> Verdict:
    return Verdict(
        verdict_id=uuid4(), observed_at=START, device_uuid="rack-0001", node_id="*",
        region="us-east", rack_id="rack-0001", pool="*", accelerator_type=AcceleratorType.H100,
        status=status, previous_status=previous, score=0.75, level=Level.RACK,
        scope="rack-0001", attribution="thermal_resid_celsius median 11: shared", members=32,
    )  # fmt: skip


def test_a_groups_verdict_is_recorded_and_moves_no_device() -> None:
    dying = _group_verdict(HealthStatus.DYING, HealthStatus.SUSPECT)
    ladder = IsolationLadder(LadderConfig(), Guardrail(GuardrailConfig(), devices={}))
    assert ladder.verdict(dying, now=START) == []
    assert ladder.devices == {}
    out = attribute(dying, START)
    assert out is not None and out.command is None
    decision = out.decision
    assert (decision.action, decision.reason, decision.target) == (
        ATTRIBUTE,
        "common_mode",
        "rack-0001",
    )
    assert decision.outcome is DecisionOutcome.ADVISORY and "no device isolated" in decision.message
    cleared = attribute(_group_verdict(HealthStatus.HEALTHY, HealthStatus.DYING), START)
    assert cleared is not None and "cleared" in cleared.decision.message
    assert attribute(_group_verdict(HealthStatus.SUSPECT, HealthStatus.HEALTHY), START) is None


@pytest.mark.parametrize(
    ("scope", "explained"), [("rack-0001", True), ("node-00005", True), ("rack-0002", False)]
)
def test_scoring_counts_group_verdicts_apart(scope: str, explained: bool) -> None:
    at = START + timedelta(seconds=300)
    heat = Condition(
        "inlet_heat", START, START + timedelta(seconds=600),
        frozenset({"rack-0001", "node-00004", "node-00005"}),
    )  # fmt: skip
    runaway = Fault(
        "f1", "thermal_runaway", START, START + timedelta(seconds=600),
        frozenset({"node-00005-gpu0"}), frozenset({"node-00005"}),
    )  # fmt: skip
    group = _group_verdict(HealthStatus.DYING, HealthStatus.SUSPECT).model_copy(
        update={"observed_at": at, "scope": scope, "device_uuid": scope}
    )
    decision = Decision(
        decision_id=uuid4(), decided_at=at, controller="isolation", target=scope,
        action=ATTRIBUTE, outcome=DecisionOutcome.ADVISORY, reason="common_mode",
    )  # fmt: skip
    result = score([runaway], [group], [decision], {}, observed_s=600, conditions=[heat])
    assert result.detections == 0  # a group is no device's detection
    assert result.false_isolations == 0  # recording it isolates nothing
    assert result.group_detections == 1
    assert (result.group_unexplained == []) is explained
    assert (result.detected == 1) is (scope == "node-00005")  # it names the faulty node


def test_a_node_fault_explains_its_rack_where_the_node_is_the_racks_only_one() -> None:
    # a rack of one node: a verdict naming the rack names the node's devices, no others
    layout = {"node-00005-gpu0": ("node-00005", "rack-0001"),
              "node-00005-gpu1": ("node-00005", "rack-0001"),
              "node-00006-gpu0": ("node-00006", "rack-0002"),
              "node-00007-gpu0": ("node-00007", "rack-0002")}  # fmt: skip
    row = {
        "record": "fault",
        "kind": "thermal_runaway",
        "device_uuid": None,
        "rack_id": None,
        "start_at": START.isoformat(),
        "end_at": (START + timedelta(seconds=600)).isoformat(),
    }
    [alone] = conditions_from_truth([{**row, "node_id": "node-00005"}], layout)
    assert alone.covers("rack-0001") and alone.covers("node-00005")
    [shared] = conditions_from_truth([{**row, "node_id": "node-00006"}], layout)
    assert shared.covers("node-00006") and not shared.covers("rack-0002")  # its rack has two


def test_group_verdicts_name_what_does_not_apply() -> None:
    v = _group_verdict(HealthStatus.DYING, HealthStatus.SUSPECT)
    assert v.node_id == "*" and v.pool == "*"
    assert isinstance(v.observed_at, datetime)


def test_a_groups_readings_are_the_devices_own() -> None:
    """The readings a group's median is taken of are the ones each device is judged on."""
    scenario = Scenario(duration_s=120, fleet=FleetSpec(nodes=6, seed=2))
    sim = Simulation(scenario, start=START)
    det = HealthDetector()
    feed_detector(det, sim, 120)
    at_s = sim.now.timestamp()
    compared = 0
    for uuid, device in det.devices.items():
        _, soft = det.signals(uuid, device, at_s)
        for reading in soft:
            if reading.name != "ecc_sbe_rise":
                assert det._soft(uuid, device, reading.name, at_s) == reading
                compared += 1
    assert compared > 3 * len(det.devices)  # tpot too, where the device serves


@pytest.mark.parametrize(
    ("scope", "covered"),
    [
        ("MI300X@eu-west", True),
        ("qwen-7b/MI300X@eu-west", True),  # the stack where the rollout's type serves
        ("qwen-7b/H100@eu-west", False),
        ("MI300X@us-east", False),
        ("rack-0001", False),
    ],
)
def test_a_rollout_covers_its_cohorts_and_their_stacks(scope: str, covered: bool) -> None:
    rollout = Condition(
        "rollout_slowdown", START, START + timedelta(seconds=60), frozenset(),
        frozenset({"MI300X"}), "eu-west",
    )  # fmt: skip
    assert rollout.covers(scope) is covered


def test_a_rollout_read_in_the_middle_of_a_probe_round_takes_no_node_out() -> None:
    # every node probes in the same second and the detector reads a round one node at a
    # time; a rollout moves the peers' reference part way through its second slow round,
    # so the nodes read before the move saw a 15% gap and the rest none. When node 0's
    # next round comes late (its partition delayed), its gaps taken then would stand
    # against peers already read afresh: its node alone looked slow and was drained. A
    # gap is taken against the peers as they read now, so every node reads alike
    rollout = FaultSpec(
        kind=FaultKind.ROLLOUT_SLOWDOWN, target=TargetSpec(accelerator_type="H100"),
        start_s=165, duration_s=400, params={"slowdown_ratio": 0.15},
    )  # fmt: skip
    types = tuple(AcceleratorType(t) for t in ("H100", "H100", "A100", "MI300X"))
    fleet = FleetSpec(nodes=48, seed=5, type_mix=types)
    sim = Simulation(Scenario(duration_s=240, fleet=fleet, faults=(rollout,)), start=START)
    det = HealthDetector()
    verdicts: list[Verdict] = []
    held: list[tuple[int, NodeHealth]] = []
    for n in range(240):
        for _spec, ev in sim.tick(n):
            if isinstance(ev, NodeHealth) and ev.node_id == "node-00000" and n >= 185:
                held.append((n + 3, ev))
            elif isinstance(ev, AcceleratorTelemetry | NodeHealth | ServingMetrics):
                verdicts += det.observe(ev)
        while held and held[0][0] <= n:
            verdicts += det.observe(held.pop(0)[1])
        verdicts += det.tick(sim.now)
    assert not [v for v in verdicts if v.status in FLAGGED and v.level is not Level.COHORT]
    # the rollout was seen, and as the type's
    slow = [v for v in verdicts if v.level is Level.DEVICE and "probe_slow" in v.attribution]
    assert slow and all("shared with type H100@" in v.attribution for v in slow)
