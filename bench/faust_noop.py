"""A faust worker whose processors only count: faust's own ceiling on this machine.

Run by ``bench.ingest_throughput`` as a subprocess; prints ``rate <events/s>``
once it has seen ``--events`` messages across the telemetry topics, then exits.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from typing import Any

import faust

from fleetloop.worker import tune_gc
from schemas.topics import TELEMETRY_TOPICS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--events", type=int, required=True)
    args = parser.parse_args()
    app = faust.App(
        f"bench-noop-{uuid.uuid4().hex[:6]}",
        broker=f"kafka://{args.bootstrap}",
        store="memory://",
        value_serializer="raw",
        key_serializer="raw",
        web_enabled=False,
        topic_disable_leader=True,
        topic_allow_declare=False,
        consumer_auto_offset_reset="earliest",
        datadir=tempfile.mkdtemp(prefix="noop-"),
    )
    seen = {"n": 0}
    started: list[float] = []

    async def count(stream: Any) -> None:
        async for events in stream.noack_take(10_000, within=0.5):  # as the worker
            for event in events:
                await stream.ack(event)
            if not started:
                started.append(time.perf_counter())
            seen["n"] += len(events)
            if seen["n"] >= args.events:
                rate = seen["n"] / (time.perf_counter() - started[0])
                os.write(1, f"\nrate {rate:.0f}\n".encode())  # faust redirects sys.stdout
                os._exit(0)

    for spec in TELEMETRY_TOPICS:
        topic = app.topic(args.prefix + spec.name, value_type=bytes, key_type=bytes)
        app.agent(topic, name=f"noop.{spec.table}")(count)
    tune_gc()  # the same runtime settings as the real worker
    faust.Worker(app, loglevel="error", quiet=True).execute_from_commandline()


if __name__ == "__main__":
    main()
