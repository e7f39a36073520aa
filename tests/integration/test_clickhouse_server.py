"""The same store, sink and `fleetloop sql` code path against a ClickHouse server."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from prometheus_client import CollectorRegistry

from fleetloop.settings import ConnectionSettings
from fleetloop.sqlclient import run_query
from streams.clickhouse_store import open_store
from streams.rows import Coordinates
from streams.sink import ClickHouseSink
from tests.factories import fleet_events, ingest_now

pytestmark = pytest.mark.integration


def test_sink_and_sql_against_a_server(clickhouse_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    database = f"fl_{uuid.uuid4().hex[:8]}"
    store = open_store(url=clickhouse_url, data_dir=tmp_path, database=database)
    try:
        store.apply_schema()
        records = [
            (v, Coordinates("s." + s.name, 0, i)) for i, (s, v) in enumerate(fleet_events(2000))
        ]
        assert (
            asyncio.run(
                ClickHouseSink(store, registry=CollectorRegistry()).write(records, now=ingest_now())
            )
            == 2000
        )
        again = ClickHouseSink(store, registry=CollectorRegistry())
        assert asyncio.run(again.write(records, now=ingest_now())) == 0
        settings = ConnectionSettings(clickhouse_url=clickhouse_url, clickhouse_database=database)
        result = run_query(settings, f"SELECT count() FROM {database}.accelerator_telemetry")
        assert result.rows[0][0] == sum(
            1 for v, _ in records if type(v).__name__ == "AcceleratorTelemetry"
        )
    finally:
        store.command(f"DROP DATABASE IF EXISTS {database}")
        store.close()
