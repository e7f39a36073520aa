"""How fast the closed-loop simulator can run a fleet, and what its publishing costs.

Three rates in one run, for the same fleet and number of steps:

1. the simulator's step (routing, physics, faults) and its telemetry objects;
2. the same plus JSON encoding of every event (what goes on the wire);
3. the closed loop as `fleetloop sim` runs it: steps, a command dispatcher polling
   the command topics, and every event published with acks=all and flushed
   each step (the local broker, or ``KAFKA_BOOTSTRAP``).

For each it prints events/s, steps/s and the largest speed-up over real time
the fleet could run at (steps/s x interval), and the ratio of (3) to (1): the
share of the simulator's own speed that survives publishing.

    python -m bench.sim_throughput --nodes 100 --steps 60
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry

from agents.executors.consumer import CommandConsumer
from agents.loop import run_closed_loop
from agents.publisher import KafkaPublisher
from agents.sim.control import SimControl
from agents.sim.scenario import load_scenario
from agents.sim.simulation import Simulation
from bench.broker import bench_broker
from fleetloop.settings import REPO_ROOT
from fleetloop.sim import build_dispatcher
from fleetloop.topics_admin import ensure_topics
from schemas.codec import encode

SCENARIO = REPO_ROOT / "scenarios" / "fault-mix.yaml"


def _sim(nodes: int) -> Simulation:
    return Simulation(load_scenario(SCENARIO), start=datetime.now(UTC), nodes=nodes)


def _step_only(nodes: int, steps: int, *, encode_too: bool) -> tuple[float, int]:
    sim = _sim(nodes)
    events = 0
    started = time.perf_counter()
    for n in range(steps):
        records = sim.tick(n)
        events += len(records)
        if encode_too:
            for _, value in records:
                encode(value)
    return time.perf_counter() - started, events


async def _closed_loop(bootstrap: str, nodes: int, steps: int) -> tuple[float, int]:
    prefix = f"bench-{uuid.uuid4().hex[:8]}."
    await ensure_topics(bootstrap, prefix=prefix)
    sim = _sim(nodes)
    dispatcher = build_dispatcher(
        SimControl(sim.fleet), {"bench": b"bench-key-0123456789"}, CollectorRegistry()
    )
    async with (
        KafkaPublisher(bootstrap, topic_prefix=prefix) as publisher,
        CommandConsumer(bootstrap, group_id=prefix + "executors", topic_prefix=prefix) as consumer,
    ):
        started = time.perf_counter()
        stats = await run_closed_loop(
            sim,
            dispatcher,
            publisher,
            consumer,
            ticks=steps,
            speed=1e9,  # as fast as it can
        )
        return time.perf_counter() - started, stats.acked


def _line(label: str, elapsed_s: float, events: int, steps: int, interval_s: float) -> float:
    rate = steps / elapsed_s
    print(
        f"{label:44}: {events / elapsed_s:9,.0f} events/s  {rate:7.1f} steps/s  "
        f"up to x{rate * interval_s:,.0f} real time"
    )
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    interval_s = load_scenario(SCENARIO).fleet.interval_s
    print(
        f"{args.nodes} nodes x 8 devices, {args.steps} steps of {interval_s:g} s ({SCENARIO.name})"
    )
    step_s, events = _step_only(args.nodes, args.steps, encode_too=False)
    base = _line("simulator steps + telemetry (baseline)", step_s, events, args.steps, interval_s)
    enc_s, events = _step_only(args.nodes, args.steps, encode_too=True)
    _line("  + JSON encoding", enc_s, events, args.steps, interval_s)
    with tempfile.TemporaryDirectory(prefix="fleetloop-bench-") as tmp:
        with bench_broker(Path(tmp)) as bootstrap:
            loop_s, acked = asyncio.run(_closed_loop(bootstrap, args.nodes, args.steps))
        loop = _line(
            "closed loop: + executors + publish (acks=all)", loop_s, acked, args.steps, interval_s
        )
    print(f"closed loop / simulator alone: {loop / base:.2f}")


if __name__ == "__main__":
    main()
