"""The sink against the real ClickHouse engine (embedded chDB, a temp data dir)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agents.envelopes import pack
from schemas.base import Contract
from schemas.commands import (
    CommandResult,
    ResultStatus,
    RouteAction,
    RouteCommand,
    Target,
    ThrottleAction,
    ThrottleCommand,
    WarmAction,
    WarmCommand,
)
from schemas.topics import TELEMETRY_TOPICS
from streams.clickhouse_store import READER_THREADS, ClickHouseStore, StatementError
from streams.ingest import RawMessage, split
from streams.rows import JSON_INSERT_SETTINGS, LAYOUTS, Coordinates, instant_json
from streams.sink import ClickHouseSink, Watermarks, batch_token, combined
from tests.factories import START, fleet_events, ingest_now, malformed_payloads, signed_command


def _records(count: int, topic_prefix: str) -> list[tuple[Contract, Coordinates]]:
    offsets: dict[str, int] = {}
    out = []
    for spec, value in fleet_events(count):
        topic = topic_prefix + spec.name
        offsets[topic] = offsets.get(topic, -1) + 1
        out.append((value, Coordinates(topic, 0, offsets[topic])))
    return out


def _count(store: ClickHouseStore, table: str, prefix: str) -> int:
    col = "source_topic" if table == "dead_letters" else "src_topic"
    sql = f"SELECT count() FROM {store.database}.{table} WHERE startsWith({col}, '{prefix}')"
    return int(store.query(sql).rows[0][0])


TELEMETRY_TABLES = sorted({spec.table for spec in TELEMETRY_TOPICS})


def _total(store: ClickHouseStore, prefix: str) -> int:
    return sum(_count(store, table, prefix) for table in TELEMETRY_TABLES)


def test_table_columns_match_the_ddl(store: ClickHouseStore) -> None:
    for layout in LAYOUTS.values():
        described = store.query(f"DESCRIBE TABLE {store.database}.{layout.table}")
        assert tuple(row[0] for row in described.rows) == layout.columns, layout.table


def test_write_is_idempotent_across_retries_and_restarts(store: ClickHouseStore) -> None:
    records = _records(3000, "a.")
    sink = ClickHouseSink(store, registry=CollectorRegistry())
    assert asyncio.run(sink.write(records[:2000], now=ingest_now())) == 2000
    assert asyncio.run(sink.write(records[:2000], now=ingest_now())) == 0  # same process, replay
    restarted = ClickHouseSink(store, registry=CollectorRegistry())  # marks come from ClickHouse
    assert asyncio.run(restarted.write(records, now=ingest_now())) == 1000
    assert _total(store, "a.") == 3000
    ids = store.query(
        f"SELECT uniqExact(event_id) FROM {store.database}.accelerator_telemetry "
        "WHERE startsWith(src_topic, 'a.')"
    ).rows[0][0]
    assert ids == _count(store, "accelerator_telemetry", "a.")


def test_copies_sent_again_from_a_spool_are_stored_once(store: ClickHouseStore) -> None:
    """An agent resends from its spool what the broker may already hold (its ack was lost):
    those copies arrive at new offsets with the resent header; each event lands once."""
    records = _records(600, "copies.")
    sink = ClickHouseSink(store, registry=CollectorRegistry())
    assert asyncio.run(sink.write(records[:400], now=ingest_now())) == 400
    last = {r[1].topic: r[1].offset for r in records}

    def again(value: Contract, topic: str) -> tuple[Contract, Coordinates]:
        last[topic] += 1
        return value, Coordinates(topic, 0, last[topic], resent=True)

    resent = [again(v, at.topic) for v, at in records[300:600]]  # 100 stored, 200 never were
    batch = [*resent, *(again(v, at.topic) for v, at in resent[-50:])]  # a copy of a copy
    assert asyncio.run(sink.write(batch, now=ingest_now())) == 200
    assert _total(store, "copies.") == 600
    for table in TELEMETRY_TABLES:
        count, unique = store.query(
            f"SELECT count(), uniqExact(event_id) FROM {store.database}.{table} "
            "WHERE startsWith(src_topic, 'copies.')"
        ).rows[0]
        assert count == unique, table
    dropped = sum(sink.metrics.copies.labels(table)._value.get() for table in TELEMETRY_TABLES)
    assert dropped == 150


def test_batches_that_wait_together_go_in_as_one_insert_per_table(
    store: ClickHouseStore,
) -> None:
    """The ingest loop's group commit: batches prepared while a write ran are written as
    if they had been one batch (the same lines, rows and token), so they land once, and a
    retry of the combined write adds nothing."""
    offsets: dict[str, int] = {}
    records: list[tuple[Any, Coordinates]] = []
    for spec, value in [*pack(fleet_events(1200)), *fleet_events(300)]:  # v2 and v1
        topic = "together." + spec.name
        offsets[topic] = offsets.get(topic, -1) + 1
        records.append((value, Coordinates(topic, 0, offsets[topic])))
    sink = ClickHouseSink(store, registry=CollectorRegistry())
    now = ingest_now()
    thirds = [records[:200], records[200:500], records[500:]]
    together = combined([sink.prepare(batch, now=now) for batch in thirds])
    at_once = sink.prepare(records, now=now)
    assert len(together) == len({one.layout.table for one in together}) == len(at_once) > 2
    for mine, theirs in zip(together, at_once, strict=True):
        assert (mine.layout, mine.data, mine.token, mine.records, mine.rows) == (
            theirs.layout, theirs.data, theirs.token, theirs.records, theirs.rows
        )  # fmt: skip
    rows = sum(LAYOUTS[type(value)].rows(value) for value, _ in records)
    assert asyncio.run(sink.insert(together)) == rows
    for one in together:  # a retry, as the sink's own after a timeout: the same tokens
        one.run(one.layout, one.data, one.token)
    assert _total(store, "together.") == rows


def test_a_batch_whose_valid_instants_span_years_lands_whole(store: ClickHouseStore) -> None:
    """A broken clock on an agent: valid events whose instants span more than 100 months in
    one batch (the per-minute rollups are partitioned by month). ClickHouse refuses an insert
    into over 100 partitions by default, and a batch refused for good stalls the ingest."""
    records = _records(1200, "months.")
    spread = [  # 200 months back from START, within the contract's instants (from 1970)
        (value.model_copy(update={"observed_at": START - timedelta(days=31 * (k % 200))}), at)
        for k, (value, at) in enumerate(records)
    ]
    sink = ClickHouseSink(store, registry=CollectorRegistry())
    assert asyncio.run(sink.write(spread, now=ingest_now())) == len(spread)
    months = store.query(
        f"SELECT uniqExact(toYYYYMM(observed_at)) FROM {store.database}.accelerator_telemetry "
        "WHERE startsWith(src_topic, 'months.')"
    ).rows[0][0]
    assert months > 100


def test_retried_insert_with_same_token_adds_nothing(store: ClickHouseStore) -> None:
    records = [r for r in _records(400, "b.") if type(r[0]).__name__ == "AcceleratorTelemetry"]
    layout = LAYOUTS[type(records[0][0])]
    assert layout.to_lines is not None
    lines = [
        line for v, at in records for line in layout.to_lines(v, at, instant_json(ingest_now()))
    ]
    token = batch_token(layout.table, records)
    for _ in range(2):
        store.insert_json_lines(layout.table, lines, token=token, settings=JSON_INSERT_SETTINGS)
    assert _count(store, layout.table, "b.") == len(records)


def test_events_land_with_nulls_enums_probes_and_utc_instants(store: ClickHouseStore) -> None:
    records = _records(2000, "e.")
    asyncio.run(
        ClickHouseSink(store, registry=CollectorRegistry()).write(records, now=ingest_now())
    )
    db = store.database
    mtia = store.query(
        f"SELECT memory_temp_celsius, xid_last, accelerator_type, toString(observed_at) "
        f"FROM {db}.accelerator_telemetry WHERE src_topic LIKE 'e.%' "
        "AND accelerator_type = 'MTIA' LIMIT 1"
    ).rows[0]
    assert mtia[:3] == [None, None, "MTIA"]
    first_step = START + timedelta(seconds=1)  # the end of the first step after START, UTC
    assert mtia[3] == first_step.strftime("%Y-%m-%d %H:%M:%S.000")
    probes = store.query(
        f"SELECT length(probes), probes.probe[1], probes.passed[1] FROM {db}.node_health "
        "WHERE src_topic LIKE 'e.%' AND heartbeat_seq = 1 LIMIT 1"
    ).rows[0]
    assert probes == [8, "gemm", True]


def test_a_field_without_a_column_is_an_error_not_a_silent_loss(store: ClickHouseStore) -> None:
    records = [r for r in _records(500, "f.") if type(r[0]).__name__ == "Demand"]
    layout = LAYOUTS[type(records[0][0])]
    assert layout.to_lines is not None
    (line,) = layout.to_lines(records[0][0], records[0][1], instant_json(ingest_now()))
    with pytest.raises(Exception, match=r"surprise|Unknown field"):
        store.insert_json_lines(
            layout.table, [line[:-1] + b',"surprise":1}'], token="f1", settings=JSON_INSERT_SETTINGS
        )


def test_dead_letters_have_their_own_watermarks(store: ClickHouseStore) -> None:
    bad = malformed_payloads(10)
    messages = [
        RawMessage(Coordinates("c." + spec.name, 0, 50 + i), None, raw)
        for i, (spec, raw, _) in enumerate(bad)
    ]
    letters = []
    for spec in TELEMETRY_TOPICS:
        mine = [m for m in messages if m.at.topic == "c." + spec.name]
        letters.extend(split(mine, spec.value_type, now=START).dead)
    sink = ClickHouseSink(store, registry=CollectorRegistry())
    valid_later = [
        (v, Coordinates("c." + s.name, 0, 900 + i)) for i, (s, v) in enumerate(fleet_events(5))
    ]
    asyncio.run(sink.write(valid_later, now=ingest_now()))  # events table is ahead of dead letters
    assert asyncio.run(sink.write(letters, now=ingest_now())) == 10
    assert _count(store, "dead_letters", "c.") == 10
    raw = store.query(
        f"SELECT raw FROM {store.database}.dead_letters WHERE source_topic = "
        f"'c.{bad[0][0].name}' ORDER BY source_offset LIMIT 1"
    )
    assert raw.rows


def test_watermarks_forget_moved_partitions() -> None:
    marks = Watermarks({("t", "x", 0): 10, ("t", "x", 1): 5, ("u", "x", 0): 3})
    marks.forget([("x", 0)])
    assert marks.marks == {("t", "x", 1): 5}


def test_batch_token_depends_on_offsets_only_not_order() -> None:
    recs = _records(50, "d.")
    acc = [r for r in recs if r[1].topic.endswith("accelerator.v1")]
    assert batch_token("t", acc) == batch_token("t", list(reversed(acc)))
    assert batch_token("t", acc) != batch_token("t", acc[:-1])
    assert batch_token("t", acc) != batch_token("u", acc)


def test_second_process_cannot_open_an_owned_data_dir(store: ClickHouseStore) -> None:
    code = (
        "import sys; from pathlib import Path; from streams.clickhouse_store import *\n"
        "try:\n    open_store(url=None, data_dir=Path(sys.argv[1]), database='x')\n"
        "except StoreLockedError as e:\n    print('LOCKED', e); sys.exit(0)\n"
        "print('OPENED'); sys.exit(1)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(store.data_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "owned by another process" in proc.stdout


def test_the_owning_process_can_open_more_handles(store: ClickHouseStore) -> None:
    from streams.clickhouse_store import open_store

    assert store.data_dir is not None
    second = open_store(url=None, data_dir=store.data_dir, database=store.database)
    assert second.query("SELECT 1").rows == [[1]]


def test_a_batch_lands_in_one_partition_even_across_midnight(store: ClickHouseStore) -> None:
    # One partition per insert means one part: all-or-nothing, which the watermarks rely on.
    base = [r for r in _records(3000, "g.") if type(r[0]).__name__ == "AcceleratorTelemetry"]
    late = START.replace(hour=23, minute=59, second=59)
    records = [
        (v.model_copy(update={"observed_at": late + timedelta(seconds=i % 3)}), at)
        for i, (v, at) in enumerate(base)
    ]
    asyncio.run(
        ClickHouseSink(store, registry=CollectorRegistry()).write(records, now=ingest_now())
    )
    days, partitions = store.query(
        f"SELECT uniqExact(toDate(observed_at)), uniqExact(_partition_id) "
        f"FROM {store.database}.accelerator_telemetry WHERE src_topic LIKE 'g.%'"
    ).rows[0]
    assert (days, partitions) == (2, 1)


def test_a_refused_read_only_statement_does_not_stop_the_sink(store: ClickHouseStore) -> None:
    # chDB leaves a session read-only after a refused statement; /sql must not share the
    # sink's session (this stopped a worker once: its next insert was refused).
    with pytest.raises(Exception, match=r"(?i)readonly"):
        store.query(f"TRUNCATE TABLE {store.database}.demand", readonly=True)
    assert store.query(f"SELECT count() > -1 FROM {store.database}.demand", readonly=True).rows
    records = [r for r in _records(400, "h.") if type(r[0]).__name__ == "Demand"]
    assert asyncio.run(
        ClickHouseSink(store, registry=CollectorRegistry()).write(records, now=ingest_now())
    ) == len(records)


def test_read_only_queries_are_bounded(store: ClickHouseStore) -> None:
    assert store.query("SELECT count() FROM numbers(200000)", readonly=True).rows == [[200000]]
    with pytest.raises(Exception, match=r"(?i)limit for result exceeded"):
        store.query("SELECT number FROM numbers(200000)", readonly=True)


def test_commands_of_every_type_and_their_results_land_in_their_tables(
    store: ClickHouseStore,
) -> None:
    drain = signed_command(
        RouteCommand,
        issued_at=START,
        action=RouteAction.DRAIN,
        target=Target(device_uuid="node-00001-gpu2"),
    )
    cap = signed_command(
        ThrottleCommand,
        issued_at=START,
        action=ThrottleAction.POWER_CAP,
        target=Target(node_id="node-00001"),
        power_limit_watts=450.0,
    )
    warm = signed_command(
        WarmCommand,
        issued_at=START,
        action=WarmAction.WARM,
        model="gemma-27b",
        target=Target(pool="us-east-h100"),
        replicas=2,
    )
    result = CommandResult(
        result_id=uuid.uuid4(),
        command_id=drain.command_id,
        command_type="RouteCommand",
        executor="node-executor",
        status=ResultStatus.APPLIED,
        detail="drained",
        received_at=START,
        completed_at=START,
    )
    records: list[tuple[Contract, Coordinates]] = [
        (drain, Coordinates("c.commands.route.v1", 0, 0)),
        (cap, Coordinates("c.commands.throttle.v1", 0, 0)),
        (warm, Coordinates("c.commands.warm.v1", 0, 0)),
        (result, Coordinates("c.commands.results.v1", 0, 0)),
    ]
    asyncio.run(
        ClickHouseSink(store, registry=CollectorRegistry()).write(records, now=ingest_now())
    )
    db = store.database
    rows = store.query(
        f"SELECT command_type, action, target_device_uuid, target_node_id, target_pool, "
        f"JSONExtractRaw(parameters, 'power_limit_watts'), JSONExtractString(parameters, 'model'),"
        f" signature = '{drain.signature}' FROM {db}.commands WHERE src_topic LIKE 'c.%' "
        "ORDER BY command_type"
    ).rows
    assert rows == [
        ["RouteCommand", "drain", "node-00001-gpu2", None, None, "", "", True],
        ["ThrottleCommand", "power_cap", None, "node-00001", None, "450", "", False],
        ["WarmCommand", "warm", None, None, "us-east-h100", "", "gemma-27b", False],
    ]
    stored = store.query(
        f"SELECT toString(command_id), executor, status FROM {db}.command_results "
        "WHERE src_topic LIKE 'c.%'"
    ).rows
    assert stored == [[str(drain.command_id), "node-executor", "applied"]]


def test_anyones_sql_is_one_statement_on_a_fresh_session(store: ClickHouseStore) -> None:
    with pytest.raises(StatementError, match="one statement"):
        store.query("SELECT 1; SELECT 2", readonly=True)
    assert store.query("SELECT 'a;b' AS x;", readonly=True).rows == [["a;b"]]
    # a setting one caller changes (where readonly allows none) cannot reach the next
    with pytest.raises(Exception, match=r"(?i)readonly"):
        store.query("SET max_result_rows = 0", readonly=True)
    with pytest.raises(Exception, match=r"(?i)limit for result exceeded"):
        store.query("SELECT number FROM numbers(200000)", readonly=True)


def test_a_slow_read_never_holds_up_the_sink(store: ClickHouseStore) -> None:
    # every reader thread busy (a stand-in for slow queries, released by the test): the
    # sink's write still goes through, on its own thread and session
    records = [r for r in _records(400, "s.") if type(r[0]).__name__ == "Demand"]
    release = threading.Event()

    async def both() -> tuple[bool, int]:
        busy = [
            asyncio.ensure_future(store.run_reader(release.wait, 60)) for _ in range(READER_THREADS)
        ]
        queued = asyncio.ensure_future(store.run_reader(store.query, "SELECT 1", readonly=True))
        written = await ClickHouseSink(store, registry=CollectorRegistry()).write(
            records, now=ingest_now()
        )
        readers_still_busy = not queued.done()
        release.set()
        await asyncio.gather(*busy, queued)
        return readers_still_busy, written

    readers_still_busy, written = asyncio.run(both())
    assert written == len(records) and readers_still_busy
