"""What a query answers: the one type the read side and the store share.

The SRE read side (questions, reports, dashboards) is built from a query
function ``sql -> QueryResult``; the store, the HTTP client and a test's
seeded ClickHouse all give one, so nothing here needs a ClickHouse driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class QueryResult:
    """Column names and rows of one query."""

    def __init__(self, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self.columns = list(columns)
        self.rows = [list(r) for r in rows]
