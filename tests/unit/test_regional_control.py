"""The control role split by region (:class:`planning.pools.RegionalControl`): a planner
per region decides what one planner for the whole fleet decides, a region handed over
leaves nothing behind, and processes that each plan some regions keep the fleet's
optional-work limit between them through their claims.

The simulated fleet of ``pdu-overload.yaml`` (ten nodes in two pods, one per region, and
a rack that loses a feed), in the loop: commands applied to the fleet as executors do.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agents.envelopes import pack
from agents.sim.control import SimControl
from agents.sim.scenario import load_scenario
from agents.sim.simulation import Simulation
from controllers.capacity import Claim, GlobalBudget
from fleetloop.sim import build_dispatcher
from planning.pools import ControlPlanner, RegionalControl
from planning.throttle import ControlOutput, ControlWiring
from schemas.commands import ClockMode
from schemas.envelopes import AcceleratorTick, ServingTick
from tests.factories import COMMAND_KEYS, START

SCENARIO = Path(__file__).parents[2] / "scenarios" / "pdu-overload.yaml"
KEY = next(iter(COMMAND_KEYS.items()))
LIMIT = 3.0  # device-equivalents of optional work for the fleet: it binds


def _sim() -> Simulation:
    scenario = load_scenario(SCENARIO)
    demand = scenario.demand.model_copy(update={"batch_ratio": 0.1})
    return Simulation(scenario.model_copy(update={"demand": demand}), start=START)


def _wiring() -> ControlWiring:
    return ControlWiring(
        signing_key=KEY, period_s=2.0, tpot_slo_s=0.08, global_budget_devices=LIMIT
    )


def _ids() -> Callable[[], uuid.UUID]:
    ids = itertools.count()
    return lambda: uuid.UUID(int=next(ids))


def _feed(planner: ControlPlanner | RegionalControl, value: object) -> list[ControlOutput]:
    if isinstance(value, AcceleratorTick | ServingTick):
        return planner.tick(value)
    return planner.feed(value)


def test_a_planner_per_region_decides_what_one_planner_for_the_fleet_decides() -> None:
    sim = _sim()
    assert len({n.region for n in sim.fleet.nodes}) == 2
    dispatcher = build_dispatcher(SimControl(sim.fleet), COMMAND_KEYS, CollectorRegistry())
    regional = RegionalControl(_wiring(), new_id=_ids())
    one = ControlPlanner(_wiring(), new_id=_ids())
    made: list[ControlOutput] = []
    for n in range(int(300 / sim.interval_s)):
        step: list[ControlOutput] = []
        alone: list[ControlOutput] = []
        for _, value in pack(sim.tick(n)):
            step += _feed(regional, value)
            alone += _feed(one, value)
        assert [(o.decision, o.command) for o in step] == [
            (o.decision, o.command) for o in alone
        ], n
        for o in step:
            if o.command is not None:
                dispatcher.handle(o.command, now=sim.now, received_at=sim.now)
        made += step
    assert set(regional.planners) == {"us-east", "eu-west"}
    pools = {o.decision.pool for o in made if o.decision.controller == "capacity"}
    assert {regional.pool_regions[p] for p in pools if p} == {"us-east", "eu-west"}
    assert any(o.decision.reason == "global_budget" for o in made)  # the shared limit binds
    assert regional.crossing == set()


def test_a_region_handed_over_leaves_no_planner_and_no_share_of_the_limit() -> None:
    sim = _sim()
    control = RegionalControl(_wiring(), new_id=_ids())
    for n in range(int(120 / sim.interval_s)):
        for _, value in pack(sim.tick(n)):
            _feed(control, value)
    east = set(control.planners["us-east"].pools)
    assert east and east <= set(control.budget.held)
    control.release(["us-east"])
    assert set(control.planners) == {"eu-west"}
    assert not east & set(control.budget.held) and not east & set(control.pool_regions)
    # its next event starts the region afresh: no pool, no optional work granted yet
    for _, value in pack(sim.tick(int(120 / sim.interval_s))):
        _feed(control, value)
    assert "us-east" in control.planners
    assert all(control.planners["us-east"].pools[p].capacity.budget == 0.0 for p in east)


def test_processes_planning_a_region_each_keep_the_fleet_under_its_limit() -> None:
    """Two processes, one region each, hearing each other's claims a step late (what the
    claims topic gives them): together they never hold more than the limit, and they use
    most of it."""
    sim = _sim()
    dispatcher = build_dispatcher(SimControl(sim.fleet), COMMAND_KEYS, CollectorRegistry())
    processes = {r: RegionalControl(_wiring(), new_id=_ids()) for r in ("us-east", "eu-west")}
    most = 0.0
    for n in range(int(300 / sim.interval_s)):
        for _, value in pack(sim.tick(n)):
            for o in _feed(processes[value.region], value):
                if o.command is not None:
                    dispatcher.handle(o.command, now=sim.now, received_at=sim.now)
        held = sum(c.units for p in processes.values() for c in p.budget.held.values())
        assert held <= LIMIT + 1e-9, (n, {r: p.budget.held for r, p in processes.items()})
        most = max(most, held)
        for region, p in processes.items():  # each hears the other's claims
            for other, q in processes.items():
                if other != region:
                    for pool, c in q.budget.held.items():
                        p.budget.claim(pool, c)
    assert most >= 0.9 * LIMIT, most


def test_claims_count_until_replaced_or_lapsed_and_growth_is_shared() -> None:
    at = START
    g = GlobalBudget(limit_units=10.0, claim_life_s=30.0)
    g.claim("far", Claim(6.0, 20.0, at))
    assert g.others("near", at) == 6.0
    g.claim("far", Claim(2.0, 20.0, at - timedelta(seconds=10)))  # older: ignored
    assert g.others("near", at) == 6.0
    assert g.others("near", at + timedelta(seconds=31)) == 0.0  # lapsed
    # 4 units free; the other process's pool may take its share of them at the same time,
    # so this pool (as large) grows by half of them
    assert g.grant("near", 1.0, 20.0, at) == pytest.approx(2.0 / 20.0)
    g.claim("far", Claim(8.0, 20.0, at + timedelta(seconds=2)))
    assert g.grant("near", 1.0, 20.0, at + timedelta(seconds=2)) == pytest.approx(0.1)
    g.claim("far", Claim(9.0, 20.0, at + timedelta(seconds=4)))  # others took more: give back
    assert g.grant("near", 1.0, 20.0, at + timedelta(seconds=4)) == pytest.approx(1.0 / 20.0)
    # a pool we plan now counts as ours, not by its old claim; released, it is nobody's here
    g.grant("far", 0.0, 20.0, at + timedelta(seconds=4))
    assert g.others("near", at + timedelta(seconds=4)) == 0.0
    g.release(["far"])
    assert g.others("near", at + timedelta(seconds=4)) == 9.0


@pytest.mark.parametrize("adopted", [True, False])
def test_the_next_owner_of_a_region_gives_back_what_its_last_owner_held(adopted: bool) -> None:
    """A region moves while its rack is capped, clocked low and its replicas weighted
    down: the next owner adopts what the last one's levers held (through JSON, as the state
    topic carries it) and lifts it all once the feed is back. Without that it would take
    each cap for the device's default, and the rack would stay capped for good."""
    sim = _sim()
    dispatcher = build_dispatcher(SimControl(sim.fleet), COMMAND_KEYS, CollectorRegistry())
    control = RegionalControl(_wiring(), new_id=_ids())
    handed: dict[str, object] = {}
    for n in range(int(600 / sim.interval_s)):
        for _, value in pack(sim.tick(n)):
            for o in _feed(control, value):
                if o.command is not None:
                    dispatcher.handle(o.command, now=sim.now, received_at=sim.now)
        east = control.planners.get("us-east")
        if not handed and east is not None and east.held()["power"]["devices"]:
            handed = json.loads(json.dumps(east.held()))
            control.release(["us-east"])
            if adopted:
                control.planner("us-east").adopt(handed)
    held = handed["power"]["devices"]  # type: ignore[index]
    assert held and handed["weights"], handed
    devices = [d for node in sim.fleet.racks[0].nodes for d in node.devices]
    lifted = all(d.power_cap_watts == d.spec.power_limit_watts for d in devices)
    default_clocks = all(d.clock_mode is ClockMode.DEFAULT for d in devices)
    weights = sim.fleet.router.replica_weights
    restored = all(weights.get(u, 1.0) == 1.0 for u in held)
    assert (lifted and default_clocks and restored) is adopted, (lifted, default_clocks, restored)
