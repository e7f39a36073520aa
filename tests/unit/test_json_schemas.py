"""The exported JSON Schemas compile strictly (standard 2020-12 keywords only, as ajv's
strict mode demands) and say what the Python contracts say: every valid command passes,
and what the contracts refuse for a cross-field reason the schemas refuse too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator, FormatChecker
from pydantic import ValidationError

from schemas.codec import encode
from schemas.commands import (
    COMMAND_TYPES,
    RouteAction,
    RouteCommand,
    Target,
    ThrottleAction,
    ThrottleCommand,
)
from schemas.export import export_json_schemas
from tests.factories import START, signed_command
from tests.signing_vectors import PATH

# the keywords of JSON Schema 2020-12 (core, applicator, validation, format, content,
# meta-data and unevaluated vocabularies): anything else fails a strict compile
KEYWORDS = {
    "$schema", "$id", "$ref", "$anchor", "$dynamicRef", "$dynamicAnchor", "$defs",
    "$comment", "$vocabulary", "allOf", "anyOf", "oneOf", "not", "if", "then", "else",
    "dependentSchemas", "prefixItems", "items", "contains", "properties",
    "patternProperties", "additionalProperties", "propertyNames", "type", "enum", "const",
    "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength",
    "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "maxContains",
    "minContains", "maxProperties", "minProperties", "required", "dependentRequired",
    "format", "contentEncoding", "contentMediaType", "contentSchema", "title", "description",
    "default", "deprecated", "readOnly", "writeOnly", "examples", "unevaluatedItems",
    "unevaluatedProperties",
}  # fmt: skip
SCHEMA_MAPS = {"properties", "$defs", "patternProperties", "dependentSchemas"}
SCHEMA_LISTS = {"allOf", "anyOf", "oneOf", "prefixItems"}
SCHEMA_VALUES = {"not", "if", "then", "else", "items", "contains", "additionalProperties",
                 "propertyNames", "unevaluatedItems", "unevaluatedProperties"}  # fmt: skip


def _unknown_keywords(schema: Any, where: str = "#") -> Iterator[str]:
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        if key not in KEYWORDS:
            yield f"{where}/{key}"
        elif key in SCHEMA_MAPS:
            for name, sub in value.items():
                yield from _unknown_keywords(sub, f"{where}/{key}/{name}")
        elif key in SCHEMA_LISTS:
            for i, sub in enumerate(value):
                yield from _unknown_keywords(sub, f"{where}/{key}/{i}")
        elif key in SCHEMA_VALUES:
            yield from _unknown_keywords(value, f"{where}/{key}")


@pytest.fixture(scope="module")
def schemas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("schemas")
    return {p.name.split(".")[0]: json.loads(p.read_text()) for p in export_json_schemas(out)}


def test_every_schema_compiles_strictly(schemas: dict[str, dict[str, Any]]) -> None:
    for name, schema in schemas.items():
        Draft202012Validator.check_schema(schema)
        assert list(_unknown_keywords(schema)) == [], name


def test_the_strict_check_catches_a_custom_keyword() -> None:
    assert list(_unknown_keywords({"properties": {"a": {"x-ours": 1}}})) == [
        "#/properties/a/x-ours"
    ]


def _validator(schemas: dict[str, dict[str, Any]], name: str) -> Draft202012Validator:
    return Draft202012Validator(schemas[name], format_checker=FormatChecker())


def test_valid_commands_pass_their_schema(schemas: dict[str, dict[str, Any]]) -> None:
    for vector in json.loads(PATH.read_text())["vectors"]:
        payload = json.loads(vector["wire"])
        assert not list(_validator(schemas, payload["command_type"]).iter_errors(payload))
    for kind in COMMAND_TYPES:
        assert kind.__name__ in schemas


def _route(**fields: Any) -> dict[str, Any]:
    command = signed_command(RouteCommand, issued_at=START, target=Target(node_id="n"),
                             action=RouteAction.DRAIN)  # fmt: skip
    return {**json.loads(encode(command)), **fields}


def _throttle(**fields: Any) -> dict[str, Any]:
    command = signed_command(ThrottleCommand, issued_at=START, target=Target(node_id="n"),
                             action=ThrottleAction.POWER_CAP, power_limit_watts=300.0)  # fmt: skip
    return {**json.loads(encode(command)), **fields}


EMPTY_TARGET = dict.fromkeys(("node_id", "device_uuid", "pool", "rack_id", "region"))


@pytest.mark.parametrize(
    ("name", "payload"),
    [
        ("RouteCommand", _route(target={"schema_version": 1, **EMPTY_TARGET})),
        ("RouteCommand", _route(action="deweight", weight_ratio=None)),
        ("ThrottleCommand", _throttle(power_limit_watts=None)),
        ("ThrottleCommand", _throttle(action="admission")),
        ("ThrottleCommand", _throttle(action="move_batch", batch_move_ratio=0.5)),  # no rack
        ("ThrottleCommand", _throttle(command_type="RouteCommand")),
    ],
)
def test_what_the_contracts_refuse_the_schemas_refuse(
    schemas: dict[str, dict[str, Any]], name: str, payload: dict[str, Any]
) -> None:
    kind = {c.__name__: c for c in COMMAND_TYPES}[name]
    with pytest.raises(ValidationError):
        kind.model_validate_json(json.dumps(payload))
    assert list(_validator(schemas, name).iter_errors(payload)), payload


def test_the_one_rule_a_schema_cannot_say_is_written_in_it(
    schemas: dict[str, dict[str, Any]],
) -> None:
    backwards = _route(expires_at=(START - timedelta(seconds=1)).isoformat())
    with pytest.raises(ValidationError):
        RouteCommand.model_validate_json(json.dumps(backwards))
    assert "expires_at after issued_at" in schemas["RouteCommand"]["$comment"]


def test_schema_files_are_written_where_asked(tmp_path: Path) -> None:
    assert all(p.parent == tmp_path for p in export_json_schemas(tmp_path))
