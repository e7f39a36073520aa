"""Deferrable batch work in the simulated fleet: served from what baseline leaves, deferred
never dropped, and moved off a rack by the router's ``move_batch``."""

from __future__ import annotations

from agents.sim.scenario import DemandSpec, FleetSpec, Scenario
from agents.sim.simulation import Simulation
from agents.sim.state import Device
from schemas.events import ServingMetrics
from tests.factories import START


def _sim(batch_ratio: float, load: float = 0.5) -> Simulation:
    demand = DemandSpec(kind="synthetic", load_ratio=load, batch_ratio=batch_ratio)
    return Simulation(Scenario(fleet=FleetSpec(nodes=10, seed=7), demand=demand), start=START)


def _rack(sim: Simulation, rack: int) -> list[Device]:
    return [d for n in sim.fleet.racks[rack].nodes for d in n.devices]


def test_batch_work_runs_after_baseline_and_telemetry_counts_it() -> None:
    plain, busy = _sim(0.0), _sim(0.1)
    for n in range(6):
        plain.tick(n)
        records = busy.tick(n)
    serving = [e for _, e in records if isinstance(e, ServingMetrics)]
    assert sum(e.batch_requests or 0 for e in serving) > 0
    assert all((e.batch_requests or 0) <= e.requests for e in serving)
    for uuid, dev in busy.fleet.devices.items():
        # baseline is served just as without batch work: batch only takes what is spare
        base = plain.fleet.devices[uuid]
        assert abs((dev.served_rps - dev.batch_rps) - base.served_rps) <= 1e-6 * (
            1 + base.served_rps
        )
        assert dev.batch_rps <= dev.batch_offered_rps + 1e-9


def test_a_move_places_the_racks_batch_work_elsewhere_and_back() -> None:
    sim = _sim(0.1)
    sim.tick(0)
    before = sum(d.batch_offered_rps for d in sim.fleet.devices.values())
    rack0 = _rack(sim, 0)
    # pools with replicas on other racks too: their work on rack 0 can go there
    elsewhere = {d.pool for d in sim.fleet.devices.values() if d not in rack0 and d.model}
    pools = {d.pool for d in rack0 if d.batch_offered_rps > 0} & elsewhere
    assert pools
    for pool in pools:
        sim.fleet.batch.moves[(pool, sim.fleet.racks[0].rack_id)] = (1.0, pool)
    sim.tick(1)
    assert all(d.batch_offered_rps == 0 for d in rack0 if d.pool in pools)
    after = sum(d.batch_offered_rps for d in sim.fleet.devices.values())
    assert after >= before * 0.99  # the same work, placed on the pools' other racks
    assert sim.fleet.batch.moved_rps > 0
    sim.fleet.batch.moves.clear()
    sim.tick(2)
    assert any(d.batch_offered_rps > 0 for d in rack0)


def test_batch_work_with_nowhere_to_go_stays_and_what_waits_is_deferred_not_dropped() -> None:
    sim = _sim(0.1)
    sim.tick(0)
    rack0 = sim.fleet.racks[0].rack_id
    pool = next(d.pool for d in _rack(sim, 0) if d.batch_offered_rps > 0)
    sim.fleet.batch.moves[(pool, rack0)] = (1.0, "nowhere-h100")
    sim.tick(1)
    assert any(d.batch_offered_rps > 0 for d in _rack(sim, 0) if d.pool == pool)
    # a pool with no spare defers what it cannot serve, up to its backlog limit
    full = _sim(0.6, load=0.9)
    for n in range(40):
        full.tick(n)
    work = full.fleet.batch
    assert sum(work.backlog.values()) > 0
    for pool, held in work.backlog.items():
        assert held <= work.backlog_limit_s * work.standing[pool] + 1e-6
