"""Answer ``fleetloop sql`` in both modes.

With ``CLICKHOUSE_URL`` the server answers. Embedded chDB locks its data
directory, so the worker that owns it answers over HTTP (``/sql`` on its web
port); when no worker is listening, the CLI opens the directory itself.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request

from clickhouse_connect.driver.exceptions import ClickHouseError

from fleetloop.page_token import page_token
from fleetloop.settings import ConnectionSettings
from sre.results import QueryResult
from streams.clickhouse_store import ClickHouseStore, StoreLockedError, open_store


class QueryError(RuntimeError):
    """ClickHouse refused the query; the message is ClickHouse's."""


def _via_owner(url: str, sql: str, timeout_s: float, token: str | None) -> QueryResult:
    request = urllib.request.Request(
        url.rstrip("/") + "/sql",
        data=json.dumps({"sql": sql}).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token or ''}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        with contextlib.suppress(ValueError, KeyError):
            detail = json.loads(detail)["error"]
        raise QueryError(detail) from None
    return QueryResult(body["columns"], body["rows"])


def run_query(settings: ConnectionSettings, sql: str, *, timeout_s: float = 30.0) -> QueryResult:
    """Run ``sql`` wherever the data lives."""
    if settings.clickhouse_server_url:
        store = open_store(
            url=settings.clickhouse_server_url,
            data_dir=settings.clickhouse_dir,
            database=settings.clickhouse_database,
        )
        return _query_and_close(store, sql)
    try:
        token = page_token(settings, create=False)
        return _via_owner(settings.query_url, sql, timeout_s, token)
    except urllib.error.URLError as exc:
        if not isinstance(exc.reason, ConnectionRefusedError):
            raise
    try:
        store = open_store(
            url=None, data_dir=settings.clickhouse_dir, database=settings.clickhouse_database
        )
    except StoreLockedError as exc:
        raise QueryError(
            f"{exc}, and nothing answers at {settings.query_url}; point --query-url at it"
        ) from None
    store.apply_schema()  # we own the directory now: its tables exist, as the worker makes them
    return _query_and_close(store, sql)


def _query_and_close(store: ClickHouseStore, sql: str) -> QueryResult:
    try:
        return store.query(sql, readonly=True)  # as the worker answers: bounded, read-only
    except ClickHouseError as exc:
        raise QueryError(str(exc)) from None
    finally:
        store.close()


def format_table(result: QueryResult) -> str:
    """Aligned plain-text table."""
    cells = [[str(c) for c in result.columns]] + [
        ["" if v is None else str(v) for v in r] for r in result.rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(result.columns))]
    lines = [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
