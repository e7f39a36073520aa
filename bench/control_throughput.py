"""How many devices one control planner keeps up with, against decoding the same messages.

A control worker runs one :class:`~planning.pools.RegionalControl` for the regions it
owns (every pool and rack of them). This measures, in one run, on the same simulated
telemetry as agents publish it (node-tick envelopes of serving and accelerator samples,
PDU readings; a fleet's power and capacity controllers stepping at their period):

1. the baseline: decoding each message from its bytes (an envelope into its
   samples), which every processor pays before it does anything;
2. the planner's own work on the decoded envelopes (no decoding);
3. the two together, as the control role does them (each envelope fed whole);
4. the same, each envelope's samples fed one by one as flat views (how the role
   fed the planner before it took envelopes whole).

It prints the rates in samples per second, each path's cost as a ratio of
decoding's, and the largest fleet one planner keeps up with (one serving and one
accelerator sample per device and one PDU reading per rack each interval).

    python -m bench.control_throughput --nodes 100 --steps 60
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from agents.envelopes import pack
from agents.sim.scenario import load_scenario
from agents.sim.simulation import Simulation
from fleetloop.settings import REPO_ROOT
from planning.pools import RegionalControl
from planning.throttle import ControlWiring
from schemas.codec import decode, decode_samples, decode_tick, encode
from schemas.topics import ACCELERATOR_TICKS, PDU, SERVING_TICKS

SCENARIO = REPO_ROOT / "scenarios" / "pdu-overload.yaml"
READ = (ACCELERATOR_TICKS, SERVING_TICKS, PDU)  # what the control role reads


def _messages(nodes: int, steps: int) -> tuple[list[tuple[Any, bytes]], int, int, float]:
    """The encoded messages (value type, bytes), the samples they carry, devices, interval."""
    sim = Simulation(load_scenario(SCENARIO), start=datetime.now(UTC), nodes=nodes)
    out: list[tuple[Any, bytes]] = []
    for n in range(steps):
        out += [(s.value_type, encode(v)) for s, v in pack(sim.tick(n)) if s in READ]
    samples = sum(len(decode_samples(raw, kind)) for kind, raw in out)
    return out, samples, len(sim.fleet.devices), sim.interval_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    a = parser.parse_args()
    messages, n, devices, interval_s = _messages(a.nodes, a.steps)
    wiring = ControlWiring(signing_key=("bench", b"bench-key-0123456789"), period_s=10.0)
    ticks = {s.value_type for s in READ if s.envelope}

    def read(kind: Any, raw: bytes) -> Any:
        return decode_tick(raw, kind).tick if kind in ticks else decode(raw, kind)

    def timed(body: Callable[[RegionalControl], None]) -> float:
        planner = RegionalControl(wiring)
        started = time.perf_counter()
        body(planner)
        return time.perf_counter() - started

    def decode_only(_: RegionalControl) -> None:
        for kind, raw in messages:
            read(kind, raw)

    decoded = [(kind, read(kind, raw)) for kind, raw in messages]

    def plan_only(planner: RegionalControl) -> None:
        for kind, value in decoded:
            planner.tick(value) if kind in ticks else planner.feed(value)

    def role(planner: RegionalControl) -> None:
        for kind, raw in messages:
            value = read(kind, raw)
            planner.tick(value) if kind in ticks else planner.feed(value)

    def views(planner: RegionalControl) -> None:
        for kind, raw in messages:
            for value in decode_samples(raw, kind):
                planner.feed(value)

    paths: tuple[tuple[str, Callable[[RegionalControl], None]], ...] = (
        ("decode (baseline)", decode_only), ("planner alone", plan_only),
        ("decode + planner", role), ("views, one by one", views),
    )  # fmt: skip
    best = {name: min(timed(run) for _ in range(a.repeat)) for name, run in paths}
    print(f"{len(messages)} messages, {n} samples from {devices} devices over {a.steps} steps "
          f"of {interval_s:g} s")  # fmt: skip
    base = best["decode (baseline)"]
    for name, seconds in best.items():
        print(f"  {name:<20} {n / seconds:>10,.0f} samples/s  cost {seconds / base:>5.2f}x decode")
    per_device_s = 2.0 / interval_s  # a serving and an accelerator sample per interval
    for name in ("decode + planner", "views, one by one"):
        print(f"  {name}: one planner keeps up with about {n / best[name] / per_device_s:,.0f} "
              f"devices at one sample of each kind per {interval_s:g} s")  # fmt: skip


if __name__ == "__main__":
    main()
