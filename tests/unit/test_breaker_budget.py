"""The power controller's latency budget against a breaker's trip time.

A breaker trips once its rack has drawn over the limit for ``trip_after_s`` without a
break. What the controller needs, from the first reading over the limit to the draw
back under it, is::

    one PDU sample (the reading that shows it)  +  transport  +  one step (the cap lands)

The controller acts on the reading itself, not at the end of its control period (which
is ten seconds, as long as the trip time); transport is everything between the reading
and the executor (Kafka, the worker's batch window, the command topic, the executor's
poll). So with 1 s samples the transport budget is ``trip_after_s - 2 s``: 8 s of event
time for the scenarios' 10 s breakers, which is 1.6 s of wall time at the demo's 5x.

Here the production control planner (built by the worker's own wiring from its
settings) runs against the simulated fleet with its commands delayed by a transport
delay of event time: within budget the breaker holds on every fault scenario that
overloads a rack; past the trip time it trips (the budget is real).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from agents.sim.control import SimControl
from agents.sim.scenario import FaultKind, load_scenario
from agents.sim.simulation import Simulation
from fleetloop.settings import WorkerSettings
from fleetloop.sim import build_dispatcher
from fleetloop.wiring import control_wiring
from planning.pools import ControlPlanner
from schemas.commands import Command
from tests.factories import COMMAND_KEYS, COMMAND_KEYS_SETTING, START

SCENARIOS = Path(__file__).parents[2] / "scenarios"
SAMPLE_S = 1.0


def _budget_s(trip_after_s: float) -> float:
    """Transport the controller can afford: the trip time less one sample and one step."""
    return trip_after_s - 2 * SAMPLE_S


def _run(scenario_file: str, transport_s: float) -> tuple[list[str], float]:
    """Breaker trips, and the longest time any rack drew over its limit, in seconds."""
    scenario = load_scenario(SCENARIOS / scenario_file)
    sim = Simulation(scenario, start=START)
    assert sim.interval_s == SAMPLE_S
    settings = WorkerSettings(
        command_keys=SecretStr(COMMAND_KEYS_SETTING),
        processors="control",
    )
    wiring = control_wiring(settings)
    assert wiring is not None and wiring.period_s >= 10.0  # production's period, not a test's
    planner = ControlPlanner(wiring)
    dispatcher = build_dispatcher(SimControl(sim.fleet), COMMAND_KEYS, CollectorRegistry())
    in_flight: list[tuple[float, Command]] = []
    over_since: dict[str, float] = {}
    longest = 0.0
    steps = int(min(scenario.duration_s or 600.0, 600.0) / sim.interval_s)
    for n in range(steps):
        events = sim.tick(n)
        t = sim.fleet.t_s
        for due, command in [c for c in in_flight if c[0] <= t]:
            in_flight.remove((due, command))
            dispatcher.handle(command, now=sim.now, received_at=sim.now)
        for _, event in events:
            for o in planner.feed(event):
                if o.command is not None:
                    in_flight.append((t + transport_s, o.command))
        for rack in sim.fleet.racks:
            if rack.power_watts > rack.effective_limit_watts and not rack.tripped:
                over_since.setdefault(rack.rack_id, t)
                longest = max(longest, t - over_since[rack.rack_id])
            else:
                over_since.pop(rack.rack_id, None)
    trips = [c["target"] for c in sim.faults.consequences if c["what"] == "breaker_trip"]
    return trips, longest


def _trip_after_s(scenario_file: str) -> float:
    faults = load_scenario(SCENARIOS / scenario_file).faults
    return min(f.param("trip_after_s") for f in faults if f.kind is FaultKind.PDU_OVERLOAD)


@pytest.mark.parametrize("scenario_file", ["pdu-overload.yaml", "demo.yaml"])
def test_the_breaker_holds_within_the_transport_budget(scenario_file: str) -> None:
    trip_after_s = _trip_after_s(scenario_file)
    for transport_s in (0.0, _budget_s(trip_after_s)):
        trips, longest_over_s = _run(scenario_file, transport_s)
        assert not trips, (scenario_file, transport_s)
        assert longest_over_s < trip_after_s, (scenario_file, transport_s, longest_over_s)


def test_past_the_trip_time_the_breaker_trips() -> None:
    trips, longest_over_s = _run("pdu-overload.yaml", _trip_after_s("pdu-overload.yaml") + 2)
    assert trips, longest_over_s
