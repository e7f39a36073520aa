"""Write one JSON Schema per contract, for executors written in other languages."""

from __future__ import annotations

import json
from pathlib import Path

from schemas.base import Contract
from schemas.commands import CommandResult, DeadLetter
from schemas.topics import ALL_TOPICS

EXTRA_TYPES: tuple[type[Contract], ...] = (CommandResult, DeadLetter)


def export_json_schemas(directory: Path) -> list[Path]:
    """Write ``<Type>.v<version>.schema.json`` for every value type in the registry."""
    directory.mkdir(parents=True, exist_ok=True)
    types: set[type[Contract]] = {spec.value_type for spec in ALL_TOPICS} | set(EXTRA_TYPES)
    written: list[Path] = []
    for value_type in sorted(types, key=lambda t: t.__name__):
        schema = value_type.model_json_schema()
        schema["$id"] = f"fleetloop/{value_type.__name__}.v1"
        topics = sorted(s.name for s in ALL_TOPICS if s.value_type is value_type)
        schema["x-fleetloop-topics"] = topics
        path = directory / f"{value_type.__name__}.v1.schema.json"
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written
