"""The closed loop on the real broker: a command reaches its executor, the simulated fleet
acts on it, its telemetry shows it, and the command and its result are in ClickHouse.

`fleetloop sim` (the simulated fleet with its node, router and warmer executors) and
`fleetloop worker` run as their own processes, exactly as deployed.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import TypeVar

from agents.publisher import KafkaPublisher
from schemas.base import Contract
from schemas.codec import encode
from schemas.commands import RouteAction, RouteCommand, Target, WarmAction, WarmCommand
from schemas.topics import ROUTE_COMMANDS, WARM_COMMANDS, TopicSpec
from tests.factories import signed_command
from tests.integration.sim_proc import SimProcess, at_least, until
from tests.integration.worker_proc import WorkerProcess

DEVICE = "node-00000-gpu0"
T = TypeVar("T")


async def _send(bootstrap: str, prefix: str, messages: list[tuple[TopicSpec, Contract]]) -> None:
    async with KafkaPublisher(bootstrap, topic_prefix=prefix) as publisher:
        for spec, value in messages:  # raw, so a replay is the very same bytes
            await publisher.publish_raw(spec.name, spec.key_for(value), encode(value))
        await publisher.flush()


def test_drain_reaches_the_device_and_forged_expired_replayed_commands_are_answered(
    closed_loop: tuple[SimProcess, WorkerProcess], kafka_bootstrap: str, topic_prefix: str
) -> None:
    sim, worker = closed_loop
    util_sql = (
        "SELECT count(), avg(gpu_util_ratio) FROM fleetloop.accelerator_telemetry "
        f"WHERE device_uuid = '{DEVICE}' AND src_topic LIKE '{topic_prefix}%'"
    )
    until(lambda: int(worker.sql(util_sql)[0][0]) >= 5, what="telemetry from the device", proc=sim)
    assert float(worker.sql(util_sql)[0][1]) > 0.1  # it is serving

    now = sim.now()
    drain = signed_command(
        RouteCommand,
        issued_at=now,
        ttl_s=300,
        target=Target(device_uuid=DEVICE),
        action=RouteAction.DRAIN,
        reason="e2e_drain",
    )
    forged = signed_command(
        RouteCommand,
        issued_at=now,
        ttl_s=300,
        target=Target(device_uuid="node-00001-gpu0"),
        action=RouteAction.DRAIN,
        key=b"an-attacker-who-knows-the-key-id",
    )
    expired = signed_command(
        RouteCommand,
        issued_at=now - timedelta(minutes=10),
        ttl_s=60,
        target=Target(device_uuid="node-00002-gpu0"),
        action=RouteAction.DRAIN,
    )
    warm = signed_command(
        WarmCommand,
        issued_at=now,
        ttl_s=300,
        target=Target(pool="us-east-h100"),
        action=WarmAction.WARM,
        model="gemma-27b",
    )
    asyncio.run(
        _send(
            kafka_bootstrap,
            topic_prefix,
            [
                (ROUTE_COMMANDS, drain),
                (ROUTE_COMMANDS, forged),
                (ROUTE_COMMANDS, expired),
                (ROUTE_COMMANDS, drain),
                (WARM_COMMANDS, warm),
            ],
        )
    )

    results_sql = (
        "SELECT toString(command_id), executor, status, detail FROM fleetloop.command_results "
        f"WHERE src_topic LIKE '{topic_prefix}%' ORDER BY src_offset"
    )
    rows = until(
        lambda: at_least(worker.sql(results_sql), 5),
        what="five command results in ClickHouse",
        proc=sim,
    )
    by_command: dict[str, list[str]] = {}
    for command_id, _executor, status, _detail in rows:
        by_command.setdefault(command_id, []).append(status)
    assert by_command[str(drain.command_id)] == ["applied", "duplicate"]  # replay applied once
    assert by_command[str(forged.command_id)] == ["bad_signature"]
    assert by_command[str(expired.command_id)] == ["expired"]
    assert by_command[str(warm.command_id)] == ["applied"]
    executors = {r[0]: r[1] for r in rows}
    assert executors[str(drain.command_id)] == "node-executor"
    assert executors[str(warm.command_id)] == "warmer"

    # The command itself is in the audit table, once per message on the topic.
    audit = worker.sql(
        "SELECT count(), any(action), any(reason) FROM fleetloop.commands "
        f"WHERE command_id = '{drain.command_id}' AND src_topic LIKE '{topic_prefix}%'"
    )
    assert audit == [[2, "drain", "e2e_drain"]]

    # The router stopped sending it work, and its telemetry shows it idle.
    route = next(e for e in sim.get("/routes")["routes"]["llama-70b"] if e["device_uuid"] == DEVICE)
    assert route["weight"] == 0 and route["admin_state"] == "draining"
    applied_at = worker.sql(
        "SELECT toString(completed_at) FROM fleetloop.command_results "
        f"WHERE command_id = '{drain.command_id}' AND status = 'applied'"
    )[0][0]
    after_sql = (
        "SELECT count(), max(gpu_util_ratio) FROM fleetloop.accelerator_telemetry "
        f"WHERE device_uuid = '{DEVICE}' AND src_topic LIKE '{topic_prefix}%' "
        f"AND observed_at > toDateTime64('{applied_at}', 3, 'UTC') + INTERVAL 2 SECOND"
    )
    count, peak = until(
        lambda: at_least(worker.sql(after_sql)[0], 3, count=lambda row: int(row[0])),
        what="telemetry after the drain",
        proc=sim,
    )
    assert float(peak) == 0.0, f"{count} samples after the drain, peak utilisation {peak}"
    served_sql = (
        "SELECT sum(requests) FROM fleetloop.serving_metrics "
        f"WHERE replica_id LIKE '{DEVICE}/%' AND src_topic LIKE '{topic_prefix}%' "
        f"AND observed_at > toDateTime64('{applied_at}', 3, 'UTC') + INTERVAL 2 SECOND"
    )
    assert int(worker.sql(served_sql)[0][0]) == 0
    others = (
        "SELECT max(gpu_util_ratio) FROM fleetloop.accelerator_telemetry "
        f"WHERE device_uuid = 'node-00000-gpu3' AND src_topic LIKE '{topic_prefix}%' "
        f"AND observed_at > toDateTime64('{applied_at}', 3, 'UTC')"
    )
    assert float(worker.sql(others)[0][0]) > 0.1  # the rest of the fleet keeps serving

    # SIGTERM stops the simulator at a tick boundary, with everything flushed and committed.
    assert sim.stop() == 0, sim.log_tail()
    assert "command results" in sim.log_tail()
