"""SRE questions: one ClickHouse query per file in ``infra/clickhouse/queries``.

Each file starts with a header of ``-- key: value`` lines::

    -- question: Which racks are closest to their breaker limit?
    -- parameters: window_s UInt32 = 600, rack_id String = ''
    -- answer: one row per rack and PDU, least headroom first

and uses ``${database}`` for the database and ``{name:Type}`` for parameters.
Parameters are rendered here into typed SQL literals (integers, finite floats,
quoted strings, UTC instants), so one rendered statement runs the same way on
a ClickHouse server, through the worker's read-only ``/sql`` page, or on the
embedded engine. "Now" in these queries is the newest event stored, not the
wall clock: simulated and replayed data answer the same way as live data.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from string import Template

QUERIES_DIR = Path(__file__).resolve().parents[1] / "infra" / "clickhouse" / "queries"
_PLACEHOLDER = re.compile(r"\{(\w+):([^{}]+)\}")
_HEADER = re.compile(r"^--\s*(\w+):\s*(.*)$")
_PARAM = re.compile(r"^(\w+)\s+([\w()0-9, ']+?)(?:\s*=\s*(.*))?$")


class QuestionError(ValueError):
    """A question file or a parameter value that cannot be used, with the reason."""


@dataclass(frozen=True, slots=True)
class Parameter:
    name: str
    type: str
    default: str | None


@dataclass(frozen=True, slots=True)
class Question:
    name: str
    question: str
    answer: str
    parameters: tuple[Parameter, ...]
    sql: str

    def render(self, *, database: str, values: Mapping[str, str] | None = None) -> str:
        """The statement with ``values`` (else the defaults) as typed literals."""
        given = dict(values or {})
        known = {p.name: p for p in self.parameters}
        unknown = set(given) - set(known)
        if unknown:
            raise QuestionError(f"{self.name}: unknown parameters {sorted(unknown)}; "
                                f"known: {sorted(known)}")  # fmt: skip
        literals = {}
        for p in self.parameters:
            raw = given.get(p.name, p.default)
            if raw is None:
                raise QuestionError(f"{self.name}: parameter {p.name} ({p.type}) is required")
            literals[p.name] = literal(p.type, raw, name=p.name)

        def fill(match: re.Match[str]) -> str:
            name, kind = match.group(1), match.group(2).strip()
            if name not in known or known[name].type != kind:
                raise QuestionError(f"{self.name}: {{{name}:{kind}}} is not a declared parameter")
            return literals[name]

        return _PLACEHOLDER.sub(fill, Template(self.sql).substitute(database=database))


def literal(kind: str, raw: str, *, name: str = "value") -> str:
    """``raw`` as a ClickHouse literal of ``kind``; a clear error when it is not one."""
    try:
        if re.fullmatch(r"U?Int(8|16|32|64)", kind):
            value = int(raw)
            if kind.startswith("U") and value < 0:
                raise ValueError("negative")
            return str(value)
        if kind in ("Float32", "Float64"):
            number = float(raw)
            if not math.isfinite(number):
                raise ValueError("not finite")
            return repr(number)
        if kind == "String":
            return "'" + raw.replace("\\", "\\\\").replace("'", "\\'") + "'"
        if kind.startswith("DateTime"):
            at = datetime.fromisoformat(raw)
            at = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
            return f"toDateTime64('{at:%Y-%m-%d %H:%M:%S.%f}', 6, 'UTC')"
    except ValueError as exc:
        raise QuestionError(f"parameter {name}: {raw!r} is not a {kind} ({exc})") from None
    raise QuestionError(f"parameter {name}: unsupported type {kind}")


def parse(path: Path) -> Question:
    text = path.read_text()
    header: dict[str, str] = {}
    body: list[str] = []
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m and not body and m.group(1) in ("question", "parameters", "answer"):
            header[m.group(1)] = m.group(2).strip()
        elif body or not line.startswith("--"):
            body.append(line)
    if "question" not in header:
        raise QuestionError(f"{path.name}: the header has no '-- question:' line")
    params = []
    for part in filter(None, (p.strip() for p in header.get("parameters", "").split(","))):
        m = _PARAM.match(part)
        if not m:
            raise QuestionError(f"{path.name}: bad parameter declaration {part!r}")
        default = m.group(3)
        if default is not None and default.startswith("'") and default.endswith("'"):
            default = default[1:-1]
        params.append(Parameter(m.group(1), m.group(2).strip(), default))
    sql = "\n".join(body).strip().rstrip(";")
    return Question(path.stem, header["question"], header.get("answer", ""), tuple(params), sql)


def load_questions(directory: Path = QUERIES_DIR) -> dict[str, Question]:
    """Every question in ``directory``, by file name without ``.sql``."""
    return {p.stem: parse(p) for p in sorted(directory.glob("*.sql"))}
