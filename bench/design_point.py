"""The design point: 100,000 devices sampled every second, on how many cores?

Pre-produces a proportional slice of the fleet (``--nodes`` nodes of 8 devices for
``--seconds`` seconds of its life, as agents publish it: node-tick envelopes), then
runs each role as production runs it (``fleetloop worker --processors ROLE``, its own
process) at full speed over the slice, and measures the CPU seconds the process spent
from its first consumed message to its last (every thread: chDB's too). Per role it
prints the input samples per CPU second, the cores the role needs at the design point
(its share of the design point's samples per second over that rate), and the total.
Beside them, the broker's own ceiling on the same machine: Kafka's producer and
consumer performance tools (from the same jars) on records of the envelopes' size.

    python -m bench.design_point --nodes 500 --seconds 60

Scaling is honest only if the per-sample costs do not grow with the fleet: they do
not for ingest (per row) and the planners (per pool and rack), and for health the
detector's state is per device (a dict lookup) and its cohort models per cohort.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka.errors import KafkaError

from agents.envelopes import pack
from agents.simulated import SimulatedFleetAgent
from bench.broker import bench_broker
from bench.ingest_throughput import produce
from fleetloop.kafka_broker import free_port
from fleetloop.settings import REPO_ROOT, BrokerSettings
from fleetloop.topics_admin import ensure_topics
from schemas.codec import encode
from schemas.topics import (
    ACCELERATOR_TICKS,
    DEMAND,
    NODE_HEALTH,
    PDU,
    SERVING_STEPS,
    SERVING_TICKS,
    TELEMETRY_TOPICS,
    TopicKind,
    TopicSpec,
    regional,
)
from streams.lag import fetch_lag
from streams.rows import LAYOUTS

DESIGN_DEVICES = 100_000
DEVICES_PER_NODE = 8
ROLE_GROUPS: dict[str, tuple[tuple[str, tuple[TopicSpec, ...]], ...]] = {
    "ingest": (("ingest", (ACCELERATOR_TICKS, SERVING_TICKS, NODE_HEALTH, PDU, DEMAND)),),
    "health": (("health.detect", (ACCELERATOR_TICKS, NODE_HEALTH, SERVING_TICKS)),),
    "demand": (("demand.serving", (SERVING_TICKS,)), ("demand.plan", (DEMAND, SERVING_STEPS))),
    "control": (
        ("control.route", (SERVING_TICKS, PDU, ACCELERATOR_TICKS)),
        ("control.plan", tuple(regional(s) for s in (SERVING_TICKS, PDU, ACCELERATOR_TICKS))),
    ),
}
"""The consumer groups (suffixes of the app id) of each role, and what each reads: the
telemetry, and the roles' own repartitions (``demand.serving`` to ``demand.plan``,
``control.route`` to ``control.plan``)."""
ROLE_INPUTS: dict[str, tuple[TopicSpec, ...]] = {
    role: tuple(s for _, reads in groups for s in reads if s.kind is TopicKind.TELEMETRY)
    for role, groups in ROLE_GROUPS.items()
}
"""What each role reads of the telemetry (v2 envelopes where agents publish them)."""


def _cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid`` (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run_role(
    role: str, bootstrap: str, prefix: str, home: Path, inputs: dict[str, int]
) -> tuple[float, float]:
    """Input samples per CPU second, and per wall second, of one role's worker process,
    from the moment it answers (before it joins its group: the wall rate includes the
    join, a few seconds; the CPU rate hardly does) until its groups' lag is nil."""
    sys.path.insert(0, str(REPO_ROOT))
    from tests.integration.worker_proc import WorkerProcess

    app_id = f"{prefix}{role}-{uuid.uuid4().hex[:4]}"
    worker = WorkerProcess(bootstrap=bootstrap, prefix=prefix, home=home, web_port=free_port())
    worker.args[worker.args.index("--app-id") + 1] = app_id
    worker.args += ["--processors", role, "--loglevel", "warning"]
    groups = [
        (f"{app_id}.{suffix}", [prefix + spec.name for spec in reads])
        for suffix, reads in ROLE_GROUPS[role]
    ]
    total = sum(inputs[spec.name] for spec in ROLE_INPUTS[role])
    worker.start()  # returns once it answers: imported, ClickHouse open, about to join
    try:
        assert worker.proc is not None
        pid = worker.proc.pid
        ready = (time.monotonic(), _cpu_s(pid))  # from here its CPU is the role's work
        lag = -1
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            try:
                lag = sum(
                    sum(asyncio.run(fetch_lag(bootstrap, group, topics)).values())
                    for group, topics in groups
                )
            except KafkaError:  # the group's coordinator is not known yet: ask again
                time.sleep(0.25)
                continue
            if lag == 0:
                wall, cpu = time.monotonic() - ready[0], _cpu_s(pid) - ready[1]
                return total / max(cpu, 1e-9), total / max(wall, 1e-9)
            time.sleep(0.25)
        raise RuntimeError(f"{role} did not finish (lag {lag}): {worker.log_tail()}")
    finally:
        worker.stop()


def _broker_ceiling(bootstrap: str, record_bytes: int, records: int) -> tuple[float, float]:
    """Records per second of Kafka's own producer and consumer performance tools."""
    libs = BrokerSettings().jar_dir
    classpath = f"{next(libs.glob('*/libs'))}/*"
    topic = f"perf-{uuid.uuid4().hex[:6]}"
    spec = TopicSpec(topic, TopicKind.TELEMETRY, bytes, ("node_id",), 12, 3_600_000)
    asyncio.run(ensure_topics(bootstrap, prefix="", specs=(spec,)))  # no auto-creation here
    base = ["java", "-Xmx512m", "-cp", classpath]
    produced = subprocess.run(
        [*base, "org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
         "--num-records", str(records), "--record-size", str(record_bytes), "--throughput",
         "-1", "--producer-props", f"bootstrap.servers={bootstrap}", "acks=all",
         "linger.ms=20", "batch.size=1048576"],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    consumed = subprocess.run(
        [*base, "org.apache.kafka.tools.ConsumerPerformance", "--topic", topic,
         "--messages", str(records), "--bootstrap-server", bootstrap, "--timeout", "60000"],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    produce_rate = float(re.findall(r"([\d.]+) records/sec", produced.stdout)[-1])
    row = consumed.stdout.strip().splitlines()[-1].split(",")
    return produce_rate, float(row[5])  # nMsg.sec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--roles", default="ingest,health,demand,control")
    args = parser.parse_args()
    devices = args.nodes * DEVICES_PER_NODE
    scale = DESIGN_DEVICES / devices
    agent = SimulatedFleetAgent(
        nodes=args.nodes, devices_per_node=DEVICES_PER_NODE, seed=17, start=datetime.now(UTC)
    )
    records: list[tuple[TopicSpec, Any]] = []
    for tick in range(args.seconds):
        records += pack(agent.tick(tick))
    inputs: Counter[str] = Counter()
    sizes: list[int] = []
    for spec, value in records:
        inputs[spec.name] += LAYOUTS[type(value)].rows(value)
        inputs[f"{spec.name}#messages"] += 1
        if spec.envelope:
            sizes.append(len(encode(value)))
    print(
        f"slice: {args.nodes} nodes, {devices} devices, {args.seconds} s, {len(records)} "
        f"messages; design point: {DESIGN_DEVICES} devices at 1 s ({scale:.0f}x the slice)"
    )
    for spec in TELEMETRY_TOPICS:
        if inputs[spec.name]:
            per_s = inputs[spec.name] * scale / args.seconds
            print(f"  {spec.name:28} {inputs[spec.name]:>9} samples; at design {per_s:>10,.0f}/s")
    with tempfile.TemporaryDirectory(prefix="fleetloop-design-") as tmp:
        home = Path(tmp)
        with bench_broker(home) as bootstrap:
            prefix = f"dp-{uuid.uuid4().hex[:6]}."
            asyncio.run(ensure_topics(bootstrap, prefix=prefix, specs=TELEMETRY_TOPICS))
            asyncio.run(produce(bootstrap, prefix, records))
            total_cores = 0.0
            print(
                f"{'role':8} {'samples/CPU-s':>14} {'samples/s':>12} {'design/s':>12} {'cores':>6}"
            )
            for role in args.roles.split(","):
                per_cpu, per_wall = _run_role(role, bootstrap, prefix, home / role, inputs)
                design = sum(inputs[s.name] for s in ROLE_INPUTS[role]) * scale / args.seconds
                cores = design / per_cpu
                total_cores += cores
                print(
                    f"{role:8} {per_cpu:>14,.0f} {per_wall:>12,.0f} {design:>12,.0f} {cores:>6.1f}"
                )
            print(f"total cores at the design point (goal <= 16): {total_cores:.1f}")
            record_bytes = sum(sizes) // max(1, len(sizes))
            try:
                producer_rate, consumer_rate = _broker_ceiling(bootstrap, record_bytes, 50_000)
                enveloped = sum(LAYOUTS[type(v)].rows(v) for s, v in records if s.envelope)
                per_message = enveloped / len(sizes)
                print(
                    f"broker ceiling, {record_bytes} B records (an envelope): produce "
                    f"{producer_rate:,.0f}/s, consume {consumer_rate:,.0f}/s = "
                    f"{consumer_rate * per_message:,.0f} samples/s at {per_message:.1f} per message"
                )
            except (subprocess.SubprocessError, StopIteration, IndexError) as exc:
                print(f"broker ceiling not measured: {exc!r}")


if __name__ == "__main__":
    main()
