"""Shared fixtures.

Embedded chDB allows one data directory per process, so the whole session
shares one embedded store (each test uses its own topic names inside it).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from streams.clickhouse_store import ClickHouseStore, open_store


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseStore]:
    s = open_store(url=None, data_dir=tmp_path_factory.mktemp("chdb"), database="fl_test")
    s.apply_schema()
    yield s
    s.close()
