"""`fleetloop eval faults --in-process`: the closed loop's pure steps on the simulated clock,
scored against the ground truth (the Kafka run is exercised by the integration tests)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from evaluations.fault_scoring import Fault, score
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
