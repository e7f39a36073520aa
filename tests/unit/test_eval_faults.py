"""`fleetloop eval faults --in-process`: the closed loop's pure steps on the simulated clock,
scored against the ground truth (the Kafka run is exercised by the integration tests)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from evaluations.fault_scoring import Fault, aggregate, faults_from_truth, score
from fleetloop.cli import main
from schemas.base import AcceleratorType
from schemas.verdicts import Decision, DecisionOutcome, HealthStatus, Verdict

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_demo_scenario_scores_perfectly_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "faults", "--scenario", "scenarios/demo.yaml", "--in-process",
                 "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    for key in ("precision", "recall", "false_isolations_per_1k_device_days", "ttd_p50_s",
                "ttd_p95_s", "hard_fault_isolation_p99_s"):  # fmt: skip
        assert key in out
    assert (out["precision"], out["recall"], out["false_isolations"]) == (1.0, 1.0, 0)
    assert out["per_kind"]["grey_slowdown"]["ttd_p95_s"] <= 30  # a 25% slowdown
    # a cold model is no fault; the rack whose feed is lost trips here (no power control
    # runs in this eval) and its dark devices are the overload's to detect
    assert set(out["per_kind"]) == {"ecc_storm", "grey_slowdown", "pdu_overload"}
    assert out["actions"]["quarantine"] >= 1 and out["actions"]["drain"] >= 1


def _verdict(device: str, status: HealthStatus, at_s: float) -> Verdict:
    return Verdict(
        verdict_id=uuid4(), observed_at=T0 + timedelta(seconds=at_s), device_uuid=device,
        node_id="n", region="r", rack_id="k", pool="p", accelerator_type=AcceleratorType.H100,
        status=status, previous_status=HealthStatus.HEALTHY, score=0.9,
    )  # fmt: skip


def test_scoring_counts_episodes_faults_and_false_isolations() -> None:
    faults = [Fault("f1", "grey_slowdown", T0 + timedelta(seconds=100),
                    T0 + timedelta(seconds=200), frozenset({"d1"}))]  # fmt: skip
    verdicts = [
        _verdict("d1", HealthStatus.DYING, 112),  # true, 12 s after the start
        _verdict("d1", HealthStatus.FAILED, 150),  # same episode: not a new detection
        _verdict("d2", HealthStatus.SUSPECT, 120),  # suspect is no detection
        _verdict("d3", HealthStatus.DYING, 130),  # false
        _verdict("d3", HealthStatus.HEALTHY, 140),
        _verdict("d1", HealthStatus.HEALTHY, 300),
        _verdict("d1", HealthStatus.DYING, 400),  # after the fault and its grace: false
    ]
    drain_d3 = Decision(
        decision_id=uuid4(), decided_at=T0 + timedelta(seconds=131), controller="isolation",
        target="d3", action="drain", outcome=DecisionOutcome.ISSUED, reason="degrading",
    )  # fmt: skip
    s = score(faults, verdicts, [drain_d3], {}, observed_s=86_400.0)
    assert (s.detections, s.true_detections, s.detected) == (3, 1, 1)
    assert s.precision == pytest.approx(1 / 3) and s.recall == 1.0
    assert s.ttd_s == {"grey_slowdown": [12.0]}
    assert s.false_isolations == 1
    assert s.device_days == 3.0  # three devices seen for a day
    assert s.summary()["false_isolations_per_1k_device_days"] == pytest.approx(333.33, abs=0.01)


def test_scoring_holds_grey_slowdowns_and_ecc_storms_to_their_targets() -> None:
    def at(seconds: float) -> datetime:
        return T0 + timedelta(seconds=seconds)

    def grey(name: str, device: str, ratio: float) -> Fault:
        span = (at(100), at(200))
        return Fault(
            name, "grey_slowdown", *span, frozenset({device}), params={"slowdown_ratio": ratio}
        )

    def storm(name: str, device: str) -> Fault:
        span = (at(100), at(400))
        return Fault(name, "ecc_storm", *span, frozenset({device}), params={"lead_s": 120.0})

    faults = [grey("g1", "d1", 0.2), grey("g2", "d2", 0.3), grey("g3", "d3", 0.1),
              storm("e1", "d4"), storm("e2", "d5")]  # fmt: skip
    verdicts = [
        _verdict("d1", HealthStatus.DYING, 112),
        _verdict("d3", HealthStatus.DYING, 190),  # under 15%: not held to the target
        _verdict("d4", HealthStatus.DYING, 180),  # before its double-bit fault at 220 s
        _verdict("d5", HealthStatus.FAILED, 221),  # at the fault: too late
    ]
    s = score(faults, verdicts, [], {}, observed_s=600.0).summary()
    assert s["grey_15pct_ttd_s"] == [12.0, None]  # d2's slowdown was missed
    assert s["ecc_storms_flagged_before_dbe"] == [1, 2]
    agg = aggregate({1: s, 2: s})
    assert (agg["grey_15pct_faults"], agg["grey_15pct_missed"]) == (4, 2)
    assert agg["grey_15pct_ttd_p95_s"] is None  # a miss is never detected: no p95 to give
    assert agg["grey_15pct_within_30s"] == 2
    assert agg["ecc_storms_flagged_before_dbe"] == [2, 4]


def test_time_to_isolate_waits_for_every_device_a_fault_harms() -> None:
    """A node fault is isolated when its last device is out (one by one, or the node as one
    unit); a refused step and a step after the fault's grace do not count."""
    start, end = T0 + timedelta(seconds=100), T0 + timedelta(seconds=400)
    faults = [
        Fault("crash", "node_crash", start, end, frozenset({"n-g0", "n-g1"}), frozenset({"n"})),
        Fault("grey", "grey_slowdown", start, end, frozenset({"m-g0"})),
        Fault("held", "grey_slowdown", start, end, frozenset({"m-g1"})),
    ]
    verdicts = [
        _verdict(d, HealthStatus.DYING, 105).model_copy(update={"node_id": d.split("-")[0]})
        for d in ("n-g0", "n-g1", "m-g0", "m-g1")
    ]

    def step(target: str, at_s: float, outcome: DecisionOutcome) -> Decision:
        return Decision(
            decision_id=uuid4(), decided_at=T0 + timedelta(seconds=at_s), controller="isolation",
            target=target, action="quarantine", outcome=outcome, reason="hard_fault",
        )  # fmt: skip

    issued, refused = DecisionOutcome.ISSUED, DecisionOutcome.REFUSED
    decisions = [
        step("n-g0", 106, issued), step("n-g1", 106, refused), step("n-g1", 136, issued),
        step("m", 130, issued),  # m drained as one unit: both its devices
        step("m-g1", 120, refused),
    ]  # fmt: skip
    s = score(faults, verdicts, decisions, {}, observed_s=86_400.0).summary()
    assert s["per_kind"]["node_crash"]["time_to_isolate_p50_s"] == 36.0  # its last device
    assert s["per_kind"]["grey_slowdown"]["isolated"] == 2  # both, by the node's drain at 130
    late = [step("x-g0", 500, issued)]  # after the fault and its grace: not its isolation
    faults_x = [Fault("x", "grey_slowdown", start, end, frozenset({"x-g0"}))]
    s2 = score(faults_x, [_verdict("x-g0", HealthStatus.DYING, 105)], late, {}, observed_s=86_400.0)
    assert s2.summary()["not_isolated"] == ["x (grey_slowdown)"]
    # a device already out when its fault begins (quarantined with its crashed node) is out
    early = [step("x-g0", 50, issued)]
    s3 = score(
        faults_x, [_verdict("x-g0", HealthStatus.DYING, 105)], early, {}, observed_s=86_400.0
    )
    assert s3.summary()["per_kind"]["grey_slowdown"]["time_to_isolate_p50_s"] == 0.0


def test_a_missed_flap_says_how_many_xids_its_device_threw() -> None:
    """The truth's XIDs (the simulator records each one a flap throws) go with the flap:
    a flap that threw one XID in its fault showed nothing a healthy device's occasional
    XID does not, and the evaluation says so of a flap it missed; one it found says
    nothing more."""
    start, end = T0 + timedelta(seconds=100), T0 + timedelta(seconds=400)

    def flap(fault_id: str, device: str) -> dict[str, object]:
        return {"record": "fault", "fault_id": fault_id, "kind": "flapping_xid",
                "device_uuid": device, "node_id": "n", "rack_id": "k",
                "start_at": start.isoformat(), "end_at": end.isoformat(), "params": {}}  # fmt: skip

    def xid(device: str, at_s: float) -> dict[str, object]:
        at = T0 + timedelta(seconds=at_s)
        return {"record": "consequence", "what": "xid", "target": device, "xid": 43.0,
                "t_s": at_s, "at": at.isoformat()}  # fmt: skip

    rows = [flap("f1-flapping_xid", "d1"), flap("f2-flapping_xid", "d2"), xid("d1", 250),
            xid("d2", 120), xid("d2", 150), xid("d2", 90), xid("d1", 450)]  # fmt: skip
    faults = faults_from_truth(rows, {"d1": ("n", "k"), "d2": ("n", "k")})
    assert [f.xids_thrown for f in faults] == [1, 2]  # only those inside the fault count
    s = score(faults, [_verdict("d2", HealthStatus.DYING, 160)], [], {}, observed_s=600.0)
    summary = s.summary()
    assert summary["missed"] == ["f1-flapping_xid"]
    assert summary["missed_evidence"] == {"f1-flapping_xid": "1 XID thrown in its 300 s"}
    assert summary["missed_flap_xids"] == {"f1-flapping_xid": 1}
    assert aggregate({1: summary, 2: summary})["missed_flaps_by_xids_thrown"] == {"1": 2}


def test_a_flap_that_threw_no_xid_is_listed_and_left_out_of_recall() -> None:
    """A flap whose device threw no XID in its window left nothing in the telemetry to
    find: it is listed apart, not counted missed; a flap with one XID still counts."""
    start, end = T0 + timedelta(seconds=100), T0 + timedelta(seconds=400)
    rows = [
        {"record": "fault", "fault_id": f"f{i}-flapping_xid", "kind": "flapping_xid",
         "device_uuid": f"d{i}", "node_id": "n", "rack_id": "k",
         "start_at": start.isoformat(), "end_at": end.isoformat(), "params": {}}
        for i in (1, 2, 3)
    ] + [
        {"record": "consequence", "what": "xid", "target": d, "xid": 43.0, "t_s": t,
         "at": (T0 + timedelta(seconds=t)).isoformat()}
        for d, t in (("d1", 200), ("d2", 150), ("d2", 180), ("d3", 50))  # d3's before it
    ]  # fmt: skip
    faults = faults_from_truth(rows, {d: ("n", "k") for d in ("d1", "d2", "d3")})
    assert [f.xids_thrown for f in faults] == [1, 2, 0]
    s = score(faults, [_verdict("d2", HealthStatus.DYING, 190)], [], {}, observed_s=600.0)
    assert (s.no_trace, s.missed) == (["f3-flapping_xid"], ["f1-flapping_xid"])
    assert (s.faults, s.detected, s.recall) == (3, 1, 0.5)
    assert aggregate({1: s.summary()})["no_trace_total"] == 1


def test_a_fault_that_begins_on_devices_held_failed_is_found_with_no_time_to_detect() -> None:
    """A rack's breaker trips and its node goes dark (failed, as one unit); a crash drawn
    on that node later, while it is still dark, has nothing new to show. It counts as
    found, listed as such, with no time to detect. A fault on a node only half held
    failed, or on one that comes back inside the fault, is still to be seen."""

    def fault(fid: str, kind: str, start: float, end: float, devices: set[str]) -> Fault:
        return Fault(fid, kind, T0 + timedelta(seconds=start), T0 + timedelta(seconds=end),
                     frozenset(devices))  # fmt: skip

    faults = [
        fault("trip", "pdu_overload", 50, 400, {"a1", "a2", "b1", "b2", "c1"}),
        fault("crash-a", "node_crash", 100, 200, {"a1", "a2"}),
        fault("crash-b", "node_crash", 100, 200, {"b1", "b2"}),
        fault("crash-c", "node_crash", 100, 200, {"c1"}),
    ]
    verdicts = [_verdict(d, HealthStatus.FAILED, 55) for d in ("a1", "a2", "b1", "b2", "c1")]
    verdicts += [
        _verdict("b2", HealthStatus.HEALTHY, 90),  # back before the crash: it had to be seen
        _verdict("c1", HealthStatus.HEALTHY, 150),  # back inside it: so had this one
        _verdict("a1", HealthStatus.HEALTHY, 300),  # back after it: nothing to see
    ]
    s = score(faults, sorted(verdicts, key=lambda v: v.observed_at), [], {}, observed_s=86_400.0)
    assert s.already_failed == ["crash-a"] and s.missed == ["crash-b", "crash-c"]
    assert s.recall == pytest.approx(2 / 4)
    assert "node_crash" not in s.ttd_s
    assert s.summary()["found_already_failed"] == ["crash-a"]
    assert aggregate({1: s.summary()})["found_already_failed_total"] == 1


def test_a_fault_that_begins_on_a_device_held_failed_is_timed_from_its_return() -> None:
    """Seed 158 of fleet-mix: a rack's breaker trips, its node goes dark (failed), and a
    grey slowdown begins on one of its devices while it is dark. The slowdown can first be
    seen when the node is back: its time to detect counts from there, and the fault is
    listed with the seconds it was held. A fault on a device in service is timed from its
    own start, as before."""
    faults = [
        Fault("grey-dark", "grey_slowdown", T0 + timedelta(seconds=100),
              T0 + timedelta(seconds=600), frozenset({"a1"}), params={"slowdown_ratio": 0.2}),
        Fault("grey-lit", "grey_slowdown", T0 + timedelta(seconds=100),
              T0 + timedelta(seconds=600), frozenset({"b1"}), params={"slowdown_ratio": 0.2}),
    ]  # fmt: skip
    verdicts = [
        _verdict("a1", HealthStatus.FAILED, 50),  # the node went dark before the slowdown
        _verdict("b1", HealthStatus.HEALTHY, 50),
        _verdict("a1", HealthStatus.HEALTHY, 380),  # back: 280 s after the slowdown began
        _verdict("a1", HealthStatus.DYING, 400),  # named 20 s after it could be seen
        _verdict("b1", HealthStatus.DYING, 400),  # named 300 s after it began
    ]
    s = score(faults, verdicts, [], {}, observed_s=86_400.0)
    assert s.recall == 1.0 and s.already_failed == []
    assert sorted(s.ttd_s["grey_slowdown"]) == [20.0, 300.0]
    assert s.grey_ttd_s == [20.0, 300.0]
    assert s.summary()["timed_from_return"] == {"grey-dark": 280.0}
    assert aggregate({1: s.summary()})["timed_from_return_total"] == 1
