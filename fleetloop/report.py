"""`fleetloop ask` and `fleetloop report`: the SRE questions, answered from any ClickHouse."""

from __future__ import annotations

import json
from pathlib import Path

from fleetloop.settings import ConnectionSettings
from fleetloop.sqlclient import format_table, run_query
from sre.questions import QuestionError, load_questions
from sre.report import answer_all, charts, isolated_device, render_html
from sre.results import QueryResult


def parse_params(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise QuestionError(f"parameters are name=value, not {pair!r}")
        out[name] = value
    return out


def run_ask(settings: ConnectionSettings, name: str | None, params: list[str], fmt: str) -> int:
    questions = load_questions()
    if name is None:
        for q in questions.values():
            declared = ", ".join(
                f"{p.name} {p.type}" + ("" if p.default is None else f" = {p.default}")
                for p in q.parameters
            )
            print(f"{q.name}: {q.question}" + (f"\n    parameters: {declared}" if declared else ""))
        return 0
    if name not in questions:
        raise QuestionError(f"no question {name!r}; `fleetloop ask` lists them")
    sql = questions[name].render(database=settings.clickhouse_database, values=parse_params(params))
    result = run_query(settings, sql)
    if fmt == "json":
        print(json.dumps({"columns": result.columns, "rows": result.rows}, default=str))
    else:
        print(format_table(result))
    return 0


def run_report(settings: ConnectionSettings, out: Path, device: str | None) -> int:
    def query(sql: str) -> QueryResult:
        return run_query(settings, sql)

    db = settings.clickhouse_database
    device = device or isolated_device(query, database=db)
    values = {"device_timeline": {"device_uuid": device}} if device else {}
    answers = answer_all(query, database=db, values=values)
    for a in answers:
        print(f"\n== {a.question.name}: {a.question.question}")
        print(format_table(a.result) if a.result is not None else f"({a.error})")
    html = render_html(answers, charts(query, database=db, device=device), title="fleetloop report")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html)
    print(f"\nHTML report with charts: {out}")
    return 0
