"""The eval's pool plant (:mod:`evaluations.pool_plant`): each device its own share, clock
and TPOT, a router least-loaded within its weights, and a tripped rack dark."""

from __future__ import annotations

import pytest

from evaluations.pool_plant import PoolPlant, PoolShape

SHAPE = PoolShape(
    devices=8, racks=2, tpot_base_s=0.02, spread_ratio=0.2, tpot_slo_s=0.06, wait_slo_s=1.0,
    idle_watts=100.0, max_watts=700.0, min_watts=200.0, host_watts_per_rack=1000.0,
)  # fmt: skip
LOAD = 0.45  # of the pool's saturation at full clocks


def _run(plant: PoolPlant, seconds: int = 60) -> None:
    for _ in range(seconds):
        plant.step(baseline=LOAD, batch=0.0, optional_share=0.0)


def test_a_capped_device_takes_less_work_yet_its_tokens_stay_slower_until_it_is_weighted() -> None:
    plant = PoolPlant(SHAPE, priority=True, seed=1)
    plant.caps[0] = 300.0  # device 0's cap binds at this load
    _run(plant)
    shares = plant.shares()
    assert shares[0] < 0.9 * shares[1]  # a least-loaded router gives it less ...
    assert plant.device_tpot_s[0] > 1.1 * plant.device_tpot_s[1]  # ... and it is still slower
    plant.weights[0] = 0.5
    _run(plant)
    assert plant.device_tpot_s[0] < plant.device_tpot_s[1]  # weighted down: faster than peers
    # the pool's TPOT is the device TPOT 95% of the load is within: one slow device of 8 at
    # an eighth of the load is it
    plant.weights[0] = 1.0
    _run(plant)
    assert plant.step(baseline=LOAD, batch=0.0, optional_share=0.0).baseline_tpot_s == (
        pytest.approx(plant.device_tpot_s[0], rel=0.05)
    )


def test_a_tripped_rack_is_dark_and_its_load_goes_to_the_other() -> None:
    plant = PoolPlant(SHAPE, priority=True, seed=1)
    _run(plant, 10)
    both = plant.device_tpot_s[4]
    plant.trip(0)
    _run(plant)
    second = plant.step(baseline=LOAD, batch=0.0, optional_share=0.0)
    assert second.rack_watts[0] == 0.0 and second.rack_watts[1] > SHAPE.host_watts_per_rack
    assert plant.shares()[:4] == [0.0] * 4 and plant.device_tpot_s[4] > both
    plant.reset(0)
    _run(plant, 600)  # the backlog it left drains, then all is as before
    assert sum(plant.queues.values()) == pytest.approx(0.0, abs=1e-6)
    assert plant.shares()[0] == pytest.approx(1.0, rel=0.05)
    assert plant.device_tpot_s[4] == pytest.approx(both, rel=0.05)


def test_the_oracle_routes_rack_by_rack() -> None:
    # a rack with half its power carries less; the other still carries its own
    plant = PoolPlant(SHAPE, priority=True, seed=1)
    full = 4 * 700.0 + SHAPE.host_watts_per_rack
    even = plant.oracle_load([full, full])
    starved = plant.oracle_load([full, 0.5 * full])
    assert 0.5 * even < starved < even


def test_the_oracle_at_the_routers_mark_is_what_the_router_admits_at_full_batch() -> None:
    """The oracle runs TPOT at the SLO itself; the router admits only to ``admit_ratio`` of
    it. Held to that mark the oracle carries what this plant's router admits with every
    lever at its best (full clocks, full batch, equal shares), and less than at the SLO."""
    plant = PoolPlant(SHAPE, priority=True, seed=1, max_batch=4096)  # the batch never binds
    full = 4 * 700.0 + SHAPE.host_watts_per_rack  # nor the power
    for slowdown in (1.0, 1.3):
        plant.slowdown = slowdown
        at_slo = plant.oracle_load([full, full])
        at_mark = plant.oracle_load([full, full], at_mark=True)
        assert at_mark < at_slo
        assert at_mark == pytest.approx(plant.admission_cap(), rel=0.02)
