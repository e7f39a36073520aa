"""Write one JSON Schema per contract, for executors written in other languages.

Standard JSON Schema (2020-12) keywords only, and the validators' cross-field
rules with them (a target names something, each action carries its parameter);
``$comment`` says the one rule a schema cannot (``expires_at`` after
``issued_at``, within the type's lifetime) and which topics carry the type.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from schemas.base import Contract
from schemas.commands import CommandResult, DeadLetter
from schemas.envelopes import ENVELOPE_VERSION
from schemas.topics import ALL_TOPICS

EXTRA_TYPES: tuple[type[Contract], ...] = (CommandResult, DeadLetter)


def json_schema(value_type: type[Any]) -> tuple[int, dict[str, Any]]:
    """The contract version of ``value_type`` and its JSON Schema (pydantic's for a v1
    contract; msgspec's for an envelope, its definitions at the top as pydantic puts them)."""
    if issubclass(value_type, Contract):
        return 1, value_type.model_json_schema()
    schema = msgspec.json.schema(value_type)
    return ENVELOPE_VERSION, {**schema["$defs"].pop(value_type.__name__), "$defs": schema["$defs"]}


def export_json_schemas(directory: Path) -> list[Path]:
    """Write ``<Type>.v<version>.schema.json`` for every value type in the registry (the
    node-tick envelopes are version 2)."""
    directory.mkdir(parents=True, exist_ok=True)
    types: set[type[Any]] = {spec.value_type for spec in ALL_TOPICS} | set(EXTRA_TYPES)
    written: list[Path] = []
    for value_type in sorted(types, key=lambda t: t.__name__):
        version, schema = json_schema(value_type)
        schema["$id"] = f"fleetloop/{value_type.__name__}.v{version}"
        topics = sorted(s.name for s in ALL_TOPICS if s.value_type is value_type)
        # standard keywords only, so strict validators (ajv's strict mode) compile it
        where = "on topics " + ", ".join(topics) if topics else "not published on a topic"
        schema["$comment"] = "; ".join(filter(None, [schema.get("$comment"), where]))
        path = directory / f"{value_type.__name__}.v{version}.schema.json"
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written
