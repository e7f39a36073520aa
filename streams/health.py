"""Health and isolation processors: thin adapters around the pure detector and ladder.

``health.detect`` reads accelerator, node-health and serving telemetry (all
keyed by node, so one worker sees every signal of the nodes it owns), feeds
:class:`~models.health.HealthDetector` and publishes verdicts; it is a role loop
(:mod:`streams.role_loop`: raw fetches, its own consumer group), as it reads
every sample of the fleet. ``health.isolate``
reads every verdict (one partition: its guardrail is fleet-wide; a role loop too, so a
verdict is acted on as soon as it is fetched), steps the
:class:`~controllers.isolation.IsolationLadder`, and publishes one decision
per step (:func:`planning.isolation.decide`), plus a signed route command when
the step is allowed and a signing key is configured (advisory otherwise: the
decision says what would have been sent). A one-second timer lets dwell times
and probations run out.

The ladder and its guardrail are durable: every change is written to the
compacted ``state.isolation.v1`` (:mod:`planning.isolation_state`), acknowledged
before the commands it leads to are sent, and read back before the first
decision after a start or a rebalance. The detector's per-device records go to
``state.health.v1`` every ``memory_every_s`` and are recalled for a partition
before its first sample (:mod:`models.health_memory`); its per-cohort models are
not kept and are back within a minute of samples.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from datetime import UTC, datetime
from typing import Any, cast

import faust
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge

from controllers.clock import EventClock
from controllers.isolation import IsolationLadder, LadderDecision
from models.health_memory import recall, remember
from planning import isolation
from planning.isolation import HealthWiring, attribute, decide
from planning.isolation_state import IsolationJournal, resume
from planning.issuing import Output
from schemas.codec import DecodeError, decode, decode_samples, encode
from schemas.envelopes import AcceleratorTick, ServingTick
from schemas.events import AcceleratorTelemetry, NodeHealth, ServingMetrics
from schemas.state import DetectorMemory, IsolationRecord
from schemas.topics import (
    ACCELERATOR,
    ACCELERATOR_TICKS,
    HEALTH_STATE,
    ISOLATION_STATE,
    NODE_HEALTH,
    SERVING,
    SERVING_TICKS,
    VERDICTS,
    TopicSpec,
)
from schemas.verdicts import HealthStatus, Level, Verdict
from streams.fatal import fail_stop
from streams.outputs import Outputs
from streams.page_access import PageAccess, refusal
from streams.role_loop import RoleLoops
from streams.state_topic import StateTopic

log = logging.getLogger(__name__)

YIELD_EVERY = 100
"""Messages the detector handles (about 800 samples, 25 ms) before it lets the other tasks
of the worker's event loop run: the ladder waits for no more than that."""
DRAINED_EVERY_S = 0.25
"""The least processing time between two asks of the broker for log end offsets."""

DETECTED = (ACCELERATOR_TICKS, NODE_HEALTH, SERVING_TICKS, ACCELERATOR, SERVING)
"""What ``health.detect`` reads: node ticks (v2) and, from agents not yet upgraded, v1."""


class HealthMetrics:
    def __init__(self, registry: CollectorRegistry, outputs: Outputs) -> None:
        self.verdicts = Counter(
            "fleetloop_verdicts_total", "Verdicts published, by status", ["status"],
            registry=registry,
        )  # fmt: skip
        self.scoring = outputs.metrics.scoring
        self.skipped = Counter(
            "fleetloop_health_skipped_total",
            "Messages the health processor could not decode (ingest dead-letters them)",
            registry=registry,
        )
        self.isolated = Gauge(
            "fleetloop_isolated_devices", "Devices the guardrail counts as isolated now",
            registry=registry,
        )  # fmt: skip
        self.devices = Gauge(
            "fleetloop_health_devices", "Devices the health detector tracks", registry=registry
        )
        self.future_dated = Counter(
            "fleetloop_health_future_dated_total",
            "Samples dated past the broker's time plus the allowed skew: judged at the bound",
            registry=registry,
        )
        self.recalled = Counter(
            "fleetloop_health_memory_recalled_devices_total",
            "Devices whose detector record a previous process kept was taken up",
            registry=registry,
        )
        self.remembered = Counter(
            "fleetloop_health_memory_written_total",
            "Device records of the detector written to its compacted topic",
            registry=registry,
        )
        self.state_writes = Counter(
            "fleetloop_isolation_state_writes_total",
            "Records of the isolation state written to its compacted topic",
            registry=registry,
        )
        self.resumes = Counter(
            "fleetloop_isolation_state_resumes_total",
            "Times the isolation state was read back (a start, a rebalance)",
            registry=registry,
        )
        self.resent = Counter(
            "fleetloop_commands_resent_total",
            "Commands a previous owner issued, sent again on resume (executors drop copies)",
            registry=registry,
        )
        self.locked_out = Gauge(
            "fleetloop_guardrail_locked_out",
            "1 while the isolation guardrail is locked out (until a person resets it)",
            registry=registry,
        )
        for status in HealthStatus:
            self.verdicts.labels(status.value)


def add_health(
    app: faust.App,
    wiring: HealthWiring,
    outputs: Outputs,
    registry: CollectorRegistry,
    access: PageAccess | None,
    loops: RoleLoops,
) -> list[TopicSpec]:
    """Register ``health.detect`` (a role loop), ``health.isolate`` (faust), the ladder's
    timer and the guardrail pages on ``app``; returns the topics faust reads for them."""
    m = HealthMetrics(registry, outputs)
    _add_detector(app, loops, wiring, m, access)
    _add_isolation(app, loops, wiring, m, outputs, access)
    return []


def _add_detector(
    app: faust.App,
    loops: RoleLoops,
    wiring: HealthWiring,
    metrics: HealthMetrics,
    access: PageAccess | None,
) -> None:
    detector = isolation.detector(wiring)
    names = [wiring.topic_prefix + s.name for s in DETECTED]
    memory = StateTopic(
        app, wiring.topic_prefix + HEALTH_STATE.name, partitions=HEALTH_STATE.partitions
    )
    recalled: set[int] = set()  # partitions whose devices' records were read back

    async def recall_partitions(partitions: set[int]) -> None:
        recalled.update(partitions)
        try:
            records = await memory.load(DetectorMemory, only=partitions)
            kept = [(r.device_uuid, recall(r.memory)) for r in records.values()]
        except Exception as exc:  # a cache of learning, not a safety state: relearn instead
            log.warning("detector memory of partitions %s not read: %r", sorted(partitions), exc)
            return
        taken = sum(detector.adopt(device_uuid, state) for device_uuid, state in kept)
        metrics.recalled.inc(taken)
        log.info(
            "detector memory recalled for partitions %s: %d devices", sorted(partitions), taken
        )

    async def keep_memory() -> None:
        """Every device's record, to the partition its samples come from (those this worker
        owns); a crash loses at most ``memory_every_s`` of learning."""
        by_partition: dict[int, list[tuple[str, DetectorMemory]]] = {}
        for device_uuid, d in detector.devices.items():
            if isinstance(d.source, tuple) and d.source[1] in recalled:
                record = DetectorMemory(
                    device_uuid=device_uuid, node_id=d.node_id, memory=remember(d)
                )
                by_partition.setdefault(d.source[1], []).append((device_uuid, record))
        try:
            for partition, records in by_partition.items():
                metrics.remembered.inc(await memory.write(records, partition=partition))
        except Exception as exc:  # the next round writes them again
            log.warning("detector memory not kept this round: %r", exc)

    async def moved(revoked: set[Any]) -> None:
        gone = {tp.partition for tp in revoked if tp.topic in names}
        if not gone:
            return
        # the telemetry topics share one partitioning by node: a partition that went, went
        # for every family; its devices are the new owner's to judge, from what we kept
        await keep_memory()
        recalled.difference_update(gone)
        released = detector.release(lambda source: cast(tuple[str, int], source)[1] not in gone)
        metrics.devices.set(len(detector.devices))
        log.info("partitions %s moved away: %d devices released", sorted(gone), released)

    app.timer(interval=wiring.memory_every_s, name="health.keep_memory")(keep_memory)
    verdicts = app.topic(wiring.topic_prefix + VERDICTS.name, value_type=bytes, key_type=bytes)
    timers = {
        AcceleratorTick: "health_device", AcceleratorTelemetry: "health_device",
        NodeHealth: "health_node", ServingTick: "health_peers", ServingMetrics: "health_peers",
    }  # fmt: skip
    kinds: dict[str, tuple[type[Any], Any]] = {
        name: (spec.value_type, metrics.scoring.labels(timers[spec.value_type]))
        for name, spec in zip(names, DETECTED, strict=True)
    }
    by_status = {s: metrics.verdicts.labels(s.value) for s in HealthStatus}
    counted = [0]  # detector.future_dated already counted in the metric
    asked_at = [-math.inf]  # when the broker was last asked for log end offsets (monotonic)

    async def detect(records: list[Any]) -> None:
        new = {r.partition for r in records} - recalled
        if new:  # before any sample of theirs: what a previous process learned
            await recall_partitions(new)

        async def send(out: list[Verdict]) -> None:
            for v in out:
                await verdicts.send(key=v.device_uuid.encode(), value=encode(v))
                by_status[v.status].inc()

        newest_ms: int | None = None
        handled = 0
        received = time.monotonic()
        for r in records:
            value_type, timer = kinds[r.topic]
            try:
                values = decode_samples(r.value, value_type)
            except DecodeError:
                metrics.skipped.inc()
                continue
            appended = datetime.fromtimestamp(r.timestamp / 1000, UTC)
            started = time.perf_counter()
            source = (r.topic, r.partition)
            out: list[Verdict] = []
            for value in values:
                out += detector.observe(
                    value, appended_at=appended, received_s=received, source=source
                )
            timer.observe((time.perf_counter() - started) / max(1, len(values)))
            newest_ms = r.timestamp if newest_ms is None else max(newest_ms, r.timestamp)
            if out:  # on their way now, not at the end of the batch: a hard fault waits for none
                await send(out)
            handled += 1
            if handled % YIELD_EVERY == 0:  # let the ladder act on what was just sent
                await asyncio.sleep(0)
        if newest_ms is not None:  # time passes on the broker's clock, never an agent's
            newest = datetime.fromtimestamp(newest_ms / 1000, UTC)
            drained: set[tuple[str, int]] = set()
            # a node alone on its partition, quiet: is the partition read to its end? (at most
            # every DRAINED_EVERY_S: a consumer behind on many partitions asks no more for it)
            due = time.monotonic() - asked_at[0] >= DRAINED_EVERY_S
            if due and (asked := detector.unwitnessed(newest)):
                asked_at[0] = time.monotonic()
                tps = [TopicPartition(*cast(tuple[str, int], source)) for source in asked]
                drained = {(tp.topic, tp.partition) for tp in await detect_loop.drained(tps)}
            await send(detector.tick(newest, wall_s=time.monotonic(), drained=drained))
        metrics.future_dated.inc(detector.future_dated - counted[0])
        counted[0] = detector.future_dated
        metrics.devices.set(len(detector.devices))

    detect_loop = loops.add(
        "health.detect", DETECTED, detect,
        batch_within_s=wiring.batch_within_s, on_revoked=moved,
    )  # fmt: skip

    @app.page("/health/devices")
    async def devices_page(web: Any, request: Any) -> Any:
        """The devices this worker's detector watches and judges now, and the telemetry
        partitions it holds: with several health workers, each device is in exactly one."""
        refused = refusal(access, request.headers, guarded=False)
        if refused is not None:
            return web.json({"error": refused[1]}, status=refused[0])
        return web.json({"devices": sorted(detector.devices), "partitions": sorted(recalled)})


class _Held:
    """The isolation state this worker holds while it owns the verdict partition: ``ladder``
    is ``None`` until it is resumed from the state topic (and again once the partition is
    revoked), so nothing decides on state it has not read back."""

    def __init__(self) -> None:
        self.ladder: IsolationLadder | None = None
        self.journal = IsolationJournal()
        self.clock = EventClock()
        self.resend = False  # commands the previous owner issued go out again, once
        self.lock = asyncio.Lock()


def _add_isolation(
    app: faust.App,
    loops: RoleLoops,
    wiring: HealthWiring,
    metrics: HealthMetrics,
    outputs: Outputs,
    access: PageAccess | None,
) -> None:
    verdict_topic = wiring.topic_prefix + VERDICTS.name
    state = StateTopic(
        app, wiring.topic_prefix + ISOLATION_STATE.name, partitions=ISOLATION_STATE.partitions
    )
    held = _Held()

    async def resume_state() -> IsolationLadder:
        records = await state.load(IsolationRecord)
        held.ladder, held.journal = resume(wiring, records.values())
        held.clock, held.resend = EventClock(), True
        guard = held.ladder.guard.state
        log.info(
            "isolation state resumed from %s: %d devices on the ladder, %d isolated, locked "
            "out: %s", state.name, len(held.ladder.devices), len(guard.isolated),
            guard.locked_out,
        )  # fmt: skip
        metrics.resumes.inc()
        return held.ladder

    async def publish(
        ladder: IsolationLadder, steps: list[LadderDecision], touched: set[str], now: datetime
    ) -> None:
        out = [decide(step, now, wiring) for step in steps]
        changes = held.journal.changes(ladder, touched=touched, outputs=out, now=now)
        metrics.state_writes.inc(await state.write(changes))  # on the broker before we act
        if held.resend:
            held.resend = False
            pending = held.journal.pending(now)
            await outputs.resend(pending)
            metrics.resent.inc(len(pending))
        await outputs.publish(out)
        metrics.isolated.set(len(ladder.guard.state.isolated))
        metrics.locked_out.set(1 if ladder.guard.state.locked_out else 0)

    async def isolate_batch(records: list[Any]) -> None:
        ladder = held.ladder or await resume_state()
        steps: list[LadderDecision] = []
        touched: set[str] = set()
        groups: list[Output[Any]] = []
        for r in records:
            try:
                v = decode(r.value, Verdict)
            except DecodeError:
                metrics.skipped.inc()
                continue
            held.clock.observe(v.observed_at, time.monotonic())
            now = held.clock.now(time.monotonic())
            if v.level is not Level.DEVICE:  # a group's: recorded
                if (attributed := attribute(v, now)) is not None:
                    groups.append(attributed)
                if v.level is not Level.NODE:  # a rack's or a cohort's moves no device
                    continue
            # a device's steps on the ladder; a node's drains it as one unit
            steps += ladder.verdict(v, now=now)
            touched.add(v.device_uuid if v.level is Level.DEVICE else v.scope or v.device_uuid)
        if held.clock.started:
            await publish(ladder, steps, touched, held.clock.now(time.monotonic()))
        await outputs.publish(groups)

    async def isolate(records: list[Any]) -> None:
        # a failure here (state not written or not read) ends the process: the role loop
        # never commits past a batch of verdicts it did not decide on
        async with held.lock:
            await isolate_batch(records)

    async def ladder_tick() -> None:
        try:
            async with held.lock:
                if held.ladder is not None and held.clock.started:
                    now = held.clock.now(time.monotonic())
                    await publish(held.ladder, held.ladder.tick(now), set(), now)
        except Exception as exc:
            fail_stop("health.ladder_tick", exc)

    async def revoked(revoked: set[Any]) -> None:
        if any(tp.topic == verdict_topic for tp in revoked):
            async with held.lock:  # another worker may own it next: read it back if it returns
                held.ladder = None

    loops.add(
        "health.isolate", (VERDICTS,), isolate,
        batch_within_s=wiring.batch_within_s, on_revoked=revoked,
    )  # fmt: skip
    app.timer(interval=1.0, name="health.ladder_tick")(ladder_tick)

    @app.page("/guardrail")
    class GuardrailView(faust.web.View):
        """GET: the guardrail's state; POST /guardrail/reset: a person lifts a lockout."""

        async def get(self, request: Any) -> Any:
            refused = refusal(access, request.headers, guarded=False) or _not_owner(held)
            if refused is not None:
                return self.json({"error": refused[1]}, status=refused[0])
            assert held.ladder is not None
            state = held.ladder.guard.state
            return self.json(
                {
                    "locked_out": state.locked_out,
                    "isolated": sorted(state.isolated),
                    "lost": sorted(state.lost),  # of the isolated: out with a lost node
                    "recent_actions": len(state.actions),
                }
            )

    @app.page("/guardrail/reset")
    class GuardrailReset(faust.web.View):
        async def post(self, request: Any) -> Any:
            refused = refusal(access, request.headers, guarded=True) or _not_owner(held)
            if refused is not None:
                return self.json({"error": refused[1]}, status=refused[0])
            async with held.lock:
                ladder = held.ladder
                if ladder is None:
                    return self.json({"error": "isolation state moved; ask again"}, status=503)
                was = ladder.guard.state.locked_out
                ladder.guard.reset()
                now = held.clock.now(time.monotonic()) if held.clock.started else datetime.now(UTC)
                changes = held.journal.changes(ladder, touched=set(), outputs=[], now=now)
                metrics.state_writes.inc(await state.write(changes))  # a restart keeps it lifted
            metrics.locked_out.set(0)
            log.warning("guardrail reset by a person (was locked out: %s)", was)
            return self.json({"locked_out": False, "was_locked_out": was})


def _not_owner(held: _Held) -> tuple[int, str] | None:
    if held.ladder is None:
        return (
            503,
            "this worker holds no isolation state now (not the verdicts' owner, or resuming)",
        )
    return None
