"""The online health detector: hard faults within one event, soft signals sustained,
peers and history for grey failures, small per-device state."""

from __future__ import annotations

import copy
import itertools
import math
import pickle
import random
from collections import Counter
from datetime import timedelta

from agents.sim.control import SimControl
from agents.sim.scenario import FaultKind, FaultSpec, FleetSpec, Scenario, TargetSpec
from agents.sim.simulation import Simulation
from models.health import HealthConfig, HealthDetector
from schemas.events import AcceleratorTelemetry, NodeHealth, ServingMetrics
from schemas.verdicts import HealthStatus, Level, Verdict
from tests.factories import START, feed_detector

_feed = feed_detector


def _sim(*faults: FaultSpec, nodes: int = 10) -> Simulation:
    scenario = Scenario(name="t", duration_s=600, fleet=FleetSpec(nodes=nodes), faults=faults)
    return Simulation(scenario, start=START)


def _flagged(verdicts: list[Verdict]) -> dict[str, Verdict]:
    first: dict[str, Verdict] = {}
    for v in verdicts:
        if v.status in (HealthStatus.DYING, HealthStatus.FAILED):
            first.setdefault(v.device_uuid, v)
    return first


def test_grey_slowdown_of_15_percent_is_found_within_30s_and_nothing_else_is() -> None:
    fault = FaultSpec(
        kind=FaultKind.GREY_SLOWDOWN,
        target=TargetSpec(node=2, device=3),
        start_s=150,
        duration_s=300,
        params={"slowdown_ratio": 0.15},
    )
    sim = _sim(fault)
    flagged = _flagged(_feed(HealthDetector(), sim, 190))
    assert set(flagged) == {"node-00002-gpu3"}
    v = flagged["node-00002-gpu3"]
    assert v.status is HealthStatus.DYING
    assert (v.observed_at - START).total_seconds() - 150 <= 30
    assert any(s.name == "tpot_vs_peers_log" and s.value > s.threshold for s in v.signals)


def test_hard_faults_fail_within_the_event_that_shows_them() -> None:
    sim = _sim()
    det = HealthDetector()
    _feed(det, sim, 5)
    sample = sim.telemetry.device_sample(sim.fleet.nodes[1].devices[2])
    dbe = sample.model_copy(update={"ecc_dbe_volatile_total": 1})
    [v] = det.accelerator(dbe)
    assert (v.status, v.cause_event_id) == (HealthStatus.FAILED, dbe.event_id)
    assert v.signals[0].name == "ecc_dbe"
    lost = sim.telemetry.device_sample(sim.fleet.nodes[1].devices[3]).model_copy(
        update={"xid_last": 79}
    )
    [v] = det.accelerator(lost)
    assert v.status is HealthStatus.FAILED and "xid_79" in v.evidence


def test_non_fatal_xids_close_together_or_spread_over_minutes_mark_a_device_dying() -> None:
    sim = _sim()
    dev = sim.fleet.nodes[0].devices[0]
    base = HealthDetector()
    _feed(base, sim, 5)

    def xids(det: HealthDetector, *at_s: float) -> list[HealthStatus]:
        """The verdicts other than healthy (a keep-alive) on XIDs at ``at_s``."""
        out: list[HealthStatus] = []
        for t in at_s:
            s = sim.telemetry.device_sample(dev).model_copy(
                update={"xid_last": 31, "observed_at": sim.now + timedelta(seconds=1 + t)}
            )
            out += [v.status for v in det.accelerator(s) if v.status is not HealthStatus.HEALTHY]
        return out

    # one XID is no flap; a second 20 s later is (two within about 150 s)
    det = copy.deepcopy(base)
    assert xids(det, 0) == []
    assert xids(det, 20) == [HealthStatus.DYING]
    # they stop: past one flap interval (100 s) the device is healthy again, though the
    # statistic still remembers the flap (a device that stopped flapping is not stepped
    # down the ladder on what it did minutes ago) ...
    quiet = sim.telemetry.device_sample(dev).model_copy(
        update={"observed_at": sim.now + timedelta(seconds=21 + 101)}
    )
    [v] = det.accelerator(quiet)
    assert v.status is HealthStatus.HEALTHY and det.devices[dev.uuid].xid_cusum > 12
    # ... so that one more XID is a flap again at once
    assert xids(det, 140) == [HealthStatus.DYING]
    # three five minutes apart: never three in five minutes (the count this replaced
    # missed them), yet far above one a day
    assert xids(copy.deepcopy(base), 0, 300, 600) == [HealthStatus.DYING]
    # one every twenty minutes drains between them: never a flap
    assert xids(copy.deepcopy(base), *(1200.0 * k for k in range(6))) == []


def test_heartbeat_loss_fails_a_node_but_a_blind_pipeline_stays_static() -> None:
    sim = _sim()
    det = HealthDetector(HealthConfig(heartbeat_timeout_s=5, blind_ratio=0.3))
    _feed(det, sim, 5)
    # one node silent: its devices fail
    det.nodes["node-00004"] -= 60
    failed = {v.device_uuid for v in det.tick(sim.now) if v.status is HealthStatus.FAILED}
    assert failed == {f"node-00004-gpu{i}" for i in range(8)}
    # a lagging partition is not a silent node: each node is judged against its own source
    det3 = HealthDetector(HealthConfig(heartbeat_timeout_s=5, stall_wall_s=30))
    events = [ev for _spec, ev in sim.tick(5)]
    beats = [ev for ev in events if isinstance(ev, NodeHealth)]
    source = {ev.node_id: "lagging" if ev.node_id == "node-00004" else "a" for ev in beats}
    for ev in events:
        if isinstance(ev, AcceleratorTelemetry):
            det3.accelerator(ev, received_s=100.0, source=source[ev.node_id])
    for ev in beats:
        det3.heartbeat(ev, received_s=100.0, source=source[ev.node_id])
    later = sim.now + timedelta(seconds=60)
    for ev in beats:  # every other node heartbeats again, a minute of event time on
        if ev.node_id != "node-00004":
            det3.heartbeat(ev.model_copy(update={"observed_at": later}), source="a")
    assert det3.tick(later, wall_s=110.0) == []  # its partition has simply not been read yet
    lost = {v.node_id for v in det3.tick(later, wall_s=131.0)}  # quiet 31 s in processing
    assert lost == {"node-00004"}
    # most nodes silent at once: the pipeline is blind; no verdicts, nothing failed anew
    det2 = HealthDetector(HealthConfig(heartbeat_timeout_s=5, blind_ratio=0.3))
    _feed(det2, _sim(), 5)
    assert det2.tick(sim.now + timedelta(seconds=60)) == []


def test_a_node_alone_on_its_partition_is_lost_once_the_broker_says_it_was_read_to_the_end() -> (
    None
):
    """No partition-mate witnesses a lone node's silence, and an unread partition looks the
    same as a silent one. The broker's log end offset tells them apart: read to the end,
    the node is lost at once, not after ``stall_wall_s``; until then it is not."""
    sim = _sim()
    det = HealthDetector(HealthConfig(heartbeat_timeout_s=5, stall_wall_s=30))
    judged = AcceleratorTelemetry | NodeHealth
    events = [ev for _spec, ev in sim.tick(5) if isinstance(ev, judged)]
    alone = "node-00004"
    source = {ev.node_id: ("health", 7 if ev.node_id == alone else 0) for ev in events}
    for ev in events:
        det.observe(ev, received_s=100.0, source=source[ev.node_id])
    later = sim.now + timedelta(seconds=6)
    for ev in events:  # every other node speaks on, six seconds of broker time later
        if isinstance(ev, NodeHealth) and ev.node_id != alone:
            det.heartbeat(ev.model_copy(update={"observed_at": later}), source=("health", 0))
    assert det.unwitnessed(sim.now + timedelta(seconds=4)) == set()  # not yet past the timeout
    assert det.unwitnessed(later) == {("health", 7)}
    assert det.tick(later, wall_s=101.0) == []  # not read to its end: unread, not silent
    verdicts = det.tick(later, wall_s=101.5, drained={("health", 7)})
    assert {v.node_id for v in verdicts if v.status is HealthStatus.FAILED} == {alone}
    silence = sim.now + timedelta(seconds=5)  # its last word and the timeout: the cause
    assert {v.cause_appended_at for v in verdicts if v.node_id == alone} == {silence}
    assert det.unwitnessed(later) == set()  # lost: nothing more to ask
    assert det.tick(later + timedelta(seconds=1), wall_s=102.0) == []  # still lost, said once
    beat = next(ev for ev in events if isinstance(ev, NodeHealth) and ev.node_id == alone)
    det.heartbeat(beat.model_copy(update={"observed_at": later}), source=("health", 7))
    assert alone not in det.lost_nodes


def test_an_ecc_storm_is_dying_before_its_double_bit_fault() -> None:
    fault = FaultSpec(kind=FaultKind.ECC_STORM, target=TargetSpec(node=0, device=1), start_s=20,
                      duration_s=500, params={"lead_s": 300})  # fmt: skip
    sim = _sim(fault, nodes=4)
    flagged = _flagged(_feed(HealthDetector(), sim, 330))
    v = flagged["node-00000-gpu1"]
    assert v.status is HealthStatus.DYING and "ecc_sbe_rise" in v.evidence
    assert (v.observed_at - START).total_seconds() < 20 + 300  # before the double-bit fault
    assert set(flagged) == {"node-00000-gpu1"}


def test_per_device_state_is_small_and_state_round_trips() -> None:
    sim = _sim()
    det = HealthDetector()
    _feed(det, sim, 60)
    sizes = [len(pickle.dumps(d)) for d in det.devices.values()]
    assert max(sizes) <= 2048, max(sizes)
    clone = pickle.loads(pickle.dumps(det))
    sample = sim.telemetry.device_sample(sim.fleet.nodes[0].devices[0])
    assert clone.accelerator(sample) == det.accelerator(sample)


def test_verdicts_come_on_change_and_as_keepalives_spread_over_the_interval() -> None:
    det = HealthDetector(HealthConfig(verdict_interval_s=30))
    sim = _sim(nodes=8)
    verdicts = _feed(det, sim, 95)
    by_device: dict[str, list[Verdict]] = {}
    for v in verdicts:
        by_device.setdefault(v.device_uuid, []).append(v)
    assert len(by_device) == 64
    for said in by_device.values():  # the first sample, then one in each 30-s slot of its own
        assert [v.status for v in said] == [HealthStatus.HEALTHY] * len(said)
        assert all(0.0 <= v.score < 0.5 for v in said)
        at = [v.observed_at.timestamp() for v in said]
        assert len(at) in (4, 5) and all(0 < b - a <= 30 for a, b in itertools.pairwise(at))
    # every device's first verdict comes with its first sample; the keep-alives after it
    # spread over the interval (they all came in one second when each counted from its first)
    keepalives = Counter(v.observed_at for said in by_device.values() for v in said[1:])
    assert max(keepalives.values()) <= 16 and len(keepalives) >= 20


def test_devices_held_down_by_power_caps_are_not_judged_slow() -> None:
    # the power controller caps a rack: its devices run slower by our own hand, and their
    # probes and TPOT must not walk them down the isolation ladder
    sim = _sim(nodes=8)
    det = HealthDetector()
    verdicts = _feed(det, sim, 60)
    control = SimControl(sim.fleet)
    capped = [d for n in sim.fleet.racks[1].nodes for d in n.devices]
    for i, d in enumerate(capped):
        # uneven caps, changed as the controller would: the deepest at the driver's floor
        floor = d.spec.min_power_limit_watts
        control.set_power_limit(
            d.uuid, floor if i % 3 == 0 else (floor + d.spec.power_limit_watts) / 2
        )
    verdicts = _feed(det, sim, 120)
    assert any(d.throttle_reasons for d in capped), "the caps must bind for this test to mean much"
    assert not set(_flagged(verdicts)) & {d.uuid for d in capped}


def test_partitions_that_move_away_are_released_and_never_judged_silent() -> None:
    """Another process took one node's partition: its devices leave this detector, and
    the source that stopped here does not make them look silent (kept, they would be
    failed once the stall allowance ran out)."""
    sim = _sim(nodes=8)
    det = HealthDetector()
    source = {f"node-{i:05d}": ("t", i) for i in range(8)}
    verdicts: list[Verdict] = []
    for n in range(300):
        for _spec, ev in sim.tick(n):
            if isinstance(ev, AcceleratorTelemetry | NodeHealth | ServingMetrics):
                where = source[ev.node_id]
                if n >= 60 and where[1] == 7:
                    continue  # partition 7 is another process's from now on
                verdicts += det.observe(ev, appended_at=ev.observed_at, source=where)
        if n == 60:
            assert det.release(lambda where: where != ("t", 7)) == 8
            assert not any(u.startswith("node-00007") for u in det.devices)
        verdicts += det.tick(sim.now, wall_s=float(n))
    bad = [v.device_uuid for v in verdicts if v.status in (HealthStatus.DYING, HealthStatus.FAILED)]
    assert bad == []
    assert len(det.devices) == 7 * 8


def test_one_correctable_error_on_a_healthy_device_is_not_suspect() -> None:
    sim = _sim(nodes=2)
    det = HealthDetector()
    _feed(det, sim, 40)
    device = sim.fleet.nodes[0].devices[1]
    before = sim.telemetry.device_sample(device)
    later = before.observed_at + timedelta(seconds=1)
    total = (before.ecc_sbe_volatile_total or 0) + 1
    one = before.model_copy(update={"observed_at": later, "ecc_sbe_volatile_total": total})
    det.accelerator(one)
    _, soft = det.signals(device.uuid, det.devices[device.uuid], later.timestamp())
    [ecc] = [s for s in soft if s.name == "ecc_sbe_rise"]
    assert 0 < ecc.value < ecc.threshold  # counted as evidence, far from a storm
    assert det.devices[device.uuid].status is HealthStatus.HEALTHY


def test_a_slow_chip_under_a_rack_power_brake_is_found_by_its_probes() -> None:
    brake = FaultSpec(kind=FaultKind.POWER_BRAKE, target=TargetSpec(rack=0), start_s=60,
                      duration_s=400, params={"clock_ratio": 0.7})  # fmt: skip
    slow = FaultSpec(kind=FaultKind.GREY_SLOWDOWN, target=TargetSpec(node=1, device=2),
                     start_s=150, duration_s=300, params={"slowdown_ratio": 0.2})  # fmt: skip
    verdicts = _feed(HealthDetector(), _sim(brake, slow), 200)
    devices = _flagged([v for v in verdicts if v.level is Level.DEVICE])
    # the braked rack's other chips run slow by its hand, judged over their clocks: not flagged
    assert set(devices) == {"node-00001-gpu2"}
    assert "probe_slow" in devices["node-00001-gpu2"].evidence
    racks = {v.scope for v in verdicts if v.level is Level.RACK}
    assert racks <= {"rack-0000"}  # what the brake did to the rack's heat is the rack's


def _serving_templates(sim: Simulation, det: HealthDetector) -> dict[str, ServingMetrics]:
    """Five seconds of the fleet through ``det``; each serving replica's last sample."""
    templates: dict[str, ServingMetrics] = {}
    for n in range(5):
        for _spec, ev in sim.tick(n):
            if isinstance(ev, AcceleratorTelemetry | NodeHealth | ServingMetrics):
                det.observe(ev)
            if isinstance(ev, ServingMetrics) and ev.device_uuid and ev.requests:
                templates[ev.device_uuid] = ev
    return templates


def _fleet_second(sim: Simulation, det: HealthDetector, tick: int) -> list[Verdict]:
    """One second of the fleet's own telemetry and heartbeats (serving is the test's)."""
    return [
        v
        for _spec, ev in sim.tick(tick)
        if isinstance(ev, AcceleratorTelemetry | NodeHealth)
        for v in det.observe(ev)
    ]


def _serve(
    det: HealthDetector, sim: Simulation, template: ServingMetrics, *, batch: int, tpot: float
) -> list[Verdict]:
    """One serving sample of ``template``'s replica, now, at ``batch`` and ``tpot``."""
    update = {"observed_at": sim.now, "batch_size": batch, "tpot_p50_s": round(tpot, 6)}
    return det.serving(template.model_copy(update=update))


def _note_flagged(flagged: dict[str, Verdict], verdicts: list[Verdict]) -> None:
    """Keep each device's first dying or failed verdict."""
    for v in verdicts:
        if v.level is Level.DEVICE and v.status in (HealthStatus.DYING, HealthStatus.FAILED):
            flagged.setdefault(v.device_uuid, v)


def _one_model_by_node(sim: Simulation, det: HealthDetector) -> list[list[ServingMetrics]]:
    """The replicas of the fleet's most common accelerator type in its region, by node, each
    made to serve one model (their serving samples are the test's)."""
    templates = _serving_templates(sim, det)
    places = Counter((t.accelerator_type, t.region) for t in templates.values())
    kind, region = places.most_common(1)[0][0]
    by_node: dict[str, list[ServingMetrics]] = {}
    for t in sorted(templates.values(), key=lambda t: t.device_uuid or ""):
        if (t.accelerator_type, t.region) == (kind, region):
            by_node.setdefault(t.node_id, []).append(t.model_copy(update={"model": "llama-3-70b"}))
    return list(by_node.values())


def _band_move(config: HealthConfig) -> dict[str, Verdict]:
    """Eight replicas of one model on one accelerator type in one region (four on each of two
    nodes), half at batch 48 and half at
    batch 32 (two load bands); a rollout then slows the model 14% while every replica runs at
    batch 48, so the batch-32 band learns nothing of it; then two replicas go back to batch
    32, as slow as their peers and no slower. The devices the detector flagged (the rollout
    itself is the cohort's verdict)."""
    sim = _sim(nodes=16)
    det = HealthDetector(config)
    by_node = _one_model_by_node(sim, det)
    replicas = [t for node in by_node[:2] for t in node[:4]]  # four on each of two
    assert len(replicas) == 8
    noise = random.Random(7)
    flagged: dict[str, Verdict] = {}
    for second in range(240):
        # the fleet's own telemetry and heartbeats go on; serving is the eight replicas'
        verdicts = _fleet_second(sim, det, 5 + second)
        rollout = second >= 60  # the model is 14% slower from here on
        for i, template in enumerate(replicas):
            moved = second >= 180 and i in (0, 4)  # one replica on each node
            batch = 32 if moved or (i % 2 and not rollout) else 48
            tpot = 0.030 * (1.0 + 0.06 * (batch == 48)) * (1.14 if rollout else 1.0)
            noisy = tpot * (1.0 + noise.gauss(0.0, 0.01))
            verdicts += _serve(det, sim, template, batch=batch, tpot=noisy)
        verdicts += det.tick(sim.now)
        _note_flagged(flagged, verdicts)
    return flagged


def test_a_load_band_no_device_ran_in_since_a_rollout_is_learned_afresh() -> None:
    # the two replicas are no slower than their peers: the band they return to holds the
    # model's TPOT of before the rollout, and only samples of the last minute are peers
    assert _band_move(HealthConfig()) == {}
    # judged against the band's old samples (and its peers of then), both would read the
    # rollout's 14% as theirs
    stale = _band_move(HealthConfig(tpot_peer_age_s=math.inf, tpot_peer_fresh_s=math.inf))
    assert len(stale) == 2
    assert all("tpot_vs_peers_log" in v.evidence for v in stale.values())


def _rollout_pairs(
    config: HealthConfig, *, peers_leave: bool, seconds: int = 180
) -> tuple[dict[str, Verdict], HealthDetector, list[str]]:
    """Four replicas of one model on one accelerator type in one region, two on each of two
    nodes, at batch 48; from 63 s a rollout slows the model 14% on all four. With
    ``peers_leave``, the second node's two run a batch of their own from 60 s (load moved,
    or capped: they no longer teach the batch-48 cohort); else the first node's two move to
    a batch no replica ran from 68 s, a few seconds into the rollout, while the old band's
    reference still lags it. The devices the detector flagged in ``seconds``, the detector,
    and the first node's two."""
    sim = _sim(nodes=16)
    det = HealthDetector(config)
    by_node = _one_model_by_node(sim, det)
    first, second = (node[:2] for node in by_node[:2])
    noise = random.Random(5)
    flagged: dict[str, Verdict] = {}
    for tick in range(seconds):
        verdicts = _fleet_second(sim, det, 5 + tick)
        for template in first + second:
            if template in first:
                alone = not peers_leave and tick >= 68
            else:
                alone = peers_leave and tick >= 60
            slow = 1.14 if tick >= 63 else 1.0
            batch = (96 if template in first else 20) if alone else 48
            tpot = 0.030 * slow * (1.0 + noise.gauss(0.0, 0.01))
            verdicts += _serve(det, sim, template, batch=batch, tpot=tpot)
        verdicts += det.tick(sim.now)
        _note_flagged(flagged, verdicts)
    return flagged, det, [t.device_uuid or "" for t in first]


def test_a_replica_whose_peers_stopped_teaching_its_cohort_is_not_judged_against_them() -> None:
    # the peers of before (their samples still in the cohort's minute) are not peers now:
    # the two replicas left have no one to be slower than, and are not judged on TPOT
    assert _rollout_pairs(HealthConfig(), peers_leave=True)[0] == {}
    # counted as peers, the record of before reads the rollout's 14% as theirs
    stale, _, first = _rollout_pairs(HealthConfig(tpot_peer_fresh_s=math.inf), peers_leave=True)
    assert set(stale) == set(first)
    assert all("tpot_vs_peers_log" in v.evidence for v in stale.values())


def test_a_replica_moved_to_a_band_no_peer_ran_keeps_no_excess_from_its_old_band() -> None:
    # the excess a replica had in its old band, a few seconds into a rollout, is not what it
    # is in a band no peer ran: it has no TPOT reading there, and is not judged on it
    flagged, det, first = _rollout_pairs(HealthConfig(), peers_leave=False, seconds=75)
    assert flagged == {}
    at_s = max(d.served_s for d in det.devices.values())
    for uuid in first:
        device = det.devices[uuid]
        assert device.tpot_fast > det._tpot_threshold(device)  # its old band's excess, kept
        _, soft = det.signals(uuid, device, at_s)
        assert "tpot_vs_peers_log" not in {r.name for r in soft}


def _regional_rollout(config: HealthConfig) -> tuple[dict[str, Verdict], str]:
    """One model on one accelerator type: eight replicas in one region and two in another.
    From 60 s a rollout slows the model 8% in the smaller region (one replica of it 12%),
    and one replica of the larger region becomes 15% slower (a grey failure of its own).
    The device-level verdicts, and that replica's device."""
    sim = _sim(nodes=16)
    det = HealthDetector(config)
    templates = _serving_templates(sim, det)
    by_region: dict[str, list[ServingMetrics]] = {}
    for t in sorted(templates.values(), key=lambda t: t.device_uuid or ""):
        if t.accelerator_type.value == "H100":
            by_region.setdefault(t.region, []).append(t.model_copy(update={"model": "llama-3-70b"}))
    big, small = sorted(by_region.values(), key=len, reverse=True)[:2]
    replicas = big[:8] + small[:2]
    assert len(replicas) == 10
    slow = {small[0].device_uuid: 1.08, small[1].device_uuid: 1.08 * 1.04, big[0].device_uuid: 1.15}
    noise = random.Random(11)
    flagged: dict[str, Verdict] = {}
    for second in range(200):
        verdicts = _fleet_second(sim, det, 5 + second)
        for template in replicas:
            ratio = slow.get(template.device_uuid, 1.0) if second >= 60 else 1.0
            tpot = 0.030 * ratio * (1.0 + noise.gauss(0.0, 0.01))
            verdicts += _serve(det, sim, template, batch=48, tpot=tpot)
        verdicts += det.tick(sim.now)
        _note_flagged(flagged, verdicts)
    return flagged, big[0].device_uuid or ""


def test_a_rollout_in_one_region_is_not_read_against_another_region_s_replicas() -> None:
    # a replica is judged against its region's peers: the small region's two replicas have
    # too few to be judged on TPOT (their probes still are); the large region's slow one is
    # found among its own
    # found among its own. (With one cohort for both regions, the small region's 12% replica
    # read 12% slow against the large region's and was flagged too)
    flagged, grey = _regional_rollout(HealthConfig())
    assert set(flagged) == {grey}
    assert "tpot_vs_peers_log" in flagged[grey].evidence
