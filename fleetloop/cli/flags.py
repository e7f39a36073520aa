"""Settings to flags and back: one ``--flag`` per settings field, nested groups
dotted (``--control.tpot-guard.high-ratio``), a flag over the environment over
the default. Every command group builds its settings through here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from pydantic import SecretStr, ValidationError
from pydantic_settings import BaseSettings

S = TypeVar("S", bound=BaseSettings)


def leaves(cls: type[BaseSettings]) -> Iterator[tuple[tuple[str, ...], Any, Any, str | None]]:
    """Every settings field as (path, type, default, description), nested groups walked
    down to their leaves (a group is a dataclass: a role's tuning, a controller's config)."""

    def walk(
        path: tuple[str, ...], hint: Any, default: Any, doc: str | None
    ) -> Iterator[tuple[tuple[str, ...], Any, Any, str | None]]:
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            hints = typing.get_type_hints(hint)
            for f in dataclasses.fields(hint):
                yield from walk((*path, f.name), hints[f.name], getattr(default, f.name), None)
        else:
            yield path, hint, default, doc

    for name, field in cls.model_fields.items():
        default = field.get_default(call_default_factory=True)
        yield from walk((name,), field.annotation, default, field.description)


def add_settings_flags(parser: argparse.ArgumentParser, cls: type[BaseSettings]) -> None:
    """One ``--flag`` per settings field, nested ones dotted (``--control.period-s``);
    unset flags fall through to env and defaults."""
    for path, _hint, default, doc in leaves(cls):
        flag = ".".join(p.replace("_", "-") for p in path)
        env = "FLEETLOOP_" + "__".join(path).upper()
        shown = default.get_secret_value() and "***" if isinstance(default, SecretStr) else default
        parser.add_argument(
            "--" + flag,
            dest="setting__" + "__".join(path),
            default=argparse.SUPPRESS,
            metavar=path[-1].upper(),
            help=f"{doc + '; ' if doc else ''}default {shown!r}; env {env}",
        )


def flag_value(raw: str, hint: Any) -> Any:
    """A flag's text as its field wants it: mappings as ``a=1,b=2`` or JSON, sequences as
    ``1,2,3`` or JSON; everything else as given (pydantic converts it)."""
    origin = typing.get_origin(hint) or hint
    if isinstance(origin, type) and issubclass(origin, Mapping):
        if raw.lstrip().startswith("{"):
            return json.loads(raw)
        pairs = [item.split("=", 1) for item in raw.split(",") if item.strip()]
        if any(len(p) != 2 for p in pairs):
            raise SystemExit(f"fleetloop: {raw!r} is not key=value[,key=value]")
        return {k.strip(): v.strip() for k, v in pairs}
    if isinstance(origin, type) and issubclass(origin, tuple | list):
        return json.loads(raw) if raw.lstrip().startswith("[") else raw.split(",")
    return raw


def settings_from(cls: type[S], args: argparse.Namespace) -> S:
    """``cls`` from the flags given, over the environment, over the defaults."""
    hints = {path: hint for path, hint, _, _ in leaves(cls)}
    overrides: dict[str, Any] = {}
    for key, value in vars(args).items():
        path = tuple(key.removeprefix("setting__").split("__"))
        if not key.startswith("setting__") or path not in hints:
            continue
        group = overrides
        for part in path[:-1]:
            group = group.setdefault(part, {})
        group[path[-1]] = flag_value(value, hints[path]) if isinstance(value, str) else value
    try:
        return cls(**overrides)
    except ValidationError as exc:
        raise SystemExit(f"fleetloop: bad settings for {cls.__name__}:\n{exc}") from None
