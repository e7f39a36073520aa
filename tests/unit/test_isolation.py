"""The isolation ladder as scenario tables: rungs, dwell, probation, guardrail refusals."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from controllers.guardrail import Guardrail, GuardrailConfig, GuardrailState
from controllers.isolation import REASONS, IsolationLadder, LadderConfig, LadderDecision, Rung
from schemas.base import AcceleratorType
from schemas.commands import RouteAction
from schemas.verdicts import HARD_CONFIRMED, HealthStatus, Level, Signal, Verdict
from tests.factories import START


def _verdict(device: str, status: HealthStatus, at_s: float, rack: str = "rack-0") -> Verdict:
    return Verdict(
        verdict_id=uuid.uuid4(),
        observed_at=START + timedelta(seconds=at_s),
        device_uuid=device,
        node_id=device.split("-gpu")[0],
        region="us-east",
        rack_id=rack,
        pool="us-east-h100",
        accelerator_type=AcceleratorType.H100,
        status=status,
        previous_status=HealthStatus.HEALTHY,
        score=0.9,
        evidence="test",
    )


def _ladder(**config: float) -> IsolationLadder:
    guard = Guardrail(
        GuardrailConfig(max_isolated_ratio=1.0, rack_max_isolated_ratio=1.0, max_actions=100),
        devices={f"n{i}-gpu0": ("us-east-h100", "rack-0") for i in range(10)},
    )
    return IsolationLadder(LadderConfig(**config), guard)


def _at(seconds: float):  # type: ignore[no-untyped-def]
    return START + timedelta(seconds=seconds)


def test_hard_fault_quarantines_at_once() -> None:
    ladder = _ladder()
    [d] = ladder.verdict(_verdict("n0-gpu0", HealthStatus.FAILED, 1), now=_at(1))
    assert (d.action, d.allowed, d.reason) == (RouteAction.QUARANTINE, True, "hard_fault")
    assert ladder.rung("n0-gpu0") is Rung.QUARANTINED


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # (verdict status or None for a tick, at_s) -> actions taken in order
        (
            [("dying", 0), (None, 5), (None, 10), (None, 20), (None, 25), (None, 30)],
            [RouteAction.DEWEIGHT, RouteAction.STOP_NEW_SESSIONS, RouteAction.DRAIN],
        ),
        ([("suspect", 0), (None, 60)], []),  # suspect holds: no action
        ([("dying", 0), ("suspect", 3), (None, 30)], [RouteAction.DEWEIGHT]),  # held at rung 1
        (
            [("dying", 0), ("healthy", 5), (None, 100), (None, 126)],
            [RouteAction.DEWEIGHT, RouteAction.RESTORE],  # probation 120 s, then restore
        ),
        (
            [("dying", 0), ("healthy", 5), ("suspect", 100), ("healthy", 110), (None, 126)],
            [RouteAction.DEWEIGHT],  # a relapse restarts probation
        ),
    ],
)
def test_ladder_steps(steps: list[tuple[str | None, float]], expected: list[RouteAction]) -> None:
    ladder = _ladder()
    actions = []
    for status, at in steps:
        if status is None:
            out = ladder.tick(_at(at))
        else:
            out = ladder.verdict(_verdict("n0-gpu0", HealthStatus(status), at), now=_at(at))
        actions += [d.action for d in out if d.allowed]
    assert actions == expected


def test_deweight_carries_its_ratio() -> None:
    ladder = _ladder(deweight_ratio=0.25)
    [d] = ladder.verdict(_verdict("n0-gpu0", HealthStatus.DYING, 0), now=_at(0))
    assert d.weight_ratio == 0.25


def test_guardrail_refusal_is_a_decision_and_is_retried_later() -> None:
    guard = Guardrail(
        GuardrailConfig(max_isolated_ratio=0.1, rack_max_isolated_ratio=0.1),
        devices={f"n{i}-gpu0": ("us-east-h100", "rack-0") for i in range(10)},
    )
    ladder = IsolationLadder(LadderConfig(retry_s=30, step_dwell_s=0), guard)
    assert ladder.verdict(_verdict("n0-gpu0", HealthStatus.DYING, 0), now=_at(0))[0].allowed
    [refused] = ladder.verdict(_verdict("n1-gpu0", HealthStatus.DYING, 1), now=_at(1))
    assert (refused.allowed, refused.reason) == (False, "pool_cap")
    assert refused.reason in REASONS

    def n1(out: list[LadderDecision]) -> list[LadderDecision]:
        return [d for d in out if d.device_uuid == "n1-gpu0"]

    assert n1(ladder.tick(_at(10))) == []  # no refusal spam before retry_s
    [again] = n1(ladder.tick(_at(31)))
    assert (again.allowed, again.reason) == (False, "pool_cap")
    # n0 recovers and is restored; then n1's retry goes through
    ladder.verdict(_verdict("n0-gpu0", HealthStatus.HEALTHY, 40), now=_at(40))
    out = ladder.tick(_at(161))
    assert [(d.device_uuid, d.action) for d in out if d.allowed] == [
        ("n0-gpu0", RouteAction.RESTORE)
    ]
    out = ladder.verdict(_verdict("n1-gpu0", HealthStatus.DYING, 162), now=_at(162))
    assert [(d.device_uuid, d.action) for d in out if d.allowed] == [
        ("n1-gpu0", RouteAction.DEWEIGHT)
    ]
    # a failed device is quarantined even with the pool at its cap, once a second sample
    # confirmed the evidence it reported of itself: it is no capacity to lose
    failed = _verdict("n2-gpu0", HealthStatus.FAILED, 163)
    [single] = ladder.verdict(failed, now=_at(163))
    assert (single.allowed, single.reason) == (False, "pool_cap")  # one sample: under the cap
    dbe = Signal(name="ecc_dbe", value=1, threshold=1)
    sure = Signal(name=HARD_CONFIRMED, value=2, threshold=2)
    confirmed = failed.model_copy(update={"signals": (dbe, sure), "observed_at": _at(164)})
    [hard] = ladder.verdict(confirmed, now=_at(164))  # confirmed: asked again at once
    assert (hard.action, hard.allowed, hard.reason) == (RouteAction.QUARANTINE, True, "hard_fault")


def test_stale_verdicts_fail_static() -> None:
    ladder = _ladder()
    old = _verdict("n0-gpu0", HealthStatus.FAILED, 0)
    [d] = ladder.verdict(old, now=_at(300))  # evidence five minutes old
    assert (d.allowed, d.reason) == (False, "stale_telemetry")
    assert ladder.rung("n0-gpu0") is Rung.ACTIVE


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="deweight_ratio"):
        LadderConfig(deweight_ratio=1.5)
    with pytest.raises(ValueError, match="probation_s"):
        LadderConfig(probation_s=float("nan"))


def _node_verdict(node: str, status: HealthStatus, at_s: float) -> Verdict:
    return _verdict(node, status, at_s).model_copy(
        update={"level": Level.NODE, "scope": node, "node_id": node, "pool": "*", "members": 8,
                "attribution": f"thermal_resid_celsius shared by its devices, node {node}"}
    )  # fmt: skip


def test_a_node_that_deviates_as_one_is_drained_as_one_unit_and_restored() -> None:
    devices = {f"n1-gpu{i}": ("us-east-h100", "rack-0") for i in range(4)}
    devices |= {f"n{k}-gpu0": ("us-east-h100", "rack-0") for k in range(2, 6)}
    guard = Guardrail(
        GuardrailConfig(max_isolated_ratio=1.0, rack_max_isolated_ratio=1.0, max_actions=2),
        devices=devices,
    )
    ladder = IsolationLadder(LadderConfig(probation_s=60), guard)
    for device in sorted(devices):  # the ladder learns each node's devices from their verdicts
        assert ladder.verdict(_verdict(device, HealthStatus.HEALTHY, 0), now=_at(0)) == []
    [drain] = ladder.verdict(_node_verdict("n1", HealthStatus.DYING, 10), now=_at(10))
    assert (drain.action, drain.unit, drain.device_uuid) == (RouteAction.DRAIN, Level.NODE, "n1")
    assert (drain.allowed, drain.reason) == (True, "node_fault")
    assert guard.state.isolated == {f"n1-gpu{i}" for i in range(4)}
    assert len(guard.state.actions) == 1  # one unit, one action for the rate limit
    assert ladder.verdict(_node_verdict("n1", HealthStatus.DYING, 20), now=_at(20)) == []
    # one device of the node also fails on its own, and stays out when the node comes back
    [q] = ladder.verdict(_verdict("n1-gpu2", HealthStatus.FAILED, 30), now=_at(30))
    assert q.action is RouteAction.QUARANTINE and q.allowed
    assert ladder.verdict(_node_verdict("n1", HealthStatus.HEALTHY, 40), now=_at(40)) == []
    [back] = ladder.tick(_at(101))
    assert (back.action, back.unit, back.reason) == (RouteAction.RESTORE, Level.NODE, "recovered")
    assert guard.state.isolated == {"n1-gpu2"}
    # a rack's or a cohort's verdict moves nothing
    rack = _node_verdict("rack-0", HealthStatus.DYING, 110).model_copy(update={"level": Level.RACK})
    assert ladder.verdict(rack, now=_at(110)) == []


def test_a_node_drain_passes_the_blast_radius_for_every_device_it_takes() -> None:
    devices = {f"n1-gpu{i}": ("us-east-h100", "rack-0") for i in range(4)}
    devices |= {f"n{k}-gpu0": ("us-east-h100", "rack-0") for k in range(2, 10)}
    guard = Guardrail(GuardrailConfig(rack_max_isolated_ratio=1.0), devices=devices)  # pool: 10%
    ladder = IsolationLadder(LadderConfig(), guard)
    for device in sorted(devices):
        ladder.verdict(_verdict(device, HealthStatus.HEALTHY, 0), now=_at(0))
    [out] = ladder.verdict(_verdict("n2-gpu0", HealthStatus.FAILED, 5), now=_at(5))
    assert out.allowed  # one device out of the pool's 12: its 10% cap (1) is spent
    # its devices were named 10 s ago: not yet known as a whole node, so no spare either
    [refused] = ladder.verdict(_node_verdict("n1", HealthStatus.DYING, 10), now=_at(10))
    assert (refused.allowed, refused.reason) == (False, "pool_cap")
    assert "1 (+4) of 12" in refused.message and guard.state.isolated == {"n2-gpu0"}
    ladder.verdict(_verdict("n2-gpu0", HealthStatus.HEALTHY, 11), now=_at(11))
    at = 11 + LadderConfig().probation_s
    [back] = ladder.verdict(_verdict("n2-gpu0", HealthStatus.HEALTHY, at), now=_at(at))
    assert back.action is RouteAction.RESTORE
    # nothing else out: a pool may always lose one node, though it is over its 10%
    [drain] = ladder.verdict(_node_verdict("n1", HealthStatus.DYING, at), now=_at(at))
    assert (drain.action, drain.unit, drain.allowed) == (RouteAction.DRAIN, Level.NODE, True)


def test_a_drained_node_is_its_pools_spare_and_device_faults_still_get_the_cap() -> None:
    """The node is known whole (its devices named a minute ago): drained, it is the pool's
    spare node, so the pool's 10% cap still takes a device fault of another node."""
    devices = {f"n1-gpu{i}": ("us-east-h100", "rack-0") for i in range(4)}
    devices |= {f"n{k}-gpu0": ("us-east-h100", "rack-0") for k in range(2, 12)}
    guard = Guardrail(GuardrailConfig(rack_max_isolated_ratio=1.0), devices=devices)  # cap 1
    ladder = IsolationLadder(LadderConfig(), guard)
    for device in sorted(devices):
        ladder.verdict(_verdict(device, HealthStatus.HEALTHY, 0), now=_at(0))
    [drain] = ladder.verdict(_node_verdict("n1", HealthStatus.DYING, 70), now=_at(70))
    assert (drain.unit, drain.allowed) == (Level.NODE, True)
    [first] = ladder.verdict(_verdict("n2-gpu0", HealthStatus.DYING, 71), now=_at(71))
    assert (first.action, first.allowed) == (RouteAction.DEWEIGHT, True)  # 5 of 14, 4 spare
    [second] = ladder.verdict(_verdict("n3-gpu0", HealthStatus.DYING, 72), now=_at(72))
    assert (second.allowed, second.reason) == (False, "pool_cap")  # the cap (1) is spent
    assert "4 of them its spare node" in second.message


def _lost(device: str, at_s: float) -> Verdict:
    """A device whose node's heartbeat stopped ``heartbeat_lost_s`` (15 s) ago."""
    lost = Signal(name="heartbeat_lost_s", value=15, threshold=10)
    return _verdict(device, HealthStatus.FAILED, at_s).model_copy(update={"signals": [lost]})


def test_a_lost_node_is_quarantined_as_one_unit_and_is_its_pools_spare() -> None:
    """A node crash fills no cap device by device: eight devices in a pool of 64 (cap 6) go
    out together on the first silent device's verdict, and, known whole, the node is the
    pool's spare, so a device fault elsewhere in the pool still gets the cap."""
    devices = {f"n{k}-gpu{i}": ("us-east-h100", "rack-0") for k in range(8) for i in range(8)}
    guard = Guardrail(GuardrailConfig(rack_max_isolated_ratio=1.0), devices=devices)
    ladder = IsolationLadder(LadderConfig(), guard)
    for device in sorted(devices):
        ladder.verdict(_verdict(device, HealthStatus.HEALTHY, 0), now=_at(0))
    out = ladder.verdict(_lost("n1-gpu3", 100), now=_at(100))
    assert {d.device_uuid for d in out} == {f"n1-gpu{i}" for i in range(8)}
    assert all((d.action, d.allowed, d.reason) == (RouteAction.QUARANTINE, True, "hard_fault")
               for d in out)  # fmt: skip
    assert "node n1 lost" in out[0].message and len(guard.state.actions) == 1
    for i in (0, 1, 2, 4, 5, 6, 7):  # the other devices' own verdicts find them there
        assert ladder.verdict(_lost(f"n1-gpu{i}", 100), now=_at(100)) == []
    [slow] = ladder.verdict(_verdict("n2-gpu5", HealthStatus.DYING, 110), now=_at(110))
    assert (slow.action, slow.allowed) == (RouteAction.DEWEIGHT, True)  # the spare is beside
    # the node comes back: each device on its own probation
    for i in range(8):
        ladder.verdict(_verdict(f"n1-gpu{i}", HealthStatus.HEALTHY, 200), now=_at(200))
    back = ladder.tick(_at(200 + LadderConfig().probation_s))
    assert {d.device_uuid for d in back if d.action is RouteAction.RESTORE} >= {
        f"n1-gpu{i}" for i in range(8)
    }
    assert not guard.state.isolated & {f"n1-gpu{i}" for i in range(8)}


def test_lost_nodes_leave_past_the_caps_until_half_the_pool_is_out() -> None:
    """A dead node serves nothing, and traffic sent to it fails: lost nodes go out past the
    pool's 10% and the rack's 25% (a health check removing dead hosts), until half the pool
    would be out; past that, losing more looks like our view, not the fleet, and is
    refused as a unit, none of it let in. The caps count no lost device: they are for what
    the detector judges, so a grey device still gets the pool's cap."""
    devices = {
        f"n{k}-gpu{i}": ("us-east-h100", f"rack-{k // 4}") for k in range(8) for i in range(8)
    }
    guard = Guardrail(GuardrailConfig(), devices=devices)  # pool 64 (cap 6), racks 32 (cap 8)
    ladder = IsolationLadder(LadderConfig(), guard)
    for device in sorted(devices):
        ladder.verdict(_verdict(device, HealthStatus.HEALTHY, 0), now=_at(0))
    for k in range(4):  # 32 of 64; rack-0 wholly out
        assert len(ladder.verdict(_lost(f"n{k}-gpu0", 100 + k), now=_at(100 + k))) == 8
    [refused] = ladder.verdict(_lost("n4-gpu0", 110), now=_at(110))
    assert (refused.allowed, refused.reason) == (False, "pool_cap")
    assert "32 (+8) of 64" in refused.message and "lost node" in refused.message
    assert not guard.state.isolated & {f"n4-gpu{i}" for i in range(8)}
    [grey] = ladder.verdict(_verdict("n5-gpu1", HealthStatus.DYING, 111), now=_at(111))
    assert (grey.action, grey.allowed) == (RouteAction.DEWEIGHT, True)
    assert guard.state.lost == {f"n{k}-gpu{i}" for k in range(4) for i in range(8)}
    restored = GuardrailState.from_json(guard.state.to_json())
    assert (restored.lost, restored.isolated) == (guard.state.lost, guard.state.isolated)


def _hot(node: str, celsius: float, at_s: float) -> Verdict:
    thermal = Signal(name="thermal_resid_celsius", value=celsius, threshold=8.0)
    slow = Signal(name="probe_slow", value=3, threshold=2)  # a count: it never recedes
    return _node_verdict(node, HealthStatus.DYING, at_s).model_copy(
        update={"signals": (thermal, slow)}
    )


def test_a_step_that_waited_behind_the_cap_is_not_taken_once_its_evidence_receded() -> None:
    """A node overheats while its pool's cap is spent; by the time room comes its cooling is
    back and its temperature falling: the drain that waited is not taken then, and is taken
    if the heat comes back."""
    devices = {f"n1-gpu{i}": ("us-east-h100", "rack-0") for i in range(4)}
    devices |= {f"n{k}-gpu0": ("us-east-h100", "rack-0") for k in range(2, 10)}
    guard = Guardrail(GuardrailConfig(rack_max_isolated_ratio=1.0), devices=devices)  # pool: 10%
    ladder = IsolationLadder(LadderConfig(retry_s=30), guard)
    for device in sorted(devices):
        ladder.verdict(_verdict(device, HealthStatus.HEALTHY, 0), now=_at(0))
    dbe = Signal(name="ecc_dbe", value=1, threshold=1)
    sure = Signal(name=HARD_CONFIRMED, value=2, threshold=2)
    for device in ("n2-gpu0", "n3-gpu0"):  # two devices out on their own: past the cap (1)
        failed = _verdict(device, HealthStatus.FAILED, 5).model_copy(
            update={"signals": (dbe, sure)}
        )
        assert ladder.verdict(failed, now=_at(5))[0].allowed
    [refused] = ladder.verdict(_hot("n1", 16.0, 10), now=_at(10))
    assert (refused.allowed, refused.reason) == (False, "pool_cap")
    for at, celsius in ((40, 36.0), (70, 30.0)):  # still held back; the heat peaks at 36 C
        [again] = ladder.verdict(_hot("n1", celsius, at), now=_at(at))
        assert (again.allowed, again.reason) == (False, "pool_cap")
    # the node cools: 36 -> 17 C is more than its 8 C threshold; the step is held, not asked
    [held] = ladder.verdict(_hot("n1", 17.0, 190), now=_at(190))
    assert (held.action, held.unit, held.allowed) == (RouteAction.DRAIN, Level.NODE, False)
    assert held.reason == "receded" and held.reason in REASONS
    assert "thermal_resid_celsius 36 -> 17 (threshold 8)" in held.message
    # room comes (n2, n3 restored); the node is still cooling: held again, not drained
    for device in ("n2-gpu0", "n3-gpu0"):
        ladder.verdict(_verdict(device, HealthStatus.HEALTHY, 80), now=_at(80))
    assert [d.action for d in ladder.tick(_at(200))] == [RouteAction.RESTORE] * 2
    assert ladder.verdict(_hot("n1", 17.5, 210), now=_at(210)) == []  # asked again in retry_s
    [again] = ladder.verdict(_hot("n1", 18.0, 221), now=_at(221))
    assert (again.allowed, again.reason) == (False, "receded")
    assert guard.state.isolated == set()
    # the heat comes back within its threshold of the peak: the drain is taken
    [drain] = ladder.verdict(_hot("n1", 29.0, 251), now=_at(251))
    assert (drain.allowed, drain.reason) == (True, "node_fault")
    assert guard.state.isolated == {f"n1-gpu{i}" for i in range(4)}


def test_a_step_taken_without_waiting_is_judged_on_its_evidence_alone() -> None:
    """A step the guardrail never refused has no wait to recede over: a device whose
    evidence falls but stays over its threshold steps up its ladder as before."""
    ladder = _ladder(step_dwell_s=0)
    tpot = "tpot_vs_peers_log"
    for at, value in ((0, 0.4), (1, 0.12)):
        signal = Signal(name=tpot, value=value, threshold=0.0953)
        v = _verdict("n0-gpu0", HealthStatus.DYING, at).model_copy(update={"signals": (signal,)})
        [step] = ladder.verdict(v, now=_at(at))
        assert step.allowed
    assert ladder.rung("n0-gpu0") is Rung.NO_NEW_SESSIONS
