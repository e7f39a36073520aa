"""How many events one control planner keeps up with, against decoding the same events.

The control role runs one :class:`~streams.control.ControlPlanner` for every pool
and rack. This measures, in one run, on the same simulated telemetry (serving,
accelerator and PDU events of a fleet, its power and capacity controllers
stepping at their period):

1. the baseline: decoding each event from its JSON bytes, which every
   processor pays before it does anything;
2. the planner's own work on the decoded events (no decoding);
3. the two together, as the control processor does them.

It prints the rates, the planner's cost as a ratio of decoding's, and the
largest fleet one planner would keep up with at the fleet's telemetry rates
(one serving and one accelerator event per device and one PDU reading per rack
each interval).

    python -m bench.control_throughput --nodes 100 --steps 60
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime

from agents.sim.scenario import load_scenario
from agents.sim.simulation import Simulation
from fleetloop.settings import REPO_ROOT
from planning.pools import ControlPlanner
from planning.throttle import ControlWiring
from schemas.base import Contract
from schemas.codec import decode, encode
from schemas.events import AcceleratorTelemetry, PduReading, ServingMetrics

SCENARIO = REPO_ROOT / "scenarios" / "pdu-overload.yaml"
KINDS = (AcceleratorTelemetry, PduReading, ServingMetrics)


def _events(nodes: int, steps: int) -> tuple[list[tuple[type[Contract], bytes]], int, float]:
    sim = Simulation(load_scenario(SCENARIO), start=datetime.now(UTC), nodes=nodes)
    out: list[tuple[type[Contract], bytes]] = []
    for n in range(steps):
        for _, value in sim.tick(n):
            if isinstance(value, KINDS):
                out.append((type(value), encode(value)))
    return out, len(sim.fleet.devices), sim.interval_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    a = parser.parse_args()
    events, devices, interval_s = _events(a.nodes, a.steps)
    wiring = ControlWiring(signing_key=("bench", b"bench-key-0123456789"), period_s=10.0)

    def decode_only() -> float:
        started = time.perf_counter()
        for kind, raw in events:
            decode(raw, kind)
        return time.perf_counter() - started

    decoded = [decode(raw, kind) for kind, raw in events]

    def plan_only() -> float:
        planner = ControlPlanner(wiring)
        started = time.perf_counter()
        for value in decoded:
            planner.feed(value)
        return time.perf_counter() - started

    def both() -> float:
        planner = ControlPlanner(wiring)
        started = time.perf_counter()
        for kind, raw in events:
            planner.feed(decode(raw, kind))
        return time.perf_counter() - started

    n = len(events)
    rates = {
        name: n / min(run() for _ in range(a.repeat))
        for name, run in (("decode (baseline)", decode_only), ("planner alone", plan_only),
                          ("decode + planner", both))
    }  # fmt: skip
    per_device_s = 2.0 / interval_s  # a serving and an accelerator event per interval
    print(f"{n} events from {devices} devices over {a.steps} steps of {interval_s:g} s")
    for name, rate in rates.items():
        print(f"  {name:<20} {rate:>10,.0f} events/s")
    base = rates["decode (baseline)"]
    print(f"  planner / decode cost ratio: {base / rates['planner alone']:.2f}")
    print(f"  decode + planner / decode rate ratio: {rates['decode + planner'] / base:.2f}")
    keeps_up = rates["decode + planner"] / per_device_s
    print(f"  one planner keeps up with about {keeps_up:,.0f} devices at one event of each "
          f"kind per {interval_s:g} s")  # fmt: skip


if __name__ == "__main__":
    main()
