"""The detector's per-device records survive a restart as plain JSON."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import UTC, datetime

from agents.sim.scenario import FaultKind, FaultSpec, FleetSpec, Scenario, TargetSpec
from agents.sim.simulation import Simulation
from models.health import HealthDetector
from models.health_memory import recall, remember
from schemas.events import AcceleratorTelemetry, NodeHealth, ServingMetrics
from schemas.state import DetectorMemory

START = datetime(2026, 5, 1, tzinfo=UTC)


def _learned(seconds: int) -> HealthDetector:
    flaps = FaultSpec(
        kind=FaultKind.FLAPPING_XID, target=TargetSpec(node=0, device=1), start_s=10,
        duration_s=60,
    )  # fmt: skip
    sim = Simulation(
        Scenario(name="memory", fleet=FleetSpec(nodes=3, seed=5), faults=(flaps,)), start=START
    )
    detector = HealthDetector()
    for n in range(seconds):
        for _, e in sim.tick(n):
            if isinstance(e, AcceleratorTelemetry | NodeHealth | ServingMetrics):
                detector.observe(e, appended_at=e.observed_at, source=("t", 0))
    return detector


def test_every_record_round_trips_through_the_state_topics_contract() -> None:
    before = _learned(90)
    after = HealthDetector()
    for device_uuid, d in before.devices.items():
        record = DetectorMemory(device_uuid=device_uuid, node_id=d.node_id, memory=remember(d))
        wire = record.model_dump_json()
        assert len(wire) < 2048  # small enough for a fleet of them
        back = DetectorMemory.model_validate_json(wire)
        assert after.adopt(device_uuid, recall(back.memory))
    assert set(after.devices) == set(before.devices)
    for device_uuid, d in before.devices.items():
        said = replace(d, source=None, keepalive_s=-math.inf, confirmed_emitted=False)
        assert after.devices[device_uuid] == said, device_uuid
    assert any(d.xid_cusum > 0 for d in after.devices.values())  # the flap statistic is kept
    assert all(d.ecc_quiet_s > 0 for d in after.devices.values())  # ECC baselines
    assert set(after.node_devices) == set(before.node_devices)


def test_a_record_older_than_what_the_detector_saw_is_not_taken() -> None:
    detector = _learned(30)
    device_uuid, d = next(iter(detector.devices.items()))
    older = recall(json.loads(json.dumps(remember(d))))
    older.live_s -= 10
    assert not detector.adopt(device_uuid, older)
    assert detector.devices[device_uuid] is d
