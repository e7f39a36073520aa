"""One ClickHouse code path for the embedded engine (chDB) and a server.

``open_store(url=None, data_dir=...)`` gives the embedded engine in-process
(it locks ``data_dir``: one owning process); with a URL it talks HTTP to a
server. The sink's writes and reads go through one thread and one session, so
the asyncio loop never blocks on ClickHouse. Anyone's SQL (``/sql``, the
dashboards, ``fleetloop sql``) runs elsewhere: one statement, on a fresh
read-only session each time (nothing one caller did is seen by the next), with
time, row and memory limits (:data:`READER_SETTINGS`, the same for chDB and a
server), on reader threads of their own, so a slow query never delays an insert.
"""

from __future__ import annotations

import asyncio
import fcntl
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from string import Template
from typing import Any
from urllib.parse import urlparse

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from sre.results import QueryResult

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "infra" / "clickhouse" / "schema"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


READER_SETTINGS: dict[str, Any] = {
    # Anyone's SQL: bound what one query may return and how long it may run. The
    # session is SET in this order, and readonly must come last (it freezes the rest).
    "max_result_rows": 100_000,
    "result_overflow_mode": "throw",
    "max_execution_time": 60,
    "max_memory_usage": 2 * 1024**3,  # a query past it fails; the worker lives on
    "readonly": 1,
}
READER_THREADS = 2


class StatementError(ValueError):
    """Not exactly one statement."""


def one_statement(sql: str) -> str:
    """``sql`` without its trailing semicolons, if it is exactly one statement.

    Quoted text (``'``, ``"``, backticks, with backslash escapes and doubled quotes) and
    comments (``--``, ``/* */``) are skipped, so a semicolon inside them does not count;
    after the statement only semicolons, spaces and comments may follow.
    """
    text = sql.strip()
    end, i = len(text), 0  # end: where the statement stops (its first top-level ';')
    while i < len(text):
        ch = text[i]
        if text.startswith("--", i):
            newline = text.find("\n", i)
            i = len(text) if newline < 0 else newline
        elif text.startswith("/*", i):
            close = text.find("*/", i + 2)
            i = len(text) if close < 0 else close + 1
        elif ch == ";":
            end = min(end, i)
        elif end < len(text) and not ch.isspace():
            raise StatementError("one statement per query")
        elif ch in "'\"`":
            i = _closing_quote(text, i)
        i += 1
    statement = text[:end].strip()
    if not statement:
        raise StatementError("empty query")
    return statement


def _closing_quote(text: str, start: int) -> int:
    quote, i = text[start], start + 1
    while i < len(text):
        if text[i] == "\\" or (text[i] == quote and text.startswith(quote * 2, i)):
            i += 2
        elif text[i] == quote:
            return i
        else:
            i += 1
    return len(text)


class StoreLockedError(RuntimeError):
    """The embedded data directory is owned by another process (ask that one)."""


INSERT_SETTINGS: dict[str, Any] = {
    "async_insert": 0,  # chDB defaults to async inserts; the sink needs the write done
    # a retried batch (same token) must not be counted twice by the per-minute rollups
    "deduplicate_blocks_in_dependent_materialized_views": 1,
    # the per-minute rollups are partitioned by the events' month: a batch from an agent
    # with a broken clock may span over 100 months (the default limit), and a batch refused
    # for good would stall the ingest; ClickHouse logs a warning instead
    "throw_on_max_partitions_per_insert_block": 0,
}


class ClickHouseStore:
    """A ClickHouse client bound to one database, with its DDL applied."""

    def __init__(
        self,
        client: Client,
        *,
        database: str,
        data_dir: Path | None = None,
        open_reader: Callable[[], Client] | None = None,
    ) -> None:
        if not _IDENT.match(database):
            raise ValueError(f"bad database name {database!r}")
        self.client = client
        self._open_reader = open_reader
        self.database = database
        self.data_dir = data_dir
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clickhouse")
        self._readers = ThreadPoolExecutor(READER_THREADS, thread_name_prefix="clickhouse-read")

    def on_database(self, database: str) -> ClickHouseStore:
        """The same engine and sessions, bound to another database (apply its schema)."""
        return ClickHouseStore(
            self.client, database=database, data_dir=self.data_dir, open_reader=self._open_reader
        )

    # -- schema -------------------------------------------------------------
    def apply_schema(self, schema_dir: Path = SCHEMA_DIR) -> list[str]:
        """Create the database and every table in ``schema_dir`` (idempotent)."""
        self.command(f"CREATE DATABASE IF NOT EXISTS {self.database}")
        applied: list[str] = []
        for path in sorted(schema_dir.glob("*.sql")):
            text = Template(path.read_text()).substitute(database=self.database)
            for statement in _statements(text):
                self.command(statement)
            applied.append(path.name)
        return applied

    # -- sync API (call from the store's thread or a CLI) -------------------
    def command(self, sql: str) -> None:
        with self._lock:
            self.client.command(sql)

    def query(self, sql: str, *, readonly: bool = False) -> QueryResult:
        """Run ``sql``; ``readonly`` queries (anyone's SQL) must be one statement and run
        on a fresh read-only session, where unqualified table names are this store's
        database's, without the sink's lock.

        A per-query ``readonly`` setting is not enough: after a refused statement
        chDB leaves the session read-only, which would stop the sink's inserts; and a
        session kept between callers could hand one caller's state to the next.
        """
        if readonly:
            if self._open_reader is None:
                raise RuntimeError("this store has no read-only session")
            reader = self._open_reader()
            try:
                result = reader.query(one_statement(sql))
            finally:
                reader.close()
        else:
            with self._lock:
                result = self.client.query(sql)
        return QueryResult(result.column_names, result.result_rows)

    def insert(
        self, table: str, rows: Sequence[Sequence[Any]], columns: Sequence[str], *, token: str
    ) -> None:
        """Insert one batch; retrying with the same ``token`` adds nothing."""
        settings = {**INSERT_SETTINGS, "insert_deduplication_token": token}
        with self._lock:
            self.client.insert(
                f"{self.database}.{table}", rows, column_names=list(columns), settings=settings
            )

    def insert_json_lines(
        self,
        table: str,
        lines: Sequence[bytes],
        *,
        token: str,
        settings: dict[str, Any],
        fmt: str = "JSONEachRow",
        columns: Sequence[str] | None = None,
    ) -> None:
        """Insert JSON lines (objects, or arrays in ``columns``' order with
        ``JSONCompactEachRow``); retrying with the same ``token`` adds nothing."""
        body = b"\n".join(lines)
        merged = {**settings, **INSERT_SETTINGS, "insert_deduplication_token": token}
        names = None if columns is None else list(columns)
        with self._lock:
            self.client.raw_insert(
                f"{self.database}.{table}", names, body, settings=merged, fmt=fmt
            )

    # -- async wrappers ------------------------------------------------------
    async def run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn`` on the sink's thread (writes, and the sink's own reads)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    async def run_reader(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn`` on a reader thread: for anyone's read-only SQL, never the sink's thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, lambda: fn(*args, **kwargs))

    def close(self) -> None:
        self._readers.shutdown(wait=True)
        self._executor.shutdown(wait=True)
        with self._lock:
            self.client.close()


def _statements(text: str) -> list[str]:
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


_OPENED_HERE: set[Path] = set()  # chDB allows more handles on the path this process owns


def _locked_by_another_process(data_dir: Path) -> bool:
    """ClickHouse holds an exclusive flock on ``<data_dir>/status`` while it runs."""
    if data_dir.resolve() in _OPENED_HERE:
        return False
    status = data_dir / "status"
    if not status.exists():
        return False
    with status.open("rb") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def open_store(*, url: str | None, data_dir: Path, database: str) -> ClickHouseStore:
    """Open a server (``url``) or the embedded engine at ``data_dir``."""
    if url:
        parts = urlparse(url)

        def server_client(db: str = "", **settings: Any) -> Client:
            return clickhouse_connect.get_client(
                database=db,
                host=parts.hostname or "localhost",
                port=parts.port or (8443 if parts.scheme == "https" else 8123),
                username=parts.username or "default",
                password=parts.password or "",
                secure=parts.scheme == "https",
                settings=settings,
            )

        return ClickHouseStore(
            server_client(),
            database=database,
            open_reader=lambda: server_client(database, **READER_SETTINGS),
        )
    data_dir.mkdir(parents=True, exist_ok=True)
    if _locked_by_another_process(data_dir):
        raise StoreLockedError(f"embedded ClickHouse at {data_dir} is owned by another process")
    client = clickhouse_connect.get_client(interface="chdb", path=str(data_dir))
    _OPENED_HERE.add(data_dir.resolve())

    def reader() -> Client:  # its own session, bounded, read-only, on our database by default
        return clickhouse_connect.get_client(
            interface="chdb", path=str(data_dir), database=database, settings=READER_SETTINGS
        )

    return ClickHouseStore(client, database=database, data_dir=data_dir, open_reader=reader)
