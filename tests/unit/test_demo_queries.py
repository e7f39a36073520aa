"""The demo's own tables, against the real ClickHouse engine (embedded chDB)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from prometheus_client import CollectorRegistry

from fleetloop.demo import COLD_SQL
from schemas.events import Demand, ServingMetrics
from streams.clickhouse_store import ClickHouseStore
from streams.rows import Coordinates
from streams.sink import ClickHouseSink
from tests.factories import fleet_events, ingest_now


def test_the_warming_table_shows_baseline_served_apart_from_lent_out_work(
    store: ClickHouseStore,
) -> None:
    """A replica's ``requests`` count the optional and batch work the capacity controller
    lent it too: the demo's warming table puts its demand's requests beside what was served
    of them, and the lent-out work in a column of its own (served was 4 to 7 times the
    demand when the two were one number)."""
    db = store.on_database("demo_queries")
    db.apply_schema()
    events = fleet_events(3000)
    model = Counter(v.model for _, v in events if isinstance(v, Demand)).most_common(1)[0][0]
    records: list[tuple[Any, Coordinates]] = []
    baseline = lent = demanded = 0
    for i, (spec, value) in enumerate(events):
        if isinstance(value, ServingMetrics) and value.model == model:
            value = value.model_copy(
                update={"requests": 10, "optional_requests": 4, "batch_requests": 2}
            )
            baseline, lent = baseline + 4, lent + 6
        elif isinstance(value, Demand) and value.model == model:
            demanded += value.requests
        records.append((value, Coordinates("demo." + spec.name, 0, i)))
    assert baseline and demanded
    sink = ClickHouseSink(db, registry=CollectorRegistry())
    asyncio.run(sink.write(records, now=ingest_now()))
    since = "toDateTime64('2000-01-01 00:00:00', 3, 'UTC')"  # every row this test wrote
    result = db.query(COLD_SQL.format(db="demo_queries", since=since, model=model))
    assert list(result.columns) == ["t", "demanded", "served", "optional+batch", "replicas"]
    rows = result.rows
    assert sum(r[1] for r in rows) == demanded
    assert (sum(r[2] for r in rows), sum(r[3] for r in rows)) == (baseline, lent)
