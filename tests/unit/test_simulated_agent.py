from collections import Counter

import pytest

from agents.simulated import SimulatedFleetAgent
from schemas.base import AcceleratorType
from schemas.codec import encode
from schemas.events import AcceleratorTelemetry, NodeHealth
from tests.factories import START


def _agent(seed: int = 3) -> SimulatedFleetAgent:
    return SimulatedFleetAgent(nodes=10, devices_per_node=8, seed=seed, start=START)


def test_same_seed_gives_identical_bytes() -> None:
    a, b = _agent(), _agent()
    for n in range(3):
        assert [encode(v) for _, v in a.tick(n)] == [encode(v) for _, v in b.tick(n)]
    assert [encode(v) for _, v in _agent(4).tick(0)] != [encode(v) for _, v in _agent(3).tick(0)]


def test_tick_has_every_family_in_expected_counts() -> None:
    events = _agent().tick(0)
    counts = Counter(spec.name for spec, _ in events)
    assert counts["telemetry.accelerator.v1"] == 80
    assert counts["telemetry.node_health.v1"] == 10
    assert counts["telemetry.serving.v1"] == 60  # one per loaded replica, two spares a node
    assert counts["telemetry.pdu.v1"] == 3  # 4 nodes per rack
    assert counts["telemetry.demand.v1"] == 6
    assert len({v.event_id for _, v in events}) == len(events)  # type: ignore[attr-defined]


def test_fields_a_device_cannot_report_are_null_never_zero() -> None:
    events = [v for _, v in _agent().tick(0) if isinstance(v, AcceleratorTelemetry)]
    by_type = {v.accelerator_type: v for v in events}
    mtia = by_type[AcceleratorType.MTIA]
    assert mtia.memory_temp_celsius is None and mtia.xid_last is None
    assert mtia.nvlink_errors_total is None and mtia.mem_clock_mhz is None
    h100 = by_type[AcceleratorType.H100]
    assert h100.nvlink_errors_total == 0 and h100.memory_temp_celsius is not None


def test_probes_run_every_probe_every_ticks() -> None:
    agent = _agent()
    health = [v for _, v in agent.tick(0) if isinstance(v, NodeHealth)]
    assert all(len(h.probes) == 8 for h in health)
    health = [v for _, v in agent.tick(1) if isinstance(v, NodeHealth)]
    assert all(h.probes == () for h in health)


def test_start_must_be_timezone_aware() -> None:
    with pytest.raises(ValueError, match="timezone"):
        SimulatedFleetAgent(nodes=1, devices_per_node=1, seed=1, start=START.replace(tzinfo=None))
