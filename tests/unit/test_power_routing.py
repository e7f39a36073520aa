"""Power-aware routing (:mod:`controllers.power_routing`): a replica our caps hold down is
weighted to its peers' TPOT, and back to 1 when the caps lift.

The pool here is the batch-slot model itself, each replica with a fixed time per token
(``tau``): a router splits the pool's request intensity by weight, and a replica at
intensity ``a`` runs TPOT ``tau / (1 - a tau / D)``, batch ``a * TPOT``. A capped
device's ``tau`` is its uncapped one over its clock.
"""

from __future__ import annotations

import pytest

from controllers.power_routing import (
    PoolWeight,
    PowerRouter,
    PowerRouteReason,
    PowerRoutingConfig,
    ReplicaServing,
)

DOUBLING = 128.0
TAU_S = 0.020  # per token at a batch of one, full clock


def _period(
    taus: dict[str, float], weights: dict[str, float], total: float, held: set[str]
) -> list[ReplicaServing]:
    """One period of the pool at total intensity ``total`` (sequences per second of TPOT),
    split by weight."""
    share = sum(weights.values())
    out = []
    for u, tau in taus.items():
        a = total * weights[u] / share
        tpot = tau / max(1e-6, 1.0 - a * tau / DOUBLING)
        out.append(ReplicaServing(u, "rack-0" if u in held else "rack-1", tau, a * tpot, tpot,
                                  held=u in held))  # fmt: skip
    return out


def _run(
    router: PowerRouter, taus: dict[str, float], held: set[str], periods: int, total: float,
    *, crowded: bool = False,
) -> tuple[dict[str, float], list[int]]:  # fmt: skip
    weights = {u: router.weight("pool", u) for u in taus}
    changes = []
    for _ in range(periods):
        period = _period(taus, weights, total, held)
        moves = router.step("pool", period, doubling_batch=DOUBLING, crowded=crowded)
        for w in moves:
            weights[w.device_uuid] = w.weight
        changes.append(len(moves))
    return weights, changes


def _tpots(taus: dict[str, float], weights: dict[str, float], total: float) -> dict[str, float]:
    return {r.device_uuid: r.tpot_s for r in _period(taus, weights, total, set())}


def test_a_capped_replica_is_weighted_to_its_peers_tpot_and_stays_there() -> None:
    taus = {f"gpu-{i}": TAU_S for i in range(8)}
    taus["gpu-0"] = taus["gpu-1"] = TAU_S / 0.7  # capped to 70% of its clock
    held = {"gpu-0", "gpu-1"}
    total = 8 * 0.55 * DOUBLING / TAU_S  # 55% of the slots at full clock
    unweighted = _tpots(taus, dict.fromkeys(taus, 1.0), total)
    assert unweighted["gpu-0"] > 1.5 * unweighted["gpu-7"]  # what a plain router leaves
    weights, changes = _run(PowerRouter(PowerRoutingConfig()), taus, held, 12, total)
    after = _tpots(taus, weights, total)
    assert after["gpu-0"] == pytest.approx(after["gpu-7"], rel=0.05)
    assert after["gpu-0"] < unweighted["gpu-0"] * 0.8
    assert 0.1 < weights["gpu-0"] < 0.8 and weights["gpu-7"] == 1.0
    assert sum(changes[-4:]) == 0, changes  # settled: no command once it is level


@pytest.mark.parametrize("crowded", [False, True])
def test_a_held_replica_a_little_under_its_share_rises_to_it_when_work_waits(
    crowded: bool,
) -> None:
    """A held replica whose cap its load no longer reaches, left at a weight 12% under
    level. A damped rise under half the tolerance is not sent, so it stays a little short
    of its peers: harmless while the pool has room, yet when mandatory work waits its
    unused share is the queue's growth (two control seeds breached the SLO for tens of
    periods behind such weights). Then it rises, as a fall would, to within the
    tolerance, and stays."""
    taus = {f"gpu-{i}": TAU_S for i in range(8)}
    total = 8 * 0.6 * DOUBLING / TAU_S
    router = PowerRouter(PowerRoutingConfig())
    router.weights[("pool", "gpu-0")] = 0.88
    weights, changes = _run(router, taus, {"gpu-0"}, 10, total, crowded=crowded)
    assert sum(changes[-4:]) == 0, changes  # settled either way
    if crowded:  # level is weight 1 (the same speed): within the tolerance of it
        assert weights["gpu-0"] >= 1 / 1.05, (weights["gpu-0"], changes)
    else:
        assert weights["gpu-0"] < 0.93, (weights["gpu-0"], changes)


def test_weights_fall_at_once_and_come_back_within_the_rise_limit_when_the_caps_lift() -> None:
    taus = {f"gpu-{i}": TAU_S for i in range(4)}
    slow = dict(taus, **{"gpu-0": TAU_S / 0.5})
    total = 4 * 0.5 * DOUBLING / TAU_S
    router = PowerRouter(PowerRoutingConfig())
    weights, _ = _run(router, slow, {"gpu-0"}, 6, total)
    low = weights["gpu-0"]
    assert low < 0.6
    # the cap lifts: its device is as fast as the others, and no cap holds it
    steps = []
    for _ in range(8):
        moves = router.step("pool", _period(taus, weights, total, set()), doubling_batch=DOUBLING)
        for w in moves:
            assert w.reason is PowerRouteReason.LIFTED
            assert w.weight <= 1.5 * weights[w.device_uuid] + 1e-9  # at most x1.5 a period
            weights[w.device_uuid] = w.weight
        steps.append(weights["gpu-0"])
    assert steps[-1] == 1.0 and router.weighted("pool") == []
    assert steps.index(1.0) <= 3


def test_a_replica_no_cap_holds_comes_back_even_when_its_tpot_is_off_its_peers() -> None:
    # its cap lifted, yet its TPOT reads over 8% off its peers' while the model's own
    # correction for it is under the tolerance (a batch of 45 against their 40, its TPOT
    # 10% over what its batch explains): the way back to 1 does not wait on the tolerance
    router = PowerRouter(PowerRoutingConfig())
    router.capped("pool", "gpu-0", "rack-0", draw_watts=600.0, cap_watts=300.0)
    weights = []
    for _ in range(3):
        period = [ReplicaServing("gpu-0", "rack-0", TAU_S, 45.0,
                                 TAU_S * (1 + 45 / DOUBLING) * 1.1)] + [
            ReplicaServing(f"gpu-{i}", f"rack-{i}", TAU_S, 40.0, TAU_S * (1 + 40 / DOUBLING))
            for i in (1, 2)
        ]  # fmt: skip
        for w in router.step("pool", period, doubling_batch=DOUBLING):
            assert w.reason is PowerRouteReason.LIFTED
            weights.append(w.weight)
    assert weights == [0.75, 1.0] and router.weighted("pool") == []


def test_a_cap_under_the_draw_cuts_the_weight_in_proportion_at_once() -> None:
    router = PowerRouter(PowerRoutingConfig())
    w = router.capped("pool", "gpu-3", "rack-2", draw_watts=600.0, cap_watts=300.0)
    assert w is not None and w.weight == pytest.approx(0.5) and w.reason is PowerRouteReason.CAPPED
    assert "300 W" in w.message and "rack-2" in w.message
    # a cap over what it draws changes nothing; the weight never goes under min_weight
    assert router.capped("pool", "gpu-3", "rack-2", draw_watts=200.0, cap_watts=300.0) is None
    w = router.capped("pool", "gpu-3", "rack-2", draw_watts=600.0, cap_watts=10.0)
    assert w is not None and w.weight == pytest.approx(0.1)


def test_a_rack_over_its_limit_with_every_lever_spent_sheds_load_and_never_takes_it_back(
) -> None:  # fmt: skip
    router = PowerRouter(PowerRoutingConfig())
    w = router.shed("pool", "gpu-0", "rack-0", over_ratio=0.2)
    assert w is not None and w.reason is PowerRouteReason.OVER_LIMIT
    assert w.weight == pytest.approx(0.8) and "over its limit" in w.message
    again = router.shed("pool", "gpu-0", "rack-0", over_ratio=0.9)  # at most half, once
    assert again is not None and again.weight == pytest.approx(0.4)
    # at the driver's floor its weight does not rise, however fast its tokens now are
    taus = {f"gpu-{i}": TAU_S for i in range(4)}
    total = 4 * 0.5 * DOUBLING / TAU_S
    replicas = [
        ReplicaServing(r.device_uuid, r.rack_id, r.unit_tpot_s, r.batch, r.tpot_s,
                       held=r.device_uuid == "gpu-0", at_floor=r.device_uuid == "gpu-0")
        for r in _period(taus, {**dict.fromkeys(taus, 1.0), "gpu-0": 0.4}, total, set())
    ]  # fmt: skip
    assert router.step("pool", replicas, doubling_batch=DOUBLING) == []


def test_nothing_moves_when_disabled_or_when_no_cap_holds_a_replica() -> None:
    taus = {f"gpu-{i}": TAU_S for i in range(4)}
    slow = dict(taus, **{"gpu-0": TAU_S / 0.5})
    total = 4 * 0.5 * DOUBLING / TAU_S
    off = PowerRouter(PowerRoutingConfig(enabled=False))
    assert _run(off, slow, {"gpu-0"}, 4, total)[1] == [0, 0, 0, 0]
    # slow for a reason that is not our cap (a thermal brake, a grey failure): not ours
    # to route around here; the health detector's ladder answers for it
    assert _run(PowerRouter(PowerRoutingConfig()), slow, set(), 4, total)[1] == [0, 0, 0, 0]


def test_a_held_replica_faster_than_its_free_peers_is_left_alone() -> None:
    # a capped device that still out-runs its peers (one of them grey, say): the model would
    # give the free replicas nothing; no weight moves, and nothing divides by zero
    taus = {"gpu-0": TAU_S / 50, "gpu-1": TAU_S * 5}
    replicas = _period(taus, dict.fromkeys(taus, 1.0), 0.05 * DOUBLING / TAU_S, {"gpu-0"})
    assert PowerRouter(PowerRoutingConfig()).step("pool", replicas, doubling_batch=DOUBLING) == []


TARGET_S = 0.040  # the latency setpoint a held pool's TPOT is brought to
HELD_TAU_S = TAU_S / 0.6  # capped to 60% of its clock


def _region(
    pool_weight: float, total: float, *, held: bool = True, tau_a: float = HELD_TAU_S,
    free: int = 4,
) -> tuple[list[ReplicaServing], list[ReplicaServing]]:  # fmt: skip
    """One period of a region serving one model from two pools: pool "a" (4 replicas on
    rack 0, ``held`` by our caps, time per token ``tau_a``) at ``pool_weight``, and pool "b"
    (``free`` replicas on rack 1, full clock). The region's router splits the model's
    total intensity over all of them by weight."""
    taus = {f"a-{i}": tau_a for i in range(4)} | {f"b-{i}": TAU_S for i in range(free)}
    weights = {u: pool_weight if u.startswith("a") else 1.0 for u in taus}
    share = sum(weights.values())
    out = []
    for u, tau in taus.items():
        a = total * weights[u] / share
        tpot = tau / max(1e-6, 1.0 - a * tau / DOUBLING)
        mine = u.startswith("a")
        out.append(ReplicaServing(u, "rack-0" if mine else "rack-1", tau, a * tpot, tpot,
                                  held=held and mine, model="m"))  # fmt: skip
    return [r for r in out if r.device_uuid.startswith("a")], [
        r for r in out if r.device_uuid.startswith("b")
    ]


def _pools(
    router: PowerRouter, total: float, periods: int, **region: float | bool
) -> tuple[list[PoolWeight], list[ReplicaServing]]:
    """``periods`` of pool "a" against pool "b": its weight changes, and the last period."""
    changes: list[PoolWeight] = []
    for _ in range(periods):
        mine, others = _region(router.pool_weight("a", "m"), total, **region)  # type: ignore[arg-type]
        changes += router.step_pools("a", mine, others, doubling_batch=DOUBLING,
                                     target_tpot_s=TARGET_S)  # fmt: skip
    return changes, _region(router.pool_weight("a", "m"), total, **region)[0]  # type: ignore[arg-type]


def test_a_pool_every_cap_holds_sends_its_share_to_the_regions_other_pools_and_takes_it_back() -> (
    None
):
    # 900 sequences per second of TPOT on each of 8 replicas: pool "a", capped to 60% of its
    # clock, runs 43.5 ms against a 40 ms setpoint; pool "b" runs 23 ms, with room to spare
    total = 8 * 900.0
    router = PowerRouter(PowerRoutingConfig())
    mine, _ = _region(1.0, total)
    assert mine[0].tpot_s > 1.08 * TARGET_S
    changes, mine = _pools(router, total, 12)
    assert changes and all(c.reason is PowerRouteReason.POOL_CAPPED for c in changes)
    assert changes[0].weight < 1.0 and "every replica held down" in changes[0].message
    assert mine[0].tpot_s == pytest.approx(TARGET_S, rel=0.06)  # at the setpoint, not under it
    assert 0.3 < router.pool_weight("a", "m") < 0.95
    assert _pools(router, total, 3)[0] == []  # settled: nothing more to send
    # the caps lift: its devices run at full clock again, and its share comes back
    back = []
    for _ in range(6):
        mine, others = _region(router.pool_weight("a", "m"), total, held=False, tau_a=TAU_S)
        for c in router.step_pools("a", mine, others, doubling_batch=DOUBLING,
                                   target_tpot_s=TARGET_S):  # fmt: skip
            assert c.reason is PowerRouteReason.POOL_LIFTED
            assert c.weight <= 1.5 * c.previous + 1e-9
            back.append(c.weight)
    assert back and back[-1] == 1.0 and router.pool_weight("a", "m") == 1.0


def test_a_held_pool_sends_no_more_than_the_other_pools_can_take_at_the_setpoint() -> None:
    # one free replica elsewhere, and busy: pool "a" may give it only what keeps its TPOT
    # at the setpoint too, so "a" stays over it
    total = 5 * 1_600.0
    router = PowerRouter(PowerRoutingConfig())
    _pools(router, total, 12, free=1)
    mine, others = _region(router.pool_weight("a", "m"), total, free=1)
    assert mine[0].tpot_s > 1.1 * TARGET_S  # still over: nowhere to send the rest
    assert others[0].tpot_s < TARGET_S * 1.06  # and the other pool not pushed past it
    assert router.pool_weight("a", "m") < 1.0


def test_a_held_pool_takes_its_share_back_while_work_waits_elsewhere_and_none_here() -> None:
    # the other pool's throughput ran out before its TPOT showed it: work waits there. A
    # slow token here beats a wait for a slot there, so the share comes back, at the rise
    # limit; once work waits here too, it is held
    router = PowerRouter(PowerRoutingConfig())
    router.pool_weights[("a", "m")] = 0.3
    mine, others = _region(0.3, 8 * 900.0)
    queued = [ReplicaServing(r.device_uuid, r.rack_id, r.unit_tpot_s, r.batch, r.tpot_s,
                             model="m", waiting=12.0) for r in others]  # fmt: skip
    [back] = router.step_pools("a", mine, queued, doubling_batch=DOUBLING, target_tpot_s=TARGET_S)
    assert back.reason is PowerRouteReason.POOL_CAPPED and back.weight == pytest.approx(0.45)
    assert "work waits" in back.message
    waiting_here = [ReplicaServing(r.device_uuid, r.rack_id, r.unit_tpot_s, r.batch, r.tpot_s,
                                   held=True, model="m", waiting=3.0) for r in mine]  # fmt: skip
    assert router.step_pools("a", waiting_here, queued, doubling_batch=DOUBLING,
                             target_tpot_s=TARGET_S) == []  # fmt: skip


def test_a_pool_over_a_breaker_at_its_floors_sheds_its_share_among_the_regions_pools() -> None:
    # its replicas on the rack at the least weight, the rack still over: the pool's share of
    # the model among the region's pools goes, by the share over (at most half a reading)
    router = PowerRouter(PowerRoutingConfig())
    cut = router.shed_pool("a", "m", "rack-0", over_ratio=0.3)
    assert cut is not None and cut.reason is PowerRouteReason.OVER_LIMIT
    assert cut.weight == pytest.approx(0.7) and "over its limit" in cut.message
    again = router.shed_pool("a", "m", "rack-0", over_ratio=1.0)
    assert again is not None and again.weight == pytest.approx(0.35)
    assert router.shed_pool("a", "m", "rack-0", over_ratio=0.0) is None
    # within its own pool only, it never moves a share between pools
    inside = PowerRouter(PowerRoutingConfig(across_pools=False))
    assert inside.shed_pool("a", "m", "rack-0", over_ratio=0.3) is None


def test_a_held_pool_within_its_setpoint_or_with_a_free_replica_keeps_its_share() -> None:
    router = PowerRouter(PowerRoutingConfig())
    assert _pools(router, 8 * 300.0, 4)[0] == []  # capped, yet well within the setpoint
    mine, others = _region(1.0, 8 * 900.0)
    # one of its replicas runs free: the pool's own routing gives it the share
    mine[0] = ReplicaServing(mine[0].device_uuid, "rack-1", TAU_S, mine[0].batch,
                             mine[0].tpot_s, model="m")  # fmt: skip
    assert router.step_pools("a", mine, others, doubling_batch=DOUBLING,
                             target_tpot_s=TARGET_S) == []  # fmt: skip
    # nothing free elsewhere to send it to
    held_all = [ReplicaServing(r.device_uuid, r.rack_id, r.unit_tpot_s, r.batch, r.tpot_s,
                               held=True, model="m") for r in others]  # fmt: skip
    mine, _ = _region(1.0, 8 * 900.0)
    assert router.step_pools("a", mine, held_all, doubling_batch=DOUBLING,
                             target_tpot_s=TARGET_S) == []  # fmt: skip
    # turned off, for a router that cannot move a model between pools
    off = PowerRouter(PowerRoutingConfig(across_pools=False))
    assert _pools(off, 8 * 900.0, 4)[0] == []


@pytest.mark.parametrize(
    "given",
    [{"min_weight": 0.0}, {"tolerance": 1.0}, {"max_rise_ratio": 1.0}, {"gain": 0.0},
     {"max_shed_ratio": 1.0}],
)  # fmt: skip
def test_settings_out_of_range_are_refused_with_what_is_wrong(given: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(given))):
        PowerRoutingConfig(**given)  # type: ignore[arg-type]


@pytest.mark.parametrize("crowded", [False, True])
def test_a_held_replica_fills_its_batch_when_the_queue_waits_on_its_peers_full_ones(
    crowded: bool,
) -> None:
    """Fresh control seed 125: a feed loss caps a rack's devices, the pool's free replicas
    run at their batch cap with baseline work queued behind them, and a capped replica
    runs 134 sequences where its cap is 256, its TPOT within 6% of its peers'. Level
    TPOTs leave its slots empty while the queue grows (37 periods out of the SLO). When
    the pool is crowded it takes what its batch cap holds within the TPOT target; when
    it is not, TPOTs are the measure, as before."""
    cap, tau_held = 128.0, TAU_S / 0.8
    target_s = 3.0 * TAU_S
    peers_tpot = TAU_S * (1.0 + cap / DOUBLING)  # the free replicas: full batches
    router = PowerRouter(PowerRoutingConfig())
    router.weights[("pool", "gpu-0")] = weight = 0.6
    base_intensity = 1.3 * cap / peers_tpot  # what weight 1 would send it (sequences / s)
    batches = []
    for _ in range(12):
        a = base_intensity * weight * 0.8  # a router's share: weight times the clock it sees
        tpot = tau_held / max(1e-6, 1.0 - a * tau_held / DOUBLING)
        batch = min(cap, a * tpot)
        tpot = tau_held * (1.0 + batch / DOUBLING)
        batches.append(batch)
        period = [
            ReplicaServing("gpu-0", "rack-0", tau_held, batch, tpot, held=True, batch_cap=cap),
            *(ReplicaServing(f"gpu-{i}", "rack-1", TAU_S, cap, peers_tpot, batch_cap=cap)
              for i in range(1, 8)),
        ]  # fmt: skip
        for w in router.step("pool", period, doubling_batch=DOUBLING, crowded=crowded,
                             target_tpot_s=target_s):  # fmt: skip
            weight = w.weight
    assert abs(tau_held * (1 + batches[0] / DOUBLING) / peers_tpot - 1) < 0.08  # level-ish
    if crowded:
        assert batches[-1] >= 0.9 * cap, batches
        assert batches[-1] == batches[-2] == batches[-3], batches  # and it stays
    else:
        assert batches[-1] == batches[0], batches
