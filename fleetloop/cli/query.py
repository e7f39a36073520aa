"""`fleetloop sql`, `fleetloop ask`, `fleetloop report`: the SRE read side against ClickHouse."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fleetloop.cli.flags import add_settings_flags, settings_from
from fleetloop.settings import ConnectionSettings


def _cmd_sql(args: argparse.Namespace) -> int:
    from fleetloop.sqlclient import QueryError, format_table, run_query

    try:
        result = run_query(settings_from(ConnectionSettings, args), args.query)
    except QueryError as exc:
        print(f"fleetloop sql: {exc}", file=sys.stderr)
        return 1
    if args.format == "json":
        print(json.dumps({"columns": result.columns, "rows": result.rows}, default=str))
    else:
        print(format_table(result))
    return 0


def _cmd_ask(args: argparse.Namespace) -> int:
    from fleetloop.report import run_ask
    from fleetloop.sqlclient import QueryError
    from sre.questions import QuestionError

    try:
        return run_ask(settings_from(ConnectionSettings, args), args.name, args.param, args.format)
    except (QuestionError, QueryError) as exc:
        print(f"fleetloop ask: {exc}", file=sys.stderr)
        return 1


def _cmd_report(args: argparse.Namespace) -> int:
    from fleetloop.report import run_report
    from fleetloop.sqlclient import QueryError

    try:
        return run_report(settings_from(ConnectionSettings, args), Path(args.out), args.device)
    except QueryError as exc:
        print(f"fleetloop report: {exc}", file=sys.stderr)
        return 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sql = sub.add_parser("sql", help="query ClickHouse (embedded or server)")
    sql.add_argument("query")
    sql.add_argument("--format", choices=["table", "json"], default="table")
    add_settings_flags(sql, ConnectionSettings)
    sql.set_defaults(func=_cmd_sql)

    ask = sub.add_parser("ask", help="answer one SRE question (no name: list them)")
    ask.add_argument("name", nargs="?")
    ask.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE")
    ask.add_argument("--format", choices=["table", "json"], default="table")
    add_settings_flags(ask, ConnectionSettings)
    ask.set_defaults(func=_cmd_ask)

    report = sub.add_parser("report", help="every SRE question as tables, and an HTML report")
    report.add_argument("--out", default="var/report.html", help="where the HTML report goes")
    report.add_argument("--device", help="device for the timeline (default: last isolated)")
    add_settings_flags(report, ConnectionSettings)
    report.set_defaults(func=_cmd_report)
