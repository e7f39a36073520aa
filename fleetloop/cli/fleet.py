"""`fleetloop agent`, `sim` and `node`: what runs on, or stands in for, the fleet's hosts."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from datetime import UTC, datetime

from fleetloop.cli.flags import add_settings_flags, settings_from
from fleetloop.settings import AgentSettings, NodeSettings, SimSettings


def _cmd_agent(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry, start_http_server

    from agents.publisher import KafkaPublisher
    from agents.runner import run_agent
    from agents.simulated import SimulatedFleetAgent
    from agents.spool import DiskSpool

    settings = settings_from(AgentSettings, args)
    registry = CollectorRegistry()
    if settings.metrics_port is not None:
        start_http_server(settings.metrics_port, addr=settings.metrics_bind, registry=registry)
    agent = SimulatedFleetAgent(
        nodes=settings.nodes,
        devices_per_node=settings.devices_per_node,
        seed=settings.seed,
        start=datetime.now(UTC),
        interval_s=settings.interval_s,
    )

    async def main() -> int:
        spool = (
            DiskSpool(settings.spool_dir, max_bytes=settings.spool_max_bytes)
            if settings.spool_dir is not None
            else None
        )
        async with KafkaPublisher(
            settings.kafka_bootstrap,
            topic_prefix=settings.topic_prefix,
            registry=registry,
            spool=spool,
            send_timeout_s=settings.send_timeout_s,
        ) as publisher:
            return await run_agent(
                agent,
                publisher,
                ticks=settings.ticks,
                interval_s=settings.interval_s,
                on_tick=lambda n, sent: logging.info("tick %d: %d events acknowledged", n, sent),
            )

    sent = asyncio.run(main())
    print(f"published {sent} events")
    return 0


def _cmd_sim(args: argparse.Namespace) -> int:
    from agents.sim.scenario import ScenarioError
    from fleetloop.sim import run_sim

    settings = settings_from(SimSettings, args)
    try:
        settings.verification_keys()
        return run_sim(settings)
    except (ScenarioError, ValueError) as exc:
        print(f"fleetloop sim: {exc}", file=sys.stderr)
        return 1


def _cmd_node(args: argparse.Namespace) -> int:
    from fleetloop.node import run_node

    settings = settings_from(NodeSettings, args)
    try:
        settings.verification_keys()
    except ValueError as exc:
        print(f"fleetloop node: {exc}", file=sys.stderr)
        return 1
    try:
        return run_node(settings)
    except Exception as exc:  # NVML missing or refusing: say so plainly
        if type(exc).__name__.startswith("NVMLError"):
            print(f"fleetloop node: NVML: {exc} (is the NVIDIA driver loaded?)", file=sys.stderr)
            return 1
        raise


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    agent = sub.add_parser("agent", help="run the simulated node agents")
    add_settings_flags(agent, AgentSettings)
    agent.set_defaults(func=_cmd_agent)

    sim = sub.add_parser(
        "sim", help="run the closed-loop fleet simulator with its executors against Kafka"
    )
    add_settings_flags(sim, SimSettings)
    sim.set_defaults(func=_cmd_sim)

    node = sub.add_parser(
        "node", help="a real GPU host: NVML telemetry and the node executor (power, clocks)"
    )
    add_settings_flags(node, NodeSettings)
    node.set_defaults(func=_cmd_node)
