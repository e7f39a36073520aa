"""The Grafana dashboards, read from their JSON and rendered without Grafana.

``infra/grafana/dashboards/*.json`` is the one definition: docker-compose
provisions it into Grafana, and the process that owns the embedded ClickHouse
renders the same panels at ``/dashboards`` (SVG charts for time series, tables
for tables), live. Panel SQL uses the ClickHouse plugin's macros, which are
expanded here the way the plugin expands them:

- ``${database}``: the dashboard's constant variable (the ClickHouse database);
- ``$__timeFilter(column)``: ``column`` within the time range;
- ``$__fromTime`` / ``$__toTime``: the range's ends.

Without Grafana's time picker the range is the hour before the newest
heartbeat stored, so simulated and replayed data show like live data.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html import escape
from pathlib import Path
from typing import Any

from sre.charts import Point, line_chart
from sre.report import STYLE, as_utc, html_table
from sre.results import QueryResult

DASHBOARDS_DIR = Path(__file__).resolve().parents[1] / "infra" / "grafana" / "dashboards"
_TIME_FILTER = re.compile(r"\$__timeFilter\(([^()]+)\)")
NEWEST_SQL = "SELECT max(observed_at) FROM {db}.node_health"
Query = Callable[[str], QueryResult]


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    kind: str  # "timeseries" or "table"
    sql: str
    description: str
    unit: str | None


@dataclass(frozen=True, slots=True)
class Dashboard:
    uid: str
    title: str
    panels: tuple[Panel, ...]


def load_dashboards(directory: Path = DASHBOARDS_DIR) -> list[Dashboard]:
    out = []
    for path in sorted(directory.glob("*.json")):
        doc: dict[str, Any] = json.loads(path.read_text())
        panels = []
        for p in doc.get("panels", []):
            for target in p.get("targets", []):
                unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit")
                panels.append(
                    Panel(p["title"], p["type"], target["rawSql"], p.get("description", ""), unit)
                )
        out.append(Dashboard(doc["uid"], doc["title"], tuple(panels)))
    return out


def _instant(at: datetime) -> str:
    return f"toDateTime64('{at.astimezone(UTC):%Y-%m-%d %H:%M:%S.%f}', 6, 'UTC')"


def expand(sql: str, *, database: str, start: datetime, end: datetime) -> str:
    """The panel's SQL with the plugin's macros expanded."""
    lo, hi = _instant(start), _instant(end)
    sql = sql.replace("${database}", database).replace("$__fromTime", lo).replace("$__toTime", hi)
    return _TIME_FILTER.sub(lambda m: f"({m.group(1)} >= {lo} AND {m.group(1)} <= {hi})", sql)


def time_range(query: Query, *, database: str, span: timedelta) -> tuple[datetime, datetime]:
    rows = query(NEWEST_SQL.format(db=database)).rows
    newest = rows[0][0] if rows and rows[0][0] is not None else None
    end = datetime.now(UTC)
    if isinstance(newest, datetime) and newest.year > 1970:
        end = as_utc(newest)
    return end - span, end + timedelta(minutes=1)


def _series(result: QueryResult) -> dict[str, list[Point]]:
    """Long (time, series, value) or wide (time, value, ...) results as named series."""
    out: dict[str, list[Point]] = {}
    cols = result.columns
    for row in result.rows:
        at = as_utc(row[0])
        if len(cols) == 3 and isinstance(row[1], str):
            value = None if row[2] is None else float(row[2])
            out.setdefault(row[1], []).append((at, value))
        else:
            for name, v in zip(cols[1:], row[1:], strict=True):
                out.setdefault(name, []).append((at, None if v is None else float(v)))
    return out


def render_panel(panel: Panel, result: QueryResult) -> str:
    if panel.kind == "timeseries":
        return line_chart(panel.title, _series(result), y_label=panel.unit or "")
    return html_table(result)


def render_page(
    query: Query,
    *,
    database: str,
    dashboards: Sequence[Dashboard] | None = None,
    refresh_s: int = 10,
) -> str:
    """Every dashboard (read from disk unless given), every panel, run now; a failing panel
    shows its error."""
    start, end = time_range(query, database=database, span=timedelta(hours=1))
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<meta http-equiv='refresh' content='{refresh_s}'><title>fleetloop dashboards</title>"
        f"<style>{STYLE}</style></head><body>",
        f"<p>data from {start:%Y-%m-%d %H:%M:%S} to {end:%H:%M:%S} UTC, "
        f"refreshed every {refresh_s} s; read-only</p>",
    ]
    for dash in load_dashboards() if dashboards is None else dashboards:
        parts.append(f"<h1>{escape(dash.title)}</h1>")
        for panel in dash.panels:
            parts.append(
                f"<section class='panel'><h2>{escape(panel.title)}</h2>"
                f"<p class='q'>{escape(panel.description)}</p>"
            )
            try:
                result = query(expand(panel.sql, database=database, start=start, end=end))
                parts.append(render_panel(panel, result))
            except Exception as exc:  # one broken panel must not blank the page
                parts.append(
                    f"<p class='err'>{escape(type(exc).__name__)}: {escape(str(exc))[:300]}</p>"
                )
            parts.append("</section>")
    parts.append("</body></html>")
    return "".join(parts)
