"""`fleetloop node`: the agent and node executor of a real GPU host, through NVML."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from agents.collectors.base import NodeIdentity
from agents.collectors.nvml import NvmlGpuReader, NvmlNodeControl, NvmlSession
from agents.executors.dispatch import CommandDispatcher, GatedExecutor
from agents.executors.executors import NodeExecutor, Scope
from agents.executors.gate import CommandGate
from agents.gpu_node import GpuNode
from agents.loop import LoopStats
from fleetloop.loop import keep_seen, load_seen, run_loop, wiring_for
from fleetloop.settings import NodeSettings

log = logging.getLogger(__name__)


def identity_of(settings: NodeSettings) -> NodeIdentity:
    return NodeIdentity(
        settings.node_id, settings.region, settings.pod_id, settings.rack_id, settings.pdu_id
    )


async def run_node_async(
    settings: NodeSettings,
    *,
    nvml: Any = None,
    registry: CollectorRegistry | None = None,
    on_tick: Callable[[int, LoopStats], None] | None = None,
) -> LoopStats:
    """Sample NVML every ``interval_s`` and act on this host's commands (``nvml``: a fake in
    tests, the real pynvml otherwise)."""
    registry = registry or CollectorRegistry()
    identity = identity_of(settings)
    session = NvmlSession(nvml)  # one NVML initialisation for the reader and the levers
    reader = NvmlGpuReader(identity, session=session)
    control = NvmlNodeControl(identity, session=session)
    gpu_node = GpuNode(identity, reader, interval_s=settings.interval_s)
    seen = load_seen(settings.seen_file)
    gate = CommandGate(keys=settings.verification_keys(), seen=seen)
    executor = GatedExecutor(
        "node-executor", NodeExecutor(control), gate, accepts=gpu_node.addressed_to_me
    )
    dispatcher = CommandDispatcher({Scope.NODE: executor}, registry=registry)
    wiring = wiring_for(
        settings,
        group_id=settings.group_id or f"fleetloop-node-{settings.node_id}",
        client_id=f"fleetloop-node-{settings.node_id}",
    )
    try:
        return await run_loop(
            gpu_node,
            dispatcher,
            wiring,
            ticks=settings.ticks,
            registry=registry,
            on_tick=on_tick,
            on_published=keep_seen(settings.seen_file, seen),
        )
    finally:
        reader.close()  # frees its event set and shuts the shared session down


def run_node(settings: NodeSettings) -> int:
    print(f"[node] {settings.node_id}: NVML every {settings.interval_s:g}s, node executor on")
    stats = asyncio.run(run_node_async(settings))
    print(f"[node] {stats.ticks} samples, {stats.events} events, {stats.results} command results")
    return 0
