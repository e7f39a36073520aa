"""The control role: serving, PDU and accelerator telemetry into the control planner
(:mod:`planning.pools`), its throttle and route commands and decisions out.

Telemetry is keyed by node (PDU readings by PDU); control plans per region, as pools and
racks do not cross regions. So the role is two role loops (:mod:`streams.role_loop`) and
runs in as many processes as there are regions:

- ``control.route`` reads the telemetry, split over the processes like any telemetry
  reader, and forwards each record as it is onto the region-keyed twin of its topic
  (``control.by-region.<topic>``, :func:`schemas.topics.regional`): a repartition. A node's
  (or PDU's) region is read from its first record and remembered by its key;
- ``control.plan`` reads those twins co-partitioned (one key, one partition count, Kafka's
  range assignment), so one process plans each region and hears all of it, in one
  :class:`~planning.pools.RegionalControl`. A region that moves away takes its planner
  with it; the next owner adopts what the last owner's levers hold (caps, low clocks,
  batch moves, routing weights, batch caps and optional-work budgets, with the memory of
  the controllers that set them:
  :class:`~schemas.state.ControlMemory` on ``state.control.v1``), so it gives them back
  when it is time and goes on with the budgets and caps as they were.

The fleet's optional-work limit (``global_budget_devices``, when finite) spans regions:
each process sends what its pools hold as :class:`~schemas.derived.BudgetClaim` records
(``control.budget-claims.v1``, compacted by pool) and reads every other process's, so a
pool's grant counts the others' latest claims, one period late at most.

Delivery is at least once at each hop: a forwarder that restarts or hands a partition
over sends some records again, and the planner counts such a copy as one more report of
its period (what it sums are means over reports and request-weighted percentiles, which a
copy barely moves).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import uuid
from typing import Any, cast

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.partitioner import murmur2
from prometheus_client import CollectorRegistry, Counter

from controllers.capacity import Claim
from planning.pools import RegionalControl
from planning.registry import CAPACITY, POWER, POWER_ROUTING, TPOT_GUARD
from planning.throttle import ControlWiring
from schemas.codec import DecodeError, decode, decode_tick, encode
from schemas.derived import BudgetClaim
from schemas.state import ControlMemory
from schemas.topics import (
    BUDGET_CLAIMS,
    CONTROL_INPUTS,
    CONTROL_STATE,
    REGIONAL_PARTITIONS,
    TopicSpec,
    regional,
)
from streams.outputs import Outputs
from streams.page_access import PageAccess, refusal
from streams.role_loop import RoleLoops, decode_own
from streams.state_topic import StateTopic, bootstrap_of

log = logging.getLogger(__name__)

LEVERS = {POWER.name, POWER_ROUTING.name, TPOT_GUARD.name, CAPACITY.name}
"""The controllers whose decisions change what a region's levers hold (caps, clocks, batch
moves, routing weights, batch caps, optional-work budgets): a batch with one of theirs
writes the region's record."""

READ = CONTROL_INPUTS
"""What ``control.route`` reads: node ticks (v2), PDU readings, and v1 from older agents."""


def region_of(raw: bytes, spec: TopicSpec) -> str | None:
    """The region a telemetry record of ``spec`` comes from (None: an envelope with no
    valid sample). Raises :class:`DecodeError` on a record ingest dead-letters."""
    if spec.envelope:
        tick = decode_tick(raw, spec.value_type).tick
        return None if tick is None else tick.region
    region: str = decode(raw, spec.value_type).region
    return region


def add_control(
    app: faust.App,
    wiring: ControlWiring,
    outputs: Outputs,
    registry: CollectorRegistry,
    access: PageAccess | None,
    loops: RoleLoops,
) -> list[TopicSpec]:
    """Register ``control.route`` and ``control.plan`` (role loops), the budget claims'
    reader where the fleet has a finite limit, and the ``/control/regions`` page; faust
    reads nothing for them."""
    prefix = wiring.topic_prefix
    forwarded = Counter(
        "fleetloop_control_forwarded_total",
        "Telemetry records control.route forwarded to their region's partition",
        registry=registry,
    )
    claims_sent = Counter(
        "fleetloop_control_budget_claims_sent_total",
        "BudgetClaim records sent: a pool's new share of the fleet's optional-work limit",
        registry=registry,
    )
    levers_kept = Counter(
        "fleetloop_control_levers_written_total",
        "Records of what a region's levers hold written to state.control.v1",
        registry=registry,
    )
    levers_adopted = Counter(
        "fleetloop_control_levers_adopted_total",
        "Regions taken over with what their previous owner's levers held",
        registry=registry,
    )
    claims_unread = Counter(
        "fleetloop_control_budget_claims_unreadable_total",
        "BudgetClaim records a control process could not decode (not counted as held)",
        registry=registry,
    )

    # -- stage 1: telemetry (by node or PDU) -> the same records by region --------------
    sources = {prefix + s.name: s for s in READ}
    twins = {prefix + s.name: prefix + regional(s).name for s in READ}
    regions: dict[tuple[str, bytes], tuple[bytes, int]] = {}  # (topic, key) -> region, part

    def region_key(name: str) -> tuple[bytes, int]:
        """A region as its records' key, and its partition of the twins (the producer's
        default: murmur2 of the key)."""
        key = name.encode()
        return key, (murmur2(key) & 0x7FFFFFFF) % REGIONAL_PARTITIONS

    async def route(records: list[Any]) -> None:
        # a batch per twin partition, appended to directly: a record forwarded costs an
        # append to a batch, not a send of its own
        producer = cast(Any, app.producer)._ensure_producer()  # flushed with the worker's
        batches: dict[tuple[str, int], Any] = {}
        sent = 0
        for r in records:
            where = (r.topic, r.key)
            found = regions.get(where) if r.key is not None else None
            if found is None:
                try:
                    name = region_of(r.value, sources[r.topic])
                except DecodeError:
                    continue  # ingest dead-letters it
                if name is None:
                    continue
                found = region_key(name)
                if r.key is not None:
                    regions[where] = found
            region, partition = found
            slot = (twins[r.topic], partition)
            batch = batches.get(slot)
            if batch is None:
                batch = batches[slot] = producer.create_batch()
            if batch.append(key=region, value=r.value, timestamp=None) is None:  # full
                await producer.send_batch(batch, slot[0], partition=partition)
                batch = batches[slot] = producer.create_batch()
                batch.append(key=region, value=r.value, timestamp=None)
            sent += 1
        for (topic, partition), batch in batches.items():
            await producer.send_batch(batch, topic, partition=partition)
        forwarded.inc(sent)

    loops.add("control.route", READ, route, batch_within_s=wiring.batch_within_s)

    # -- stage 2: the region-keyed twins (co-partitioned) -> decisions and commands ------
    control = RegionalControl(wiring)
    planned = {prefix + regional(s).name: s for s in READ}
    partition_of: dict[bytes, int] = {}  # region -> its partition of the twins
    owner = f"{loops.app_id}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    sharing = math.isfinite(wiring.global_budget_devices)
    claims_topic = app.topic(prefix + BUDGET_CLAIMS.name, value_type=bytes, key_type=bytes)
    told: dict[str, Claim] = {}  # pool -> the claim last sent

    levers = StateTopic(app, prefix + CONTROL_STATE.name, partitions=CONTROL_STATE.partitions)
    written: dict[str, dict[str, Any]] = {}  # region -> what its levers held, as last written

    async def plan(records: list[Any]) -> None:
        acted: set[bytes] = set()  # regions that decided something in this batch
        for r in records:
            spec = planned[r.topic]
            partition_of[r.key] = r.partition
            try:
                if spec.envelope:  # its valid samples (the bad ones are ingest's to letter)
                    tick = decode_tick(r.value, spec.value_type).tick
                    out = [] if tick is None else control.tick(tick)
                else:
                    out = control.feed(decode(r.value, spec.value_type))
            except DecodeError:
                continue
            if out:  # each message's as it is handled
                # a region's record is written once it decides (the next owner finds what
                # it holds, nothing included), and again whenever its levers may move
                if r.key.decode() not in written or any(
                    o.decision.controller in LEVERS for o in out
                ):
                    acted.add(r.key)
                await outputs.publish(out)
        if acted:
            await keep({key.decode() for key in acted})
        if sharing:
            await claim()

    async def keep(regions: set[str]) -> None:
        """Write what ``regions``' levers hold where it changed: on the broker with the
        commands that set it, before their offsets are committed."""
        for region in sorted(regions):
            planner = control.planners.get(region)
            held = None if planner is None else planner.held()
            if held is None or held == written.get(region):
                continue
            record = ControlMemory(region=region, held=held)
            partition = partition_of[region.encode()]
            levers_kept.inc(await levers.write([(region, record)], partition=partition))
            written[region] = held

    async def claim() -> None:
        """Send each of our pools' claims that changed since it was last sent."""
        for pool, held in list(control.budget.held.items()):
            if told.get(pool) == held:
                continue
            told[pool] = held
            record = BudgetClaim(
                pool=pool, region=control.pool_regions.get(pool, "unknown"),
                units=held.units, capacity_units=held.capacity_units, claimed_at=held.at,
                owner=owner,
            )  # fmt: skip
            await claims_topic.send(key=BUDGET_CLAIMS.key_for(record), value=encode(record))
            claims_sent.inc()

    async def handed_over(revoked: set[TopicPartition]) -> None:
        gone = {tp.partition for tp in revoked if tp.topic in planned}
        moved = [key for key, p in partition_of.items() if p in gone]
        try:  # what the next owner must give back
            await keep({key.decode() for key in moved})
        except Exception as exc:  # the next owner would take our caps for defaults: stop
            loops.on_fatal("control.plan", exc)
            raise
        control.release(key.decode() for key in moved)
        for key in moved:
            del partition_of[key]
            written.pop(key.decode(), None)
        for pool in [p for p in told if p not in control.budget.held]:
            del told[pool]

    async def taken_over(consumer: AIOKafkaConsumer, assigned: set[TopicPartition]) -> None:
        """Adopt what the previous owners' levers held in the arriving regions."""
        del consumer
        for partition in sorted({tp.partition for tp in assigned if tp.topic in planned}):
            try:
                held = await levers.load(ControlMemory, only={partition})
            except Exception as exc:  # planning on without it would never lift its caps
                loops.on_fatal("control.plan", exc)
                raise
            for region, record in held.items():
                try:
                    control.planner(region).adopt(record.held)
                except ValueError as exc:
                    log.error("levers held in %s not adopted: %s", region, exc)
                    continue
                levers_adopted.inc()
                partition_of[region.encode()] = partition
                written[region] = record.held
                devices, weights = record.held["power"]["devices"], record.held["weights"]
                log.info("region %s taken over: %d devices held down, %d weights adopted",
                         region, len(devices), len(weights))  # fmt: skip

    loops.add(
        "control.plan", tuple(regional(s) for s in READ), plan,
        batch_within_s=wiring.batch_within_s, on_revoked=handed_over, on_assigned=taken_over,
        co_partitioned=True,
    )  # fmt: skip

    if sharing:

        async def hear_claims() -> None:
            """Every other control process's claims, from the topic's start (compacted: each
            pool's latest) and on as they come."""
            consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_of(app))
            await consumer.start()
            try:
                tp = TopicPartition(prefix + BUDGET_CLAIMS.name, 0)
                consumer.assign([tp])
                await consumer.seek_to_beginning(tp)
                while True:
                    for records in (await consumer.getmany(tp, timeout_ms=1000)).values():
                        for raw in records:
                            _heard(raw)
            finally:
                await consumer.stop()

        def _heard(raw: Any) -> None:
            record = decode_own(raw, BudgetClaim, claims_unread.inc)
            if record is not None and record.owner != owner:
                claim = Claim(record.units, record.capacity_units, record.claimed_at)
                control.budget.claim(record.pool, claim)

        app.task(hear_claims)

    @app.page("/control/regions")
    async def regions_page(web: Any, request: Any) -> Any:
        """The regions this worker plans, with their partition and pools; what each of our
        pools holds of the fleet's optional-work limit and what the other processes' pools
        claim; pools seen in two regions (planned apart: a naming error to fix)."""
        refused = refusal(access, request.headers, guarded=False)
        if refused is not None:
            return web.json({"error": refused[1]}, status=refused[0])
        out = []
        for region, planner in sorted(control.planners.items()):
            out.append({
                "region": region, "partition": partition_of.get(region.encode()),
                "pools": sorted(planner.pools), "racks": len(planner.power.racks),
            })  # fmt: skip
        budget = control.budget

        def claims(held: dict[str, Claim]) -> dict[str, Any]:
            return {
                p: {"units": c.units, "capacity_units": c.capacity_units, "at": c.at.isoformat()}
                for p, c in sorted(held.items())
            }

        return web.json({
            "regions": out, "owner": owner, "crossing": sorted(control.crossing),
            "budget": {"limit_units": budget.limit_units if sharing else None,
                       "held": claims(budget.held), "claimed_elsewhere": claims(budget.remote)},
        })  # fmt: skip

    return []
