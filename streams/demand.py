"""The demand role: serving telemetry and demand into the demand planner
(:mod:`planning.demand`); forecasts, warm commands and decisions out.

Two role loops (:mod:`streams.role_loop`), so the role runs in as many processes as
the partitions allow:

- ``demand.serving`` reads the serving telemetry (node-tick envelopes and v1), keyed
  by node and split over the processes like any telemetry, and sends what each of its
  partitions saw each (model, region, pool) serve in each demand step as
  :class:`~schemas.derived.ServingStep` records on ``demand.serving-steps.v1``, keyed by
  model and region: a repartition;
- ``demand.plan`` reads the demand and those records, co-partitioned (one key, one
  partition count, Kafka's range assignment), so each (model, region) is planned by
  one process that hears every serving partition's part of it.

Records are sent as the batches that made them are handled and are on the broker before
those batches' offsets are committed (the role loops' rule); a replay sends the same or
smaller counts, and the planner keeps the largest per source and step.

What the planner has learned of a key (its forecaster, its warming policy, the step open)
is written to ``state.demand.v1`` (:class:`~schemas.state.DemandMemory`, compacted,
in the key's demand partition) every ``memory_every_s`` and when its partition leaves,
stamped with the partition's next offset; the process that takes the partition reads it
back before its first record. Handed over on a rebalance, the stamp is the committed
offset and planning goes on exactly; after a crash the new owner replays the demand from
the last stamp, acting on nothing its predecessor had acted on.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client import CollectorRegistry, Counter

from controllers.clock import EventClock
from planning.demand import DemandPlanner, DemandWiring, ServingSteps, decide_warm, served_in
from schemas.codec import DecodeError, decode, decode_tick, encode
from schemas.derived import ServingStep
from schemas.envelopes import ServingTick
from schemas.events import Demand, ServingMetrics
from schemas.state import DemandMemory
from schemas.topics import (
    DEMAND,
    DEMAND_STATE,
    FORECASTS,
    SERVING,
    SERVING_STEPS,
    SERVING_TICKS,
    TopicSpec,
)
from streams.outputs import Outputs
from streams.page_access import PageAccess, refusal
from streams.role_loop import RoleLoops, decode_own
from streams.state_topic import StateTopic

log = logging.getLogger(__name__)

Key = tuple[str, str]
"""(model, region): what demand is planned per."""


def add_demand(
    app: faust.App,
    wiring: DemandWiring,
    outputs: Outputs,
    registry: CollectorRegistry,
    access: PageAccess | None,
    loops: RoleLoops,
) -> list[TopicSpec]:
    """Register ``demand.serving`` and ``demand.plan`` (role loops) and the
    ``/demand/keys`` page; faust reads nothing for them."""
    prefix = wiring.topic_prefix
    steps_topic = app.topic(prefix + SERVING_STEPS.name, value_type=bytes, key_type=bytes)
    forecasts = app.topic(prefix + FORECASTS.name, value_type=bytes, key_type=bytes)
    timer = outputs.metrics.scoring.labels("demand_forecast")
    sent = Counter(
        "fleetloop_demand_serving_steps_sent_total",
        "ServingStep records sent by demand.serving (the repartition of serving telemetry)",
        registry=registry,
    )
    late = Counter(
        "fleetloop_demand_serving_samples_late_total",
        "Serving samples older than their partition's demand step in progress: not counted",
        registry=registry,
    )
    kept = Counter(
        "fleetloop_demand_memory_written_total",
        "Per-key demand planner memories written to state.demand.v1",
        registry=registry,
    )
    recalled = Counter(
        "fleetloop_demand_memory_recalled_keys_total",
        "(model, region) keys whose planning was taken up from state.demand.v1",
        registry=registry,
    )
    short = Counter(
        "fleetloop_demand_steps_closed_short_total",
        "Demand steps closed after --demand.close-wait-s without the count of a serving "
        "partition that served the key in them or the step before (behind or gone)",
        registry=registry,
    )
    unread = Counter(
        "fleetloop_demand_serving_steps_unreadable_total",
        "ServingStep records demand.plan could not use (undecodable, or of another step length)",
        registry=registry,
    )

    # -- stage 1: serving telemetry (by node) -> serving steps (by model and region) ------
    steps = ServingSteps(wiring.step_s)  # replicas as they join, requests every 1/12 step
    serving = {prefix + s.name: s for s in (SERVING_TICKS, SERVING)}
    counted_late = [0]

    async def send(records: list[ServingStep]) -> None:
        for record in records:
            await steps_topic.send(key=SERVING_STEPS.key_for(record), value=encode(record))
        sent.inc(len(records))
        late.inc(steps.late - counted_late[0])
        counted_late[0] = steps.late

    async def summarise(records: list[Any]) -> None:
        for r in records:
            spec = serving[r.topic]
            source = f"{spec.name}/{r.partition}"
            try:
                if spec.envelope:  # its valid samples (the bad ones are ingest's to letter)
                    tick = decode_tick(r.value, ServingTick).tick
                    if tick is not None:
                        steps.tick(tick, source)
                else:
                    steps.add(decode(r.value, ServingMetrics), source)
            except DecodeError:
                continue  # ingest dead-letters it
        await send(steps.flush())

    async def moved(revoked: set[TopicPartition]) -> None:
        # what the revoked partitions counted goes out before they go; their next owner
        # counts on from the committed offset, and the planner keeps the larger count
        await send(steps.flush(force=True))
        steps.release(
            {f"{serving[tp.topic].name}/{tp.partition}" for tp in revoked if tp.topic in serving}
        )

    loops.add(
        "demand.serving", (SERVING_TICKS, SERVING), summarise,
        batch_within_s=0.5, on_revoked=moved,
    )  # fmt: skip

    # -- stage 2: demand and serving steps (co-partitioned) -> forecasts and warms -------
    planner = DemandPlanner(wiring)
    clock = EventClock()
    demand_topic, steps_name = prefix + DEMAND.name, prefix + SERVING_STEPS.name
    partition_of: dict[Key, int] = {}  # (model, region) -> its partition
    memory = StateTopic(app, prefix + DEMAND_STATE.name, partitions=DEMAND_STATE.partitions)
    position: dict[int, int] = {}  # demand partition -> the next offset its planning needs
    skip: dict[int, int] = {}  # demand partition -> its records before this are remembered
    quiet: dict[int, int] = {}  # demand partition -> records before this were acted on
    dirty: set[Key] = set()  # keys whose planning moved since their memory was written
    counted_short = [0]

    async def plan(records: list[Any]) -> None:
        # a batch's serving steps first: a demand event that closes a step sees them
        for r in records:
            if r.topic == steps_name:
                record = decode_own(r, ServingStep, unread.inc)
                if record is None:
                    continue
                key = (record.model, record.region)
                partition_of[key] = r.partition
                dirty.add(key)
                if not planner.serving_step(record):
                    unread.inc()
                    log.warning("ServingStep of %g s steps at %s/%d@%d (this worker's: %g s)",
                                record.step_s, r.topic, r.partition, r.offset,
                                wiring.step_s)  # fmt: skip
        for r in records:
            if r.topic != demand_topic or r.offset < skip.get(r.partition, -1):
                continue
            position[r.partition] = r.offset + 1
            try:
                demand = decode(r.value, Demand)
            except DecodeError:
                continue  # ingest dead-letters it
            key = (demand.model, demand.region)
            partition_of[key] = r.partition
            dirty.add(key)
            clock.observe(demand.observed_at, time.monotonic())
            started = time.perf_counter()
            made, warm_steps = planner.demand(demand, now=clock.now(time.monotonic()))
            short.inc(planner.closed_short - counted_short[0])
            counted_short[0] = planner.closed_short
            if made:
                timer.observe(time.perf_counter() - started)
            if r.offset < quiet.get(r.partition, -1):
                continue  # replayed after a crash: its previous owner sent these
            for f in made:
                await forecasts.send(key=FORECASTS.key_for(f), value=encode(f))
            await outputs.publish(decide_warm(step, wiring) for step in warm_steps)

    async def keep(partitions: set[int] | None = None) -> None:
        """Write the memory of every key whose planning moved, in ``partitions`` (all when
        None), each stamped with its partition's next offset: a partition's newest stamp
        is where its planning resumes, as every key whose planning moved before it was
        written with it."""
        records: dict[int, list[tuple[str, DemandMemory]]] = {}
        for key in sorted(dirty):
            partition = partition_of.get(key)
            if partition is None or key not in planner.keys or partition not in position:
                continue
            if partitions is not None and partition not in partitions:
                continue
            model, region = key
            record = DemandMemory(
                model=model, region=region, offset=position[partition],
                memory=planner.remember(model, region),
            )  # fmt: skip
            records.setdefault(partition, []).append((f"{model}|{region}", record))
        for partition, batch in records.items():
            kept.inc(await memory.write(batch, partition=partition))
            dirty.difference_update((r.model, r.region) for _, r in batch)

    async def keep_memory() -> None:
        """Every ``memory_every_s``: a crash costs a replay from the last round, not what
        the planner learned."""
        try:
            async with plan_loop.paused():
                await keep()
        except Exception as exc:  # the next round writes them again
            log.warning("demand memory not kept this round: %r", exc)

    async def handed_over(revoked: set[TopicPartition]) -> None:
        # what the keys of a revoked partition have learned goes to the state topic first
        # (their offsets are committed: the next owner goes on from exactly there)
        gone = {tp.partition for tp in revoked if tp.topic == demand_topic}
        try:
            await keep(gone)
        except Exception as exc:  # a cache of learning: the next owner learns afresh
            log.warning("demand memory of partitions %s not kept: %r", sorted(gone), exc)
        keys = {k for k, p in partition_of.items() if p in gone}
        planner.release(keys)
        for k in keys:
            del partition_of[k]
            dirty.discard(k)
        for p in gone:
            for held in (position, skip, quiet):
                held.pop(p, None)

    async def taken_over(consumer: AIOKafkaConsumer, assigned: set[TopicPartition]) -> None:
        """Read back what the previous owners kept of the arriving demand partitions; where
        it is older than their committed offset (a crash since), replay from it, acting on
        nothing already acted on; where newer, skip what it holds."""
        parts = {tp.partition for tp in assigned if tp.topic == demand_topic}
        taken = 0
        for partition in sorted(parts):
            tp = TopicPartition(demand_topic, partition)
            committed = await consumer.committed(tp)
            try:
                held = await memory.load(DemandMemory, only={partition})
            except Exception as exc:  # a cache of learning, not a safety state: learn afresh
                log.warning("demand memory of partition %d not read: %r", partition, exc)
                held = {}
            stamp = None
            for record in held.values():
                key = (record.model, record.region)
                try:
                    planner.recall(record.model, record.region, record.memory)
                except ValueError as exc:
                    log.warning("demand memory of %s not used (learning afresh): %s", key, exc)
                    continue
                taken += 1
                partition_of[key] = partition
                stamp = record.offset if stamp is None else max(stamp, record.offset)
            if stamp is None:
                if committed is not None:
                    position[partition] = committed
            elif committed is None or stamp >= committed:
                skip[partition] = position[partition] = stamp
            else:
                consumer.seek(tp, stamp)
                position[partition], quiet[partition] = stamp, committed
        recalled.inc(taken)
        log.info("demand memory read back for partitions %s: %d keys", sorted(parts), taken)

    plan_loop = loops.add(
        "demand.plan", (DEMAND, SERVING_STEPS), plan, batch_within_s=0.5,
        on_revoked=handed_over, on_assigned=taken_over, co_partitioned=True,
    )  # fmt: skip
    app.timer(interval=wiring.memory_every_s, name="demand.keep_memory")(keep_memory)

    @app.page("/demand/keys")
    async def keys_page(web: Any, request: Any) -> Any:
        """The (model, region) keys this worker plans, with their demand partition, the step
        open, the last step closed and the replicas each pool served in it (what the warming
        policy was told), and, per step held, the replicas each pool served so far, summed
        over the serving partitions heard from (and how many those were); while a later
        step's demand has come, the serving partitions the open step waits for."""
        refused = refusal(access, request.headers, guarded=False)
        if refused is not None:
            return web.json({"error": refused[1]}, status=refused[0])
        out = []
        for (model, region), key in sorted(planner.keys.items()):
            held = {}
            for step, parts in sorted(key.served.items()):
                pools, _ = served_in(parts)
                held[str(step)] = {
                    "replicas": dict(pools), "sources": len({source for source, _ in parts}),
                }  # fmt: skip
            closed, ready = key.closed
            out.append({
                "model": model, "region": region, "partition": partition_of.get((model, region)),
                "step": key.step, "served": held, "closed_step": closed, "ready": ready,
                "learned": key.forecaster.n,
                "waiting_for": sorted(planner.behind(model, region)) if key.ahead else [],
            })  # fmt: skip
        return web.json({"keys": out, "step_s": wiring.step_s})

    return []
