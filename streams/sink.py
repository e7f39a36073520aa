"""Batched, idempotent ClickHouse sink with per-partition watermarks.

Each row carries its Kafka coordinates. Before writing, the sink asks
ClickHouse (once per partition per assignment) for the highest offset already
stored per (table, topic, partition) and drops rows at or below it, so a
batch replayed after a crash or a rebalance adds no rows. A retried insert
reuses its ``insert_deduplication_token``, so a retry after a lost reply adds
nothing either. Offsets are committed to Kafka only after the write returns
(the processor awaits it), which gives at-least-once delivery with
idempotent effects.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram

from schemas.commands import DeadLetter
from schemas.topics import RESENT_HEADER
from streams.clickhouse_store import ClickHouseStore
from streams.rows import LAYOUTS, Coordinates, TableLayout, instant_json

Record = tuple[Any, Coordinates]  # a contract or an envelope, and where it came from
R = TypeVar("R", bound=tuple[Any, Coordinates])
PartitionKey = tuple[str, str, int]  # table, topic, partition


@dataclass(slots=True)
class Watermarks:
    """Highest stored offset per (table, topic, partition); -1 when none."""

    marks: dict[PartitionKey, int] = field(default_factory=dict)

    def missing(self, keys: Iterable[PartitionKey]) -> set[PartitionKey]:
        return {k for k in keys if k not in self.marks}

    def fresh(self, table: str, records: Sequence[R]) -> list[R]:
        """Records above the watermark of their partition, in input order."""
        return [r for r in records if r[1].offset > self.marks[(table, r[1].topic, r[1].partition)]]

    def advance(self, table: str, records: Sequence[Record]) -> None:
        for _, at in records:
            key = (table, at.topic, at.partition)
            if at.offset > self.marks.get(key, -1):
                self.marks[key] = at.offset

    def forget(self, topic_partitions: Iterable[tuple[str, int]]) -> None:
        """Drop cached marks for partitions that moved (another worker may have written)."""
        gone = set(topic_partitions)
        for key in [k for k in self.marks if (k[1], k[2]) in gone]:
            del self.marks[key]


def batch_token(table: str, records: Sequence[Record]) -> str:
    """Deterministic dedup token: the table and each partition's offset range."""
    offsets: dict[tuple[str, int], list[int]] = {}
    for _, at in records:
        offsets.setdefault((at.topic, at.partition), []).append(at.offset)
    ranges = (f"{t}:{p}:{min(o)}-{max(o)}" for (t, p), o in sorted(offsets.items()))
    text = table + ";" + ";".join(ranges)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Insert:
    """One encoded insert into one table, and the records it holds (for the watermarks)."""

    layout: TableLayout
    run: Callable[[TableLayout, list[Any], str], None]
    data: list[Any]  # JSON lines, or rows
    token: str
    records: list[Record]
    rows: int  # rows it lands as (an envelope's line is one row per sample)


def combined(batches: Sequence[Sequence[Insert]]) -> list[Insert]:
    """Several batches' prepared inserts (in order) as one insert per table: their lines
    or rows one after another, one token over all their records."""
    by_table: dict[str, list[Insert]] = {}
    for inserts in batches:
        for one in inserts:
            by_table.setdefault(one.layout.table, []).append(one)
    out: list[Insert] = []
    for table, ones in by_table.items():
        if len(ones) == 1:
            out.append(ones[0])
            continue
        records = [record for one in ones for record in one.records]
        data = [item for one in ones for item in one.data]
        token = batch_token(table, records)
        rows = sum(one.rows for one in ones)
        out.append(Insert(ones[0].layout, ones[0].run, data, token, records, rows))
    return out


class SinkMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.rows = Counter(
            "fleetloop_sink_rows_total", "Rows written to ClickHouse", ["table"], registry=registry
        )
        self.replayed = Counter(
            "fleetloop_sink_replayed_rows_total",
            "Rows dropped because ClickHouse already held them (replay after crash or rebalance)",
            ["table"],
            registry=registry,
        )
        self.insert_seconds = Histogram(
            "fleetloop_sink_insert_seconds",
            "Time per ClickHouse insert",
            ["table"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.copies = Counter(
            "fleetloop_sink_copies_dropped_total",
            "Events dropped because ClickHouse (or the batch) held them already: copies an "
            "agent sent again from its spool",
            ["table"],
            registry=registry,
        )
        self.retries = Counter(
            "fleetloop_sink_retries_total", "Insert retries", ["table"], registry=registry
        )


class ClickHouseSink:
    """Writes contracts to their tables, dropping rows at or below each partition's
    stored watermark, with one deduplication token per batch (at-least-once, no
    duplicates)."""

    def __init__(
        self,
        store: ClickHouseStore,
        *,
        registry: CollectorRegistry,
        max_attempts: int = 5,
        retry_delay_s: float = 0.5,
    ) -> None:
        self.store = store
        self.marks = Watermarks()
        self.metrics = SinkMetrics(registry)
        self.max_attempts = max_attempts
        self.retry_delay_s = retry_delay_s

    async def _load_marks(self, layout: TableLayout, keys: set[PartitionKey]) -> None:
        if not keys:
            return
        topic_col, part_col, off_col = layout.coordinate_columns
        pairs = ",".join(f"('{_sql_str(t)}',{p})" for _, t, p in sorted(keys))
        sql = (
            f"SELECT {topic_col}, {part_col}, max({off_col}) FROM "
            f"{self.store.database}.{layout.rows_table} WHERE ({topic_col}, {part_col}) "
            f"IN ({pairs}) GROUP BY {topic_col}, {part_col}"
        )
        result = await self.store.run(self.store.query, sql)
        found = {(layout.rows_table, str(t), int(p)): int(o) for t, p, o in result.rows}
        for key in keys:
            self.marks.marks[key] = found.get(key, -1)

    async def load_marks(self, partitions: Iterable[tuple[type[Any], str, int]]) -> None:
        """Read the watermarks of newly assigned partitions (their value type, topic and
        partition) and of their dead letters, one query per table, before their first
        batch: otherwise each partition's first batch waits for its own query, behind the
        insert in flight."""
        wanted: dict[str, tuple[TableLayout, set[PartitionKey]]] = {}
        for value_type, topic, partition in partitions:
            for layout in (LAYOUTS[value_type], LAYOUTS[DeadLetter]):
                table = layout.rows_table
                wanted.setdefault(table, (layout, set()))[1].add((table, topic, partition))
        for layout, keys in wanted.values():
            await self._load_marks(layout, self.marks.missing(keys))

    async def unseen(self, records: Sequence[R]) -> list[R]:
        """The records ClickHouse does not hold yet (all of one value type or mixed)."""
        by_layout: dict[str, list[R]] = defaultdict(list)
        layouts: dict[str, TableLayout] = {}
        for rec in records:  # watermarks are kept where the rows are (past a staging table)
            layout = LAYOUTS[type(rec[0])]
            layouts[layout.rows_table] = layout
            by_layout[layout.rows_table].append(rec)
        out: list[R] = []
        for table, recs in by_layout.items():
            keys = {(table, at.topic, at.partition) for _, at in recs}
            await self._load_marks(layouts[table], self.marks.missing(keys))
            fresh = self.marks.fresh(table, recs)
            self.metrics.replayed.labels(table).inc(len(recs) - len(fresh))
            if any(at.resent for _, at in fresh):
                unique = await self._without_copies(table, fresh)
                self.metrics.copies.labels(table).inc(len(fresh) - len(unique))
                fresh = unique
            out.extend(fresh)
        return out

    async def _without_copies(self, table: str, records: list[R]) -> list[R]:
        """``records`` less the copies of an event: a second one in the batch, or one sent
        again from a spool (the resent header) whose ``event_id`` ClickHouse holds already.
        Only resent records are looked up, in the time range they were observed in, so the
        hot path (no resend) costs nothing."""
        resent = [v for v, at in records if at.resent and hasattr(v, "event_id")]
        topics = ",".join(sorted({f"'{_sql_str(at.topic)}'" for _, at in records if at.resent}))
        stored: set[str] = set()
        for start in range(0, len(resent), 5_000):
            chunk = resent[start : start + 5_000]
            ids = ",".join(f"'{v.event_id}'" for v in chunk)
            # a second either side: the table keeps milliseconds, an event may carry more
            lo = min(v.observed_at for v in chunk) - timedelta(seconds=1)
            hi = max(v.observed_at for v in chunk) + timedelta(seconds=1)
            sql = (
                f"SELECT toString(event_id) FROM {self.store.database}.{table} "
                f"WHERE src_topic IN ({topics}) AND event_id IN ({ids}) AND observed_at BETWEEN "
                f"parseDateTime64BestEffort('{lo.isoformat()}', 6) AND "
                f"parseDateTime64BestEffort('{hi.isoformat()}', 6)"
            )
            result = await self.store.run(self.store.query, sql)
            stored |= {str(row[0]) for row in result.rows}
        seen: set[str] = set()
        out: list[R] = []
        for rec in records:
            event_id = getattr(rec[0], "event_id", None)
            if event_id is not None:
                key = str(event_id)
                if key in seen or (rec[1].resent and key in stored):
                    continue
                seen.add(key)
            out.append(rec)
        return out

    async def write(self, records: Sequence[Record], *, now: datetime) -> int:
        """Write the records not yet stored; return how many rows were inserted."""
        return await self.write_unseen(await self.unseen(records), now=now)

    async def write_unseen(self, fresh: Sequence[Record], *, now: datetime) -> int:
        """Write records that :meth:`unseen` returned; return how many rows were inserted."""
        return await self.insert(self.prepare(fresh, now=now))

    def prepare(self, fresh: Sequence[Record], *, now: datetime) -> list[Insert]:
        """The inserts of records that :meth:`unseen` returned, encoded (the Python half of a
        write: a caller may encode the next batch while :meth:`insert` waits on the last)."""
        # one insert per table (v2 envelopes go to their staging table, v1 to the rows')
        by_table: dict[str, list[Record]] = defaultdict(list)
        for rec in fresh:
            by_table[LAYOUTS[type(rec[0])].table].append(rec)
        out: list[Insert] = []
        ingested_at = instant_json(now)
        for table, recs in by_table.items():
            layout = LAYOUTS[type(recs[0][0])]
            token = batch_token(table, recs)
            if layout.to_lines is not None:
                lines: list[bytes] = []
                rows = 0
                for value, at in recs:  # commands of three types share a table and a format
                    of_value = LAYOUTS[type(value)]
                    assert of_value.to_lines is not None
                    lines += of_value.to_lines(value, at, ingested_at)
                    rows += of_value.rows(value)
                out.append(Insert(layout, self._json_insert, lines, token, recs, rows))
            else:
                assert layout.to_row is not None
                to_row = layout.to_row
                data = [to_row(value, at, now) for value, at in recs]
                out.append(Insert(layout, self._row_insert, data, token, recs, len(data)))
        return out

    async def insert(self, inserts: Sequence[Insert]) -> int:
        """Run :meth:`prepare`'s inserts in order; return how many rows were inserted."""
        written = 0
        for one in inserts:
            await self._insert(one.layout, one.run, one.data, one.token)
            self.marks.advance(one.layout.rows_table, one.records)
            self.metrics.rows.labels(one.layout.rows_table).inc(one.rows)
            written += one.rows
        return written

    def _json_insert(self, layout: TableLayout, lines: list[bytes], token: str) -> None:
        self.store.insert_json_lines(
            layout.table,
            lines,
            token=token,
            settings=layout.json_settings,
            fmt=layout.json_format,
            columns=layout.columns if layout.compact else None,
        )

    def _row_insert(self, layout: TableLayout, rows: list[Any], token: str) -> None:
        self.store.insert(layout.table, rows, layout.columns, token=token)

    async def _insert(
        self,
        layout: TableLayout,
        insert: Callable[[TableLayout, list[Any], str], None],
        data: list[Any],
        token: str,
    ) -> None:
        for attempt in range(1, self.max_attempts + 1):
            started = time.perf_counter()
            try:
                await self.store.run(insert, layout, data, token)
                elapsed = time.perf_counter() - started
                self.metrics.insert_seconds.labels(layout.table).observe(elapsed)
                return
            except Exception:
                if attempt == self.max_attempts:
                    raise
                self.metrics.retries.labels(layout.table).inc()
                await asyncio.sleep(self.retry_delay_s * 2 ** (attempt - 1))


def _sql_str(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def is_resent(headers: Iterable[tuple[str, bytes]] | dict[str, bytes] | None) -> bool:
    """Whether a record's headers (pairs, or a mapping) mark it sent again from a spool."""
    if not headers:  # most records: nothing to look through
        return False
    if isinstance(headers, dict):
        return RESENT_HEADER in headers
    return any(name == RESENT_HEADER for name, _ in headers or ())
