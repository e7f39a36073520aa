"""`fleetloop sim`: wiring for the simulated fleet, its executors and the broker."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from agents.executors.dispatch import CommandDispatcher, GatedExecutor
from agents.executors.executors import NodeExecutor, RouterExecutor, Scope, Warmer
from agents.executors.gate import CommandGate, SeenCommands
from agents.loop import LoopStats
from agents.sim.control import SimControl
from agents.sim.scenario import Scenario, load_scenario
from agents.sim.simulation import Simulation
from fleetloop.loop import keep_seen, load_seen, run_loop, wiring_for
from fleetloop.settings import SimSettings

log = logging.getLogger(__name__)


def build_simulation(settings: SimSettings, *, start: datetime | None = None) -> Simulation:
    scenario = load_scenario(settings.scenario) if settings.scenario else Scenario()
    return Simulation(
        scenario, start=start or datetime.now(UTC), nodes=settings.nodes, seed=settings.seed
    )


def build_dispatcher(
    control: SimControl,
    keys: dict[str, bytes],
    registry: CollectorRegistry,
    *,
    seen: SeenCommands | None = None,
) -> CommandDispatcher:
    """All three executors on the simulated fleet, sharing one replay memory: a command
    id is applied once by this process, whichever executor it reaches."""
    gate = CommandGate(keys=keys, seen=seen)
    return CommandDispatcher(
        {
            Scope.NODE: GatedExecutor("node-executor", NodeExecutor(control), gate),
            Scope.ROUTER: GatedExecutor("router-executor", RouterExecutor(control), gate),
            Scope.WARMER: GatedExecutor("warmer", Warmer(control), gate),
        },
        registry=registry,
    )


async def run_sim_async(
    settings: SimSettings,
    sim: Simulation,
    *,
    registry: CollectorRegistry | None = None,
    on_tick: Callable[[int, LoopStats], None] | None = None,
) -> LoopStats:
    registry = registry or CollectorRegistry()
    control = SimControl(sim.fleet)
    seen = load_seen(settings.seen_file)
    dispatcher = build_dispatcher(control, settings.verification_keys(), registry, seen=seen)
    wiring = wiring_for(
        settings,
        group_id=settings.group_id or "fleetloop-sim-executors",
        client_id="fleetloop-sim",
        pages={"/routes": control.table},
    )
    if settings.truth_file is not None:
        sim.write_truth(settings.truth_file)
    try:
        return await run_loop(
            sim,
            dispatcher,
            wiring,
            ticks=settings.ticks or sim.ticks,
            speed=settings.speed,
            registry=registry,
            on_tick=on_tick,
            on_published=keep_seen(settings.seen_file, seen),
        )
    finally:
        if settings.truth_file is not None:
            sim.write_truth(settings.truth_file)  # with the consequences observed


def run_sim(settings: SimSettings) -> int:
    sim = build_simulation(settings)
    f = sim.fleet
    print(
        f"[sim] {sim.scenario.name}: {len(f.nodes)} nodes, {len(f.devices)} devices, "
        f"{len(sim.faults.resolved)} faults, speed x{settings.speed:g}; router table at "
        f"http://{settings.web_bind}:{settings.web_port}/routes"
    )

    def report(tick: int, stats: LoopStats) -> None:
        if tick % max(1, round(10 * settings.speed)) == 0:
            log.info(
                "step %d (t=%.0fs): %d events, %d results, %d acknowledged",
                tick,
                f.t_s,
                stats.events,
                stats.results,
                stats.acked,
            )

    stats = asyncio.run(run_sim_async(settings, sim, on_tick=report))
    print(f"[sim] {stats.ticks} steps, {stats.events} events, {stats.results} command results")
    return 0
