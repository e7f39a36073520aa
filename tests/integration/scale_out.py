"""What the scale-out tests share: a simulated fleet and three workers of one role with the
same app id, on the real broker."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fleetloop.kafka_broker import free_port
from fleetloop.topics_admin import ensure_topics
from tests.integration.sim_proc import SimProcess
from tests.integration.worker_proc import WorkerProcess

NODES = 24


def fleet_and_workers(
    bootstrap: str, prefix: str, home: Path, *processors: str
) -> tuple[SimProcess, list[WorkerProcess]]:
    """The topics, a simulator of ``NODES`` nodes and three workers (not started) that run
    ``processors`` (the worker's arguments) with the same app id."""
    asyncio.run(ensure_topics(bootstrap, prefix=prefix))
    sim = SimProcess(bootstrap=bootstrap, prefix=prefix, home=home, web_port=free_port())
    sim.args[sim.args.index("--nodes") + 1] = str(NODES)
    extra = ("--processors", *processors, "--batch-within-s", "0.3")
    workers = [
        WorkerProcess(
            bootstrap=bootstrap,
            prefix=prefix,
            home=home / f"w{i}",
            web_port=free_port(),
            extra=extra,
        )
        for i in range(3)
    ]
    return sim, workers
