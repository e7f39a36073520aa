"""Fault to command, with a health worker carrying its share of the design point.

A health worker (``fleetloop worker --processors health``, its own process, as
deployed) is fed, live at one tick a second, the telemetry of ``--devices``
devices: its share of the 100,000-device design point when the role runs in
``100000 / devices`` processes (20,000 devices: 5 processes, the whole cores
``bench.design_point`` measures for the role, rounded up). The fleet is the
simulator's, pre-generated (so this process only replays bytes on time) with two
faults after a warm-up: a double-bit ECC fault on one device (a hard fault) and a
grey slowdown of ``--grey-ratio`` on another. Telemetry topics stamp records
with the broker's clock (LogAppendTime), as in production.

It prints the worker's utilisation (its CPU seconds over the wall seconds of the
replay), the detector group's largest lag seen, and:

- hard fault -> quarantine command: from the broker's append of the event that
  caused the decision (``cause_appended_at``) to the broker's append of the
  signed quarantine command, for the faulty device (goal: p99 <= 1 s; with one
  faulty device per run, run it several times or raise ``--hard-faults``);
- grey slowdown -> first non-healthy verdict: from the fault's first tick on the
  broker to the verdict's append (goal: <= 30 s);
- isolations of healthy devices (goal: none).

    python -m bench.latency_under_load --devices 20000 --seconds 150
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from agents.envelopes import pack
from agents.sim.scenario import FaultKind, FaultSpec, FleetSpec, Scenario, TargetSpec
from agents.sim.simulation import Simulation
from bench.broker import bench_broker
from fleetloop.kafka_broker import free_port
from fleetloop.settings import REPO_ROOT
from fleetloop.topics_admin import ensure_topics, read_topic
from schemas.codec import decode, encode
from schemas.commands import RouteAction, RouteCommand
from schemas.topics import DECISIONS, ROUTE_COMMANDS, TELEMETRY_TOPICS, VERDICTS
from schemas.verdicts import Decision, HealthStatus, Verdict
from streams.lag import fetch_lag
from streams.role_loop import role_group

DEVICES_PER_NODE = 8
Tick = list[tuple[str, bytes, bytes]]  # (topic, key, value) of one second


def _scenario(devices: int, seconds: int, warmup_s: int, grey: float, hard: int) -> Scenario:
    nodes = devices // DEVICES_PER_NODE
    faults = [  # hard faults on nodes spread over the fleet, device 1; the grey one device 5
        FaultSpec(
            kind=FaultKind.ECC_STORM,
            target=TargetSpec(node=(i * 7919 + 3) % nodes, device=1),
            start_s=warmup_s + 7 * i,
            duration_s=seconds,
            params={"lead_s": 1.0},
        )
        for i in range(hard)
    ]
    faults.append(
        FaultSpec(
            kind=FaultKind.GREY_SLOWDOWN,
            target=TargetSpec(node=nodes // 2, device=5),
            start_s=warmup_s,
            duration_s=seconds,
            params={"slowdown_ratio": grey},
        )
    )
    fleet = FleetSpec(nodes=nodes, devices_per_node=DEVICES_PER_NODE, seed=23)
    return Scenario(fleet=fleet, faults=faults)


def _generate(scenario: Scenario, seconds: int, start: datetime, prefix: str) -> list[Tick]:
    sim = Simulation(scenario, start=start)
    ticks: list[Tick] = []
    for n in range(seconds):
        ticks.append(
            [(prefix + spec.name, spec.key_for(v), encode(v)) for spec, v in pack(sim.tick(n))]
        )
    return ticks


async def _replay(
    bootstrap: str, ticks: list[Tick], start: datetime, on_start: Callable[[], None]
) -> float:
    """Send each tick at its second; return the latest a tick finished past its second."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5,
        max_batch_size=1024 * 1024,
    )  # fmt: skip
    await producer.start()
    late = 0.0
    try:
        for n, tick in enumerate(ticks):
            due = (start + timedelta(seconds=n) - datetime.now(UTC)).total_seconds()
            if due > 0:
                await asyncio.sleep(due)
            if n == 0:
                on_start()
            sent = [await producer.send(topic, value, key=key) for topic, key, value in tick]
            await asyncio.gather(*sent)
            late = max(late, (datetime.now(UTC) - start).total_seconds() - n)
    finally:
        await producer.stop()
    return late


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _watch_lag(bootstrap: str, group: str, topics: list[str], out: list[int]) -> None:
    while True:
        with contextlib.suppress(Exception):  # the group is not there yet
            out.append(sum((await fetch_lag(bootstrap, group, topics)).values()))
        await asyncio.sleep(2.0)


def _percentile(values: list[float], quantile: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=20_000)
    parser.add_argument("--seconds", type=int, default=150)
    parser.add_argument("--warmup-s", type=int, default=60)
    parser.add_argument("--grey-ratio", type=float, default=0.15)
    parser.add_argument("--hard-faults", type=int, default=10)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO_ROOT))
    from tests.integration.worker_proc import WorkerProcess

    scenario = _scenario(
        args.devices, args.seconds, args.warmup_s, args.grey_ratio, args.hard_faults
    )
    with tempfile.TemporaryDirectory(prefix="fleetloop-latency-") as tmp:
        home = Path(tmp)
        with bench_broker(home) as bootstrap:
            prefix = f"lat-{uuid.uuid4().hex[:6]}."
            asyncio.run(ensure_topics(bootstrap, prefix=prefix, log_append_time=True))
            app_id = prefix.rstrip(".")
            worker = WorkerProcess(
                bootstrap=bootstrap, prefix=prefix, home=home / "health", web_port=free_port(),
                extra=("--processors", "health", "--loglevel", "warning"),
                env={"FLEETLOOP_COMMAND_KEYS": f"bench={secrets.token_urlsafe(24)}"},
            )  # fmt: skip
            probe = Simulation(scenario, start=datetime.now(UTC))
            began = time.perf_counter()
            probe.tick(0)  # the first step builds the fleet: not what a step costs
            stepped = time.perf_counter()
            for n in range(1, 4):
                pack(probe.tick(n))
            per_tick = (time.perf_counter() - stepped) / 3
            lead_s = 30 + per_tick * args.seconds * 1.5  # generation, and the worker's start
            start = datetime.now(UTC) + timedelta(seconds=lead_s)
            ticks = _generate(scenario, args.seconds, start, prefix)
            messages = sum(len(t) for t in ticks)
            print(
                f"{args.devices} devices ({args.devices // DEVICES_PER_NODE} nodes), "
                f"{args.seconds} s, {messages} messages ({messages / args.seconds:,.0f}/s); "
                f"generated in {time.perf_counter() - began:.0f} s"
            )
            worker.start()
            try:
                assert worker.proc is not None
                if datetime.now(UTC) > start:
                    print(f"warning: the replay starts {datetime.now(UTC) - start} late")
                topics = [prefix + s.name for s in TELEMETRY_TOPICS]
                lags: list[int] = []

                async def run() -> tuple[float, float, float]:
                    watch = asyncio.create_task(
                        _watch_lag(bootstrap, role_group(app_id, "health.detect"), topics, lags)
                    )
                    assert worker.proc is not None
                    pid = worker.proc.pid
                    began: list[tuple[float, float]] = []
                    try:
                        late = await _replay(
                            bootstrap, ticks, start,
                            lambda: began.append((time.monotonic(), _cpu_s(pid))),
                        )  # fmt: skip
                        wall = time.monotonic() - began[0][0]
                        cpu = _cpu_s(pid) - began[0][1]
                        await asyncio.sleep(15)  # the last verdicts and commands
                    finally:
                        watch.cancel()
                    return late, cpu / wall, wall

                late, utilisation, wall = asyncio.run(run())
                stalls = _stalls(worker.series())
            finally:
                worker.stop()
            read = {
                spec.name: asyncio.run(read_topic(bootstrap, prefix + spec.name))
                for spec in (VERDICTS, DECISIONS, ROUTE_COMMANDS)
            }
    _report(args, scenario, start, read, late, utilisation, wall, lags)
    print("worker's event loop, wake-ups late by more than: " + ", ".join(
        f"{bound:g} s {count:.0f}" for bound, count in stalls.items()
    ))  # fmt: skip


def _stalls(series: list[tuple[str, float]]) -> dict[float, float]:
    """The worker's stall probe (``fleetloop_event_loop_stall_seconds``) over the run: how
    many wake-ups came later than each bucket bound from 0.1 s up."""
    name = "fleetloop_event_loop_stall_seconds"
    total = next(v for s, v in series if s == name + "_count")
    buckets = {
        float(s.split('le="')[1].split('"')[0]): v
        for s, v in series
        if s.startswith(name + "_bucket") and 'le="+Inf"' not in s
    }
    return {bound: total - within for bound, within in sorted(buckets.items()) if bound >= 0.1}


def _report(
    args: Any,
    scenario: Scenario,
    start: datetime,
    read: dict[str, list[tuple[bytes, datetime]]],
    late: float,
    utilisation: float,
    wall: float,
    lags: list[int],
) -> None:
    nodes = scenario.fleet.nodes
    uuid_of = {  # the simulator's device ids: node-NNNNN-gpuD
        (f.target.node, f.target.device): f"node-{f.target.node:05d}-gpu{f.target.device}"
        for f in scenario.faults
    }
    hard = {uuid_of[(f.target.node, f.target.device)]: f for f in scenario.faults
            if f.kind is FaultKind.ECC_STORM}  # fmt: skip
    grey = next(f for f in scenario.faults if f.kind is FaultKind.GREY_SLOWDOWN)
    grey_uuid = uuid_of[(grey.target.node, grey.target.device)]
    decisions = {
        d.decision_id: d for d in (decode(raw, Decision) for raw, _ in read["decisions.v1"])
    }
    isolating = {RouteAction.DRAIN, RouteAction.QUARANTINE, RouteAction.STOP_NEW_SESSIONS}
    to_quarantine: dict[str, float] = {}
    wrongly: set[str] = set()
    for raw, appended in read[ROUTE_COMMANDS.name]:
        command = decode(raw, RouteCommand)
        device = command.target.device_uuid or ""
        if command.action in isolating and device not in hard and device != grey_uuid:
            wrongly.add(device or str(command.target.node_id))
        if command.action is RouteAction.QUARANTINE and device in hard:
            cause = (
                decisions[command.decision_id].cause_appended_at if command.decision_id else None
            )
            if cause is not None and device not in to_quarantine:
                to_quarantine[device] = (appended - cause).total_seconds()
    grey_start = start + timedelta(seconds=grey.start_s)
    grey_seen = [
        (appended - grey_start).total_seconds()
        for raw, appended in read[VERDICTS.name]
        if (v := decode(raw, Verdict)).device_uuid == grey_uuid
        and v.status != HealthStatus.HEALTHY
        and appended >= grey_start
    ]
    share = args.devices * 1.875  # samples/s: accelerator, serving, heartbeats of the mix
    print(f"worker: {utilisation:.2f} of a core over the {wall:.0f} s replay; largest lag seen "
          f"{max(lags, default=-1)} messages; replay at most {late:.2f} s behind its clock; "
          f"share {args.devices} of 100,000 devices ({100_000 / args.devices:.0f} processes), "
          f"about {share:,.0f} samples/s, nodes {nodes}")  # fmt: skip
    failed_at: dict[str, datetime] = {}  # each faulty device's first failed verdict
    for raw, appended in read[VERDICTS.name]:
        v = decode(raw, Verdict)
        if v.device_uuid in hard and v.status is HealthStatus.FAILED:
            failed_at.setdefault(v.device_uuid, appended)
    for device, fault in sorted(hard.items(), key=lambda kv: kv[1].start_s):
        fault_at = start + timedelta(seconds=fault.start_s + fault.param("lead_s"))
        line = f"  {device}: double-bit fault due at {fault_at:%H:%M:%S}"
        if device in failed_at:
            line += f"; failed verdict +{(failed_at[device] - fault_at).total_seconds():.3f} s"
        if device in to_quarantine:
            line += f"; its cause -> quarantine command {to_quarantine[device]:.3f} s"
        print(line)
    if to_quarantine:
        values = list(to_quarantine.values())
        print(f"hard fault -> quarantine command: {len(values)} of {len(hard)} devices; "
              f"p50 {_percentile(values, 0.5):.3f} s, p99 {_percentile(values, 0.99):.3f} s, "
              f"max {max(values):.3f} s (goal p99 <= 1 s)")  # fmt: skip
    else:
        print(f"hard fault -> quarantine command: none of {len(hard)} devices quarantined")
    if grey_seen:
        print(f"grey slowdown {args.grey_ratio:.0%} -> first non-healthy verdict: "
              f"{min(grey_seen):.1f} s after it began (goal <= 30 s)")  # fmt: skip
    else:
        print(f"grey slowdown {args.grey_ratio:.0%}: not detected")
    print(f"healthy devices isolated: {len(wrongly)} {sorted(wrongly)[:5]}")


if __name__ == "__main__":
    main()
