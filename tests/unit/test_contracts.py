import json
import uuid
from datetime import timedelta

import pytest
from pydantic import ValidationError

from schemas.commands import (
    CommandResult,
    DeadLetter,
    ResultStatus,
    RouteAction,
    RouteCommand,
    Target,
    ThrottleAction,
    ThrottleCommand,
    WarmAction,
    WarmCommand,
)
from schemas.dcgm import BY_FIELD, CATALOGUE
from schemas.events import AcceleratorTelemetry
from schemas.export import export_json_schemas
from schemas.signing import sign, verify
from schemas.topics import ALL_TOPICS, INGESTED_TOPICS, by_name, dead_letter_topic
from tests.factories import START, later


def _route(**kw: object) -> RouteCommand:
    base: dict[str, object] = dict(
        command_id=uuid.UUID(int=1),
        issued_at=START,
        expires_at=later(30),
        issuer="health",
        target=Target(device_uuid="node-00001-gpu3"),
        reason="xid_fatal",
        action=RouteAction.DRAIN,
    )
    base.update(kw)
    return RouteCommand.model_validate(base)


def test_command_must_expire_after_issue() -> None:
    with pytest.raises(ValidationError, match="expires_at"):
        _route(expires_at=START - timedelta(seconds=1))


def test_deweight_needs_its_weight() -> None:
    with pytest.raises(ValidationError, match="deweight needs weight_ratio"):
        _route(action=RouteAction.DEWEIGHT)
    assert _route(action=RouteAction.DEWEIGHT, weight_ratio=0.25).weight_ratio == 0.25


def test_command_target_cannot_be_empty() -> None:
    with pytest.raises(ValidationError, match="target"):
        Target()


@pytest.mark.parametrize("action", list(ThrottleAction))
def test_throttle_action_needs_its_parameter(action: ThrottleAction) -> None:
    with pytest.raises(ValidationError, match="needs its parameter"):
        ThrottleCommand(
            command_id=uuid.uuid4(),
            issued_at=START,
            expires_at=later(10),
            issuer="power",
            target=Target(rack_id="rack-0001"),
            reason="pdu_headroom",
            action=action,
        )


def test_a_batch_move_names_its_pool_its_rack_and_where_the_work_goes() -> None:
    def move(target: Target, **kw: object) -> ThrottleCommand:
        return ThrottleCommand(
            command_id=uuid.uuid4(), issued_at=START, expires_at=later(10), issuer="power",
            reason="move_batch", target=target, action=ThrottleAction.MOVE_BATCH,
            **kw,
        )  # fmt: skip

    both = Target(pool="us-east-h100", rack_id="rack-0001")
    assert move(both, batch_move_ratio=1.0, to_pool="eu-west-h100").to_pool == "eu-west-h100"
    assert move(both, batch_move_ratio=0.0).to_pool is None  # bringing it back
    with pytest.raises(ValidationError, match="names the pool that takes"):
        move(both, batch_move_ratio=0.5)
    with pytest.raises(ValidationError, match="the rack it leaves"):
        move(Target(pool="us-east-h100"), batch_move_ratio=1.0, to_pool="eu-west-h100")


def test_signature_verifies_and_detects_tampering_and_unknown_keys() -> None:
    keys = {"k1": b"secret-1", "k2": b"secret-2"}
    signed = sign(_route(), key_id="k2", key=keys["k2"])
    assert verify(signed, keys=keys)
    assert not verify(signed.model_copy(update={"action": RouteAction.QUARANTINE}), keys=keys)
    assert not verify(signed, keys={"k1": keys["k1"]})
    assert not verify(_route(), keys=keys)
    wire = RouteCommand.model_validate_json(signed.model_dump_json())
    assert verify(wire, keys=keys)


def test_warm_and_results_validate() -> None:
    warm = WarmCommand(
        command_id=uuid.uuid4(),
        issued_at=START,
        expires_at=later(600),
        issuer="demand",
        target=Target(pool="llama-70b/H100", region="us-east"),
        reason="forecast_rise",
        action=WarmAction.WARM,
        model="llama-70b",
        replicas=2,
        deadline_at=later(300),
    )
    assert warm.replicas == 2
    result = CommandResult(
        result_id=uuid.uuid4(),
        command_id=warm.command_id,
        command_type="warm",
        executor="warmer",
        status=ResultStatus.APPLIED,
        received_at=later(1),
        completed_at=later(40),
    )
    assert result.status is ResultStatus.APPLIED


def test_topic_registry_is_consistent() -> None:
    names = [t.name for t in ALL_TOPICS]
    assert len(names) == len(set(names))
    for spec in ALL_TOPICS:  # the name says the contract's version: v2 is the envelopes
        source = by_name(spec.name.removesuffix(".dlq"))
        assert source.name.endswith(".v2" if source.envelope else ".v1"), spec.name
    for spec in INGESTED_TOPICS:  # telemetry, commands and results: each has a dead letter twin
        dlq = dead_letter_topic(spec)
        assert by_name(dlq.name).value_type is DeadLetter
        assert spec.table and spec.partitions >= 1
    with pytest.raises(KeyError, match="known"):
        by_name("telemetry.nope.v1")


def test_dcgm_catalogue_covers_every_metric_field() -> None:
    identity = {
        "schema_version",
        "event_id",
        "observed_at",
        "node_id",
        "device_uuid",
        "device_index",
        "accelerator_type",
        "region",
        "pod_id",
        "rack_id",
        "pdu_id",
    }
    metrics = set(AcceleratorTelemetry.model_fields) - identity
    assert metrics == set(BY_FIELD)
    assert len({f.dcgm_id for f in CATALOGUE}) == len(CATALOGUE)
    assert BY_FIELD["gpu_util_ratio"].normalise(87) == pytest.approx(0.87)
    assert BY_FIELD["fb_total_bytes"].normalise(81559) == 81559 * 1024 * 1024
    assert BY_FIELD["power_usage_watts"].normalise(None) is None


def test_json_schema_export_writes_one_file_per_type(tmp_path) -> None:  # type: ignore[no-untyped-def]
    written = export_json_schemas(tmp_path)
    names = {p.name for p in written}
    assert "RouteCommand.v1.schema.json" in names
    assert "CommandResult.v1.schema.json" in names
    assert "AcceleratorTelemetry.v1.schema.json" in names
    doc = json.loads((tmp_path / "ThrottleCommand.v1.schema.json").read_text())
    assert "power_limit_watts" in doc["properties"]
    assert "on topics commands.throttle.v1" in doc["$comment"]


def test_commands_are_keyed_by_their_narrowest_ordering_scope() -> None:
    from schemas.topics import ROUTE_COMMANDS

    device = _route(target=Target(node_id="node-7", device_uuid="node-7-gpu1"))
    assert ROUTE_COMMANDS.key_for(device) == b"node-7"
    rack = _route(target=Target(rack_id="rack-3", region="eu-west"))
    assert ROUTE_COMMANDS.key_for(rack) == b"rack-3"
