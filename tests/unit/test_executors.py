"""Executors dispatched on the simulated fleet: ownership, results for every command, metrics."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agents.executors.executors import Scope, scope_of
from agents.loop import LoopStats
from agents.sim.control import SimControl
from agents.sim.scenario import Scenario
from agents.sim.simulation import Simulation
from fleetloop.loop import keep_seen, load_seen
from fleetloop.sim import build_dispatcher
from schemas.codec import encode
from schemas.commands import (
    ClockMode,
    Command,
    ResultStatus,
    RouteAction,
    RouteCommand,
    Target,
    ThrottleAction,
    ThrottleCommand,
    WarmAction,
    WarmCommand,
)
from schemas.topics import ROUTE_COMMANDS, WARM_COMMANDS
from tests.factories import COMMAND_KEYS, START, signed_command

DEVICE = Target(device_uuid="node-00000-gpu0")


def _command(cls: type[Command], **fields: object) -> Command:
    return signed_command(cls, issued_at=START, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("command", "scope"),
    [
        (_command(RouteCommand, target=DEVICE, action=RouteAction.DRAIN), Scope.NODE),
        (
            _command(RouteCommand, target=Target(node_id="n"), action=RouteAction.QUARANTINE),
            Scope.NODE,
        ),
        (
            _command(
                RouteCommand, target=Target(pool="p", device_uuid="d"), action=RouteAction.DRAIN
            ),
            Scope.ROUTER,
        ),
        (
            _command(
                RouteCommand,
                target=Target(pool="p"),
                action=RouteAction.DEWEIGHT,
                weight_ratio=0.5,
                model="m",
            ),
            Scope.ROUTER,
        ),
        (
            _command(
                ThrottleCommand,
                target=DEVICE,
                action=ThrottleAction.POWER_CAP,
                power_limit_watts=300.0,
            ),
            Scope.NODE,
        ),
        (
            _command(
                ThrottleCommand,
                target=DEVICE,
                action=ThrottleAction.CLOCK_MODE,
                clock_mode=ClockMode.LOW,
            ),
            Scope.NODE,
        ),
        (
            _command(
                ThrottleCommand,
                target=Target(pool="p"),
                action=ThrottleAction.ADMISSION,
                admission_ratio=0.5,
            ),
            Scope.ROUTER,
        ),
        (
            _command(WarmCommand, target=Target(pool="p"), action=WarmAction.WARM, model="m"),
            Scope.WARMER,
        ),
    ],
)
def test_every_command_has_exactly_one_owner(command: Command, scope: Scope) -> None:
    assert scope_of(command) is scope


def _dispatcher(sim: Simulation | None = None, registry: CollectorRegistry | None = None):  # type: ignore[no-untyped-def]
    sim = sim or Simulation(Scenario(), start=START)
    sim.tick(0)
    return sim, build_dispatcher(
        SimControl(sim.fleet), COMMAND_KEYS, registry or CollectorRegistry()
    )


def test_applied_duplicate_forged_expired_each_with_a_result() -> None:
    registry = CollectorRegistry()
    sim, dispatcher = _dispatcher(registry=registry)
    now = sim.fleet.now
    drain = _command(RouteCommand, target=DEVICE, action=RouteAction.DRAIN)
    forged = signed_command(
        RouteCommand,
        issued_at=START,
        target=DEVICE,
        action=RouteAction.DRAIN,
        key=b"not-the-real-key-at-all",
    )
    expired = signed_command(
        RouteCommand,
        issued_at=START - timedelta(minutes=5),
        ttl_s=30,
        target=DEVICE,
        action=RouteAction.DRAIN,
    )
    statuses = []
    for c in (drain, drain, forged, expired):
        result = dispatcher.handle(c, now=now, received_at=now)
        assert result is not None and result.command_id == c.command_id
        assert result.executor == "node-executor"
        statuses.append(result.status)
    assert statuses == [
        ResultStatus.APPLIED,
        ResultStatus.DUPLICATE,
        ResultStatus.BAD_SIGNATURE,
        ResultStatus.EXPIRED,
    ]
    assert sim.fleet.devices["node-00000-gpu0"].admin.value == "draining"
    sample = registry.get_sample_value(
        "fleetloop_executor_commands_total",
        {"executor": "node-executor", "command_type": "RouteCommand", "status": "applied"},
    )
    assert sample == 1.0


def test_malformed_commands_are_refused_by_their_owner_and_foreign_ones_skipped() -> None:
    registry = CollectorRegistry()
    sim, _ = _dispatcher()
    dispatcher = build_dispatcher(SimControl(sim.fleet), COMMAND_KEYS, registry)
    del dispatcher.executors[Scope.WARMER]  # a dispatcher that runs no warmer
    now = sim.fleet.now
    garbage = dispatcher.handle_raw(ROUTE_COMMANDS, b"{not json", now=now, received_at=now)
    assert garbage is not None and garbage.status is ResultStatus.MALFORMED
    assert garbage.executor == "router-executor" and "bad_json" in garbage.detail
    # a node command whose target reads but whose body does not: the node executor refuses it
    drain = _command(RouteCommand, target=DEVICE, action=RouteAction.DRAIN)
    doc = json.loads(encode(drain))
    doc["issued_at"] = "9999-12-31T23:59:59-01:00"
    bad = dispatcher.handle_raw(ROUTE_COMMANDS, json.dumps(doc).encode(), now=now, received_at=now)
    assert bad is not None and bad.status is ResultStatus.MALFORMED
    assert (bad.executor, bad.command_id) == ("node-executor", drain.command_id)
    warm = _command(
        WarmCommand, target=Target(pool="us-east-h100"), action=WarmAction.WARM, model="gemma-27b"
    )
    assert dispatcher.handle_raw(WARM_COMMANDS, encode(warm), now=now, received_at=now) is None
    assert dispatcher.handle_raw(WARM_COMMANDS, b"[]", now=now, received_at=now) is None  # not ours
    assert (
        registry.get_sample_value(
            "fleetloop_executor_malformed_total", {"topic": ROUTE_COMMANDS.name}
        )
        == 2.0
    )
    assert registry.get_sample_value("fleetloop_executor_skipped_total", {"scope": "warmer"}) == 2.0


def test_no_free_device_is_transient_and_a_retry_can_apply() -> None:
    sim, dispatcher = _dispatcher()
    now = sim.fleet.now
    warm = _command(
        WarmCommand,
        target=Target(pool="us-east-mtia"),
        action=WarmAction.WARM,
        model="qwen-7b",
        replicas=20,
    )
    first = dispatcher.handle(warm, now=now, received_at=now)
    assert first is not None and first.status is ResultStatus.APPLIED
    assert "short: no free device" in first.detail
    again = _command(
        WarmCommand, target=Target(pool="us-east-mtia"), action=WarmAction.WARM, model="qwen-7b"
    )
    full = dispatcher.handle(again, now=now, received_at=now)
    assert full is not None and full.status is ResultStatus.FAILED_TRANSIENT
    assert full.retry_after_s == 30.0
    assert again.command_id not in dispatcher.executors[Scope.WARMER].gate.seen  # may be retried


def test_unknown_targets_and_wrong_levers_are_permanent_and_a_tampered_id_is_forged() -> None:
    sim, dispatcher = _dispatcher()
    now = sim.fleet.now
    bad = [
        _command(RouteCommand, target=Target(pool="mars-h100"), action=RouteAction.DRAIN),
        _command(
            RouteCommand, target=Target(device_uuid="node-99999-gpu0"), action=RouteAction.DRAIN
        ),
        _command(
            ThrottleCommand,
            target=Target(pool="us-east-h100"),
            action=ThrottleAction.POWER_CAP,
            power_limit_watts=300.0,
        ),
        _command(  # a replica's weight in a pool it is not in
            RouteCommand,
            target=Target(pool="us-east-h100", device_uuid="node-99999-gpu0"),
            action=RouteAction.DEWEIGHT,
            weight_ratio=0.5,
        ),
        _command(
            ThrottleCommand,
            target=Target(pool="us-east-h100", rack_id="rack-9999"),
            action=ThrottleAction.MOVE_BATCH,
            batch_move_ratio=1.0,
            to_pool="us-east-a100",
        ),
        _command(
            ThrottleCommand,
            target=Target(pool="us-east-h100", rack_id="rack-0000"),
            action=ThrottleAction.MOVE_BATCH,
            batch_move_ratio=1.0,
            to_pool="mars-h100",
        ),
    ]
    for c in bad:
        result = dispatcher.handle(c, now=now, received_at=now)
        assert result is not None and result.status is ResultStatus.FAILED_PERMANENT, c
    details = [
        dispatcher.handle(
            c.model_copy(update={"command_id": uuid.uuid4()}), now=now, received_at=now
        )
        for c in bad[:1]
    ]
    assert details[0] is not None and details[0].status is ResultStatus.BAD_SIGNATURE


def test_the_router_moves_batch_work_off_a_rack_and_back() -> None:
    sim, dispatcher = _dispatcher()
    now = sim.fleet.now
    away = _command(
        ThrottleCommand, target=Target(pool="us-east-h100", rack_id="rack-0000"),
        action=ThrottleAction.MOVE_BATCH, batch_move_ratio=1.0, to_pool="us-east-a100",
    )  # fmt: skip
    result = dispatcher.handle(away, now=now, received_at=now)
    assert result is not None and result.status is ResultStatus.APPLIED
    assert "us-east-a100" in result.detail
    control = SimControl(sim.fleet)
    assert control.table()["batch_moves"] == {
        "us-east-h100@rack-0000": {"ratio": 1.0, "to_pool": "us-east-a100"}
    }
    back = _command(
        ThrottleCommand, target=Target(pool="us-east-h100", rack_id="rack-0000"),
        action=ThrottleAction.MOVE_BATCH, batch_move_ratio=0.0,
    )  # fmt: skip
    result = dispatcher.handle(back, now=now, received_at=now)
    assert result is not None and result.status is ResultStatus.APPLIED
    assert control.table()["batch_moves"] == {}


def test_one_command_id_is_applied_once_by_all_the_executors_together(tmp_path: Path) -> None:
    # a signed command id reused on another executor's target (a compromised or buggy
    # issuer) is a duplicate there: the executors share one replay memory
    sim, dispatcher = _dispatcher()
    now = sim.fleet.now
    same = uuid.uuid4()
    on_node = _command(RouteCommand, target=DEVICE, action=RouteAction.DRAIN, command_id=same)
    on_router = _command(
        RouteCommand, target=Target(pool="us-east-h100"), action=RouteAction.DEWEIGHT,
        weight_ratio=0.5, command_id=same,
    )  # fmt: skip
    first = dispatcher.handle(on_node, now=now, received_at=now)
    second = dispatcher.handle(on_router, now=now, received_at=now)
    assert first is not None and first.status is ResultStatus.APPLIED
    assert second is not None and second.status is ResultStatus.DUPLICATE
    assert second.executor == "router-executor"
    # and across a restart: the memory saved after the results went out is reloaded
    seen_file = tmp_path / "seen.json"
    keep_seen(seen_file, dispatcher.executors[Scope.NODE].gate.seen)(LoopStats(results=2))
    restarted = build_dispatcher(
        SimControl(sim.fleet), COMMAND_KEYS, CollectorRegistry(), seen=load_seen(seen_file)
    )
    again = restarted.handle(on_node, now=now, received_at=now)
    assert again is not None and again.status is ResultStatus.DUPLICATE


def test_a_weight_of_zero_is_zero() -> None:
    sim, dispatcher = _dispatcher()
    now = sim.fleet.now
    zero = _command(RouteCommand, target=DEVICE, action=RouteAction.DEWEIGHT, weight_ratio=0.0)
    result = dispatcher.handle(zero, now=now, received_at=now)
    assert result is not None and result.status is ResultStatus.APPLIED
    assert sim.fleet.devices[DEVICE.device_uuid or ""].weight_ratio == 0.0


def test_only_a_restore_loosens_an_isolated_device() -> None:
    # a health worker that lost its ladder (a restart) asks for a de-weight again: the
    # drained device stays drained until a restore
    sim, dispatcher = _dispatcher()
    now = sim.fleet.now
    device = sim.fleet.devices[DEVICE.device_uuid or ""]

    def send(action: RouteAction, **fields: object) -> str:
        command = _command(RouteCommand, target=DEVICE, action=action, **fields)
        result = dispatcher.handle(command, now=now, received_at=now)
        assert result is not None and result.status is ResultStatus.APPLIED, result
        return str(result.detail)

    send(RouteAction.DRAIN)
    assert "stays draining" in send(RouteAction.DEWEIGHT, weight_ratio=0.5)
    assert device.admin.value == "draining" and device.weight_ratio == 1.0
    send(RouteAction.QUARANTINE)  # stricter still: taken
    send(RouteAction.RESTORE)
    assert device.admin.value == "active"
    send(RouteAction.DEWEIGHT, weight_ratio=0.5)
    assert device.admin.value == "deweighted" and device.weight_ratio == 0.5


def test_the_router_weights_a_replica_within_its_pool_and_brings_it_back() -> None:
    # power-aware routing: the router's own weight for a capped device's replica, apart
    # from the device's admission state (the ladder's); weight 1 brings it back, and never
    # readmits a device the ladder had the router eject
    sim, dispatcher = _dispatcher()
    now = sim.fleet.now
    control = SimControl(sim.fleet)
    uuid_ = "node-00000-gpu0"
    pool = sim.fleet.devices[uuid_].pool

    def weights() -> dict[str, float]:
        return {r["device_uuid"]: r["weight"] for rows in control.table()["routes"].values()
                for r in rows if r["pool"] == pool}  # fmt: skip

    before = weights()
    down = _command(RouteCommand, target=Target(pool=pool, device_uuid=uuid_),
                    action=RouteAction.DEWEIGHT, weight_ratio=0.25)  # fmt: skip
    result = dispatcher.handle(down, now=now, received_at=now)
    assert result is not None and result.status is ResultStatus.APPLIED, result
    assert weights()[uuid_] == pytest.approx(0.25 * before[uuid_])
    assert sim.fleet.devices[uuid_].weight_ratio == 1.0  # its admission state is untouched
    sim.tick(1)
    peer = next(u for u in before if u != uuid_ and sim.fleet.devices[u].model
                == sim.fleet.devices[uuid_].model)  # fmt: skip
    assert sim.fleet.devices[uuid_].offered_rps < 0.5 * sim.fleet.devices[peer].offered_rps
    eject = _command(RouteCommand, target=Target(pool=pool, device_uuid=uuid_),
                     action=RouteAction.QUARANTINE)  # fmt: skip
    back = _command(RouteCommand, target=Target(pool=pool, device_uuid=uuid_),
                    action=RouteAction.DEWEIGHT, weight_ratio=1.0)  # fmt: skip
    for c in (eject, back):
        result = dispatcher.handle(c, now=now, received_at=now)
        assert result is not None and result.status is ResultStatus.APPLIED, result
    assert uuid_ in sim.fleet.router.ejected and uuid_ not in sim.fleet.router.replica_weights
