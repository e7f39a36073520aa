"""The shared guardrail as scenario tables: fail-static, lockout, blast radius, rate."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controllers.guardrail import (
    Guardrail,
    GuardrailConfig,
    GuardrailState,
    GuardReason,
    Proposal,
)
from tests.factories import START

# two pools of 20 devices; each pool spread over two racks of 10
DEVICES = {
    f"{pool}-d{i:02d}": (pool, f"{pool}-rack{i // 10}") for pool in ("p1", "p2") for i in range(20)
}


def _guard(**config: float) -> Guardrail:
    # these tables use one ratio for pools and racks unless they say otherwise
    config.setdefault("rack_max_isolated_ratio", config.get("max_isolated_ratio", 0.1))
    g = Guardrail(GuardrailConfig(**config), devices=DEVICES)  # type: ignore[arg-type]
    g.observe(START)
    return g


def _isolate(guardrail: Guardrail, device: str, at_s: float = 1.0) -> GuardReason:
    return guardrail.check(
        Proposal(device, isolate=True), now=START + timedelta(seconds=at_s)
    ).reason


def test_blast_radius_caps_each_pool_and_rack() -> None:
    g = _guard(max_isolated_ratio=0.1, max_actions=100)
    assert _isolate(g, "p1-d00") is GuardReason.ALLOWED  # rack cap: max(1, 10% of 10) = 1
    assert _isolate(g, "p1-d01") is GuardReason.RACK_CAP
    assert _isolate(g, "p1-d10") is GuardReason.ALLOWED  # other rack; pool now 2 of 20
    assert _isolate(g, "p1-d11") is GuardReason.POOL_CAP  # pool: max(1, 10% of 20) = 2
    assert _isolate(g, "p2-d00") is GuardReason.ALLOWED  # another pool is untouched by p1's cap
    g2 = _guard(max_isolated_ratio=0.2, max_actions=100)
    for d in ("p1-d00", "p1-d01", "p1-d10", "p1-d11"):
        assert _isolate(g2, d) is GuardReason.ALLOWED  # racks 2 of 10, pool 4 of 20
    assert _isolate(g2, "p1-d02") is GuardReason.POOL_CAP  # pool at 4 of 20 (the cap)
    singles = {**DEVICES, **{f"p1-x{i}": ("p1", f"solo-{i}") for i in range(3)}}
    g3 = Guardrail(GuardrailConfig(max_isolated_ratio=0.1, max_actions=100), devices=singles)
    g3.observe(START)
    for d in ("p1-x0", "p1-x1"):  # single-device racks, so only the pool cap binds
        assert _isolate(g3, d) is GuardReason.ALLOWED  # pool of 23: max(1, 2) = 2
    assert _isolate(g3, "p1-x2") is GuardReason.POOL_CAP


def test_restore_is_never_refused_and_frees_room() -> None:
    g = _guard()
    assert _isolate(g, "p1-d00") is GuardReason.ALLOWED
    assert _isolate(g, "p1-d01") is GuardReason.RACK_CAP
    back = g.check(Proposal("p1-d00", isolate=False), now=START + timedelta(hours=5))
    assert back.allowed and back.reason is GuardReason.RESTORE  # even with stale telemetry
    assert _isolate(g, "p1-d01") is GuardReason.ALLOWED


@pytest.mark.parametrize(
    ("age_s", "expected"),
    [(0.0, GuardReason.ALLOWED), (30.0, GuardReason.ALLOWED), (30.5, GuardReason.STALE_TELEMETRY)],
)
def test_fail_static_when_telemetry_is_stale(age_s: float, expected: GuardReason) -> None:
    assert _isolate(_guard(stale_after_s=30.0), "p1-d00", at_s=age_s) is expected


def test_no_telemetry_yet_is_stale() -> None:
    g = Guardrail(GuardrailConfig(), devices=DEVICES)
    decision = g.check(Proposal("p1-d00", isolate=True), now=START)
    assert decision.reason is GuardReason.STALE_TELEMETRY and "none yet" in decision.message


def test_rate_limit_over_a_sliding_window() -> None:
    g = _guard(max_actions=2, rate_window_s=60.0, max_isolated_ratio=1.0)
    g.observe(START + timedelta(seconds=100))
    assert _isolate(g, "p1-d00", 10) is GuardReason.ALLOWED
    assert _isolate(g, "p1-d01", 20) is GuardReason.ALLOWED
    assert _isolate(g, "p1-d02", 30) is GuardReason.RATE_LIMITED
    assert _isolate(g, "p1-d02", 71) is GuardReason.ALLOWED  # the first left the window


def test_lockout_after_half_the_fleet_until_a_person_resets() -> None:
    g = _guard(max_isolated_ratio=1.0, max_actions=1000, lockout_ratio=0.5)
    devices = sorted(DEVICES)
    for d in devices[:20]:  # 20 of 40: this one still goes, the lockout engages behind it
        assert _isolate(g, d) is GuardReason.ALLOWED
    assert _isolate(g, devices[20]) is GuardReason.LOCKED_OUT
    assert _isolate(g, devices[0]) is GuardReason.LOCKED_OUT  # even a further step waits
    g.reset()
    assert _isolate(g, devices[20]) is GuardReason.ALLOWED


def test_a_further_step_on_an_isolated_device_adds_no_radius() -> None:
    g = _guard()
    assert _isolate(g, "p1-d00") is GuardReason.ALLOWED  # de-weight
    assert _isolate(g, "p1-d00") is GuardReason.ALLOWED  # then drain: not a second device


def test_unknown_device_and_bad_config_are_refused() -> None:
    assert _isolate(_guard(), "nope") is GuardReason.UNKNOWN_DEVICE
    for bad in (
        {"max_isolated_ratio": 0.0},
        {"lockout_ratio": float("nan")},
        {"lost_max_ratio": 1.5},
        {"stale_after_s": -1.0},
        {"max_actions": 0},
    ):
        with pytest.raises(ValueError):
            GuardrailConfig(**bad)


def test_state_round_trips_and_the_guardrail_resumes_from_it() -> None:
    g = _guard()
    _isolate(g, "p1-d00")
    restored = Guardrail(
        g.config, devices=DEVICES, state=GuardrailState.from_json(g.state.to_json())
    )
    assert restored.state == g.state
    assert _isolate(restored, "p1-d01") is GuardReason.RACK_CAP  # it remembers p1-d00


def test_racks_have_their_own_ratio_and_devices_can_join_later() -> None:
    g = _guard(max_isolated_ratio=0.5, rack_max_isolated_ratio=0.2, max_actions=100)
    assert _isolate(g, "p1-d00") is GuardReason.ALLOWED
    assert _isolate(g, "p1-d01") is GuardReason.ALLOWED  # rack cap: 20% of 10 = 2
    assert _isolate(g, "p1-d02") is GuardReason.RACK_CAP
    assert _isolate(g, "new-d0") is GuardReason.UNKNOWN_DEVICE
    g.register("new-d0", pool="p3", rack="p3-rack0")
    assert _isolate(g, "new-d0") is GuardReason.ALLOWED


def _pool_of_nodes(settled_s: float) -> tuple[Guardrail, dict[str, list[str]]]:
    """One pool of 20 devices (cap 2) in five nodes of four, one rack per node, each device
    registered with its node ``settled_s`` before the checks."""
    g = Guardrail(
        GuardrailConfig(max_isolated_ratio=0.1, rack_max_isolated_ratio=1.0, max_actions=100),
        devices={},
    )
    nodes = {f"n{k}": [f"n{k}-gpu{i}" for i in range(4)] for k in range(5)}
    for node, devices in nodes.items():
        for d in devices:
            g.register(d, pool="p", rack=f"rack-{node}", node=node, at=START)
    g.observe(START + timedelta(seconds=settled_s))
    return g, nodes


def test_one_whole_node_out_is_the_pools_spare_not_in_its_cap() -> None:
    g, nodes = _pool_of_nodes(settled_s=61)
    now = START + timedelta(seconds=61)
    drain = g.check(Proposal("n0", isolate=True, members=tuple(nodes["n0"])), now=now)
    assert drain.allowed  # a node as one unit, nothing else out
    for d in ("n1-gpu0", "n2-gpu0"):  # the pool's cap of 2 is still whole for devices
        assert g.check(Proposal(d, isolate=True), now=now).allowed
    third = g.check(Proposal("n3-gpu0", isolate=True), now=now)
    assert (third.allowed, third.reason) == (False, GuardReason.POOL_CAP)
    assert "6 of 20 isolated, 4 of them its spare node, cap 2" in third.message
    # one spare: a second whole node counts in full
    second = g.check(Proposal("n4", isolate=True, members=tuple(nodes["n4"])), now=now)
    assert (second.allowed, second.reason) == (False, GuardReason.POOL_CAP)
    # a node out device by device is whole once its last device is out
    g.check(Proposal("n0", isolate=False, members=tuple(nodes["n0"])), now=now)
    g.check(Proposal("n2-gpu0", isolate=False), now=now)
    assert g.check(Proposal("n1-gpu1", isolate=True), now=now).allowed  # n1: 2 of 4, cap 2
    assert not g.check(Proposal("n1-gpu2", isolate=True), now=now).allowed  # 3 of 4: not whole


def test_one_whole_node_out_is_the_racks_spare_too() -> None:
    """A rack of four 8-device nodes (cap 25%: one node's share), one device out for its
    own fault: a node whose cooling failed is still drained as one unit (it was refused for
    as long as it overheated, on a held-out seed), and a second node is not."""
    g = Guardrail(
        GuardrailConfig(max_isolated_ratio=1.0, rack_max_isolated_ratio=0.25, max_actions=100),
        devices={},
    )
    nodes = {f"n{k}": tuple(f"n{k}-gpu{i}" for i in range(8)) for k in range(4)}
    for node, devices in nodes.items():
        for d in devices:
            g.register(d, pool="p", rack="rack-0", node=node, at=START)
    now = START + timedelta(seconds=61)
    g.observe(now)
    assert g.check(Proposal("n0-gpu0", isolate=True), now=now).allowed
    hot = g.check(Proposal("n1", isolate=True, members=nodes["n1"]), now=now)
    assert hot.allowed, hot.message  # 1 (+8) of 32, 8 of them its spare node: cap 8 holds
    second = g.check(Proposal("n2", isolate=True, members=nodes["n2"]), now=now)
    assert (second.allowed, second.reason) == (False, GuardReason.RACK_CAP)
    assert "9 (+8) of 32 isolated, 8 of them its spare node, cap 8" in second.message
    for d in nodes["n0"][1:]:  # singles up to the cap (8) beside the spare node
        assert g.check(Proposal(d, isolate=True), now=now).allowed
    ninth = g.check(Proposal("n2-gpu0", isolate=True), now=now)
    assert (ninth.allowed, ninth.reason) == (False, GuardReason.RACK_CAP)  # one spare only


def test_a_node_whose_devices_are_still_being_named_is_not_a_spare() -> None:
    """After a restart the ladder names a node's devices as their verdicts come: the first
    two out are not the node, whatever the guardrail has seen of it so far."""
    g, nodes = _pool_of_nodes(settled_s=10)  # every device seen 10 s ago: not settled
    now = START + timedelta(seconds=10)
    assert g.check(Proposal("n0", isolate=True, members=tuple(nodes["n0"])), now=now).allowed
    late = g.check(Proposal("n1-gpu0", isolate=True), now=now)
    assert (late.allowed, late.reason) == (False, GuardReason.POOL_CAP)  # 5 of 20, cap 2
    later = START + timedelta(seconds=100)
    g.observe(later)  # n0 has settled now: it is the spare, and one device more fits
    assert g.check(Proposal("n1-gpu0", isolate=True), now=later).allowed
    g2, _ = _pool_of_nodes(settled_s=100)
    g2.register("n9-gpu0", pool="p", rack="rack-n9", node="n9")  # resumed: not yet named
    g2.register("n9-gpu1", pool="p", rack="rack-n9", node="n9", at=START)
    assert g2.check(Proposal("n1-gpu0", isolate=True), now=later).allowed
    pair = ("n9-gpu0", "n9-gpu1")
    out = g2.check(Proposal("n9", isolate=True, members=pair), now=later)
    assert (out.allowed, out.reason) == (False, GuardReason.POOL_CAP)  # 1 (+2) of 22, cap 2
    # n9-gpu0's own verdict names it; a minute on, n9 is known whole and is the spare
    g2.register("n9-gpu0", pool="p", rack="rack-n9", node="n9", at=later)
    minute_on = later + timedelta(seconds=60)
    g2.observe(minute_on)
    assert g2.check(Proposal("n9", isolate=True, members=pair), now=minute_on).allowed


def test_hard_faults_skip_blast_radius_and_rate_but_not_fail_static_or_lockout() -> None:
    g = _guard(max_isolated_ratio=0.1, max_actions=1, lockout_ratio=0.1)  # lockout at 4 of 40
    hard = [g.check(Proposal(f"p1-d0{i}", isolate=True, hard=True), now=START).reason
            for i in range(5)]  # fmt: skip
    assert hard[:4] == [GuardReason.ALLOWED] * 4  # rack cap 1, rate 1: not for dead devices
    assert hard[4] is GuardReason.LOCKED_OUT  # but a detector gone wrong still stops
    stale = _guard()
    late = START + timedelta(minutes=5)
    decision = stale.check(Proposal("p1-d00", isolate=True, hard=True), now=late)
    assert decision.reason is GuardReason.STALE_TELEMETRY


def test_scaling_fails_static_and_rate_limits_cools_but_not_warms() -> None:
    g = _guard(max_actions=2)
    now = START + timedelta(seconds=10)
    stale = g.check_scaling("m@p", remove=False, now=now, telemetry_at=now - timedelta(minutes=5))
    assert stale.reason is GuardReason.STALE_TELEMETRY
    cools = [g.check_scaling("m@p", remove=True, now=now, telemetry_at=now).reason
             for _ in range(3)]  # fmt: skip
    assert cools == [GuardReason.ALLOWED, GuardReason.ALLOWED, GuardReason.RATE_LIMITED]
    assert g.check_scaling("m@q", remove=True, now=now, telemetry_at=now).allowed  # per scope
    assert g.check_scaling("m@p", remove=False, now=now, telemetry_at=now).allowed  # warms pass
    g.state.locked_out = True
    assert g.check_scaling("m@q", remove=True, now=now, telemetry_at=now).reason is (
        GuardReason.LOCKED_OUT
    )
