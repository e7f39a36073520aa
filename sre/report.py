"""The SRE report: every question's answer as a table, plus charts, as one HTML page.

Sections in the order an SRE reads (:data:`SECTIONS`): the fleet now, what was
isolated and why, commands and results, capacity and power, demand and warming,
dead letters; each chart sits in its section. Cells are formatted for people
(short numbers, instants to the second, maps as ``key=value``), and a wide table
scrolls in its own box, so the page fits 1400 px.

Built from a query function (``sql -> QueryResult``), so the same page comes
from `fleetloop report` (any ClickHouse) and, live, from the process that owns
the embedded data.

Charts:
- the most recently isolated device (or the one asked for): utilisation, power
  and temperature per minute, with its health verdicts and every command that
  targeted it on the same time axis;
- demand per model against what was served (forecasts join this chart when the
  demand forecaster writes them);
- latency per pool (p95 TPOT, request-weighted per minute) with the commands
  sent to the fleet as markers;
- controller output against latency: each busiest pool's optional-work budget
  (the capacity controller's output) beside its TPOT p95 over the SLO, per
  minute (the ``capacity_control`` question), with batch and power actions as
  markers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape
from typing import Any

from sre.charts import Point, fmt_number, line_chart
from sre.questions import Question, literal, load_questions
from sre.results import QueryResult

Query = Callable[[str], QueryResult]
Chart = tuple[str, str]  # the section it belongs to, its HTML

SECTIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # in the order an SRE reads: now, what we took out, what we told the fleet, ...
    ("now", "Fleet now", ("fleet_health_now", "silent_nodes", "slo_attainment")),
    ("isolated", "What was isolated, and why", ("devices_by_verdict", "device_timeline")),
    ("commands", "Commands and results",
     ("commands_by_outcome", "command_latency", "decisions_by_reason")),
    ("control", "Capacity and power",
     ("capacity_control", "power_headroom", "batch_moves", "power_routing")),
    ("demand", "Demand and warming", ("cold_starts", "forecast_error")),
    ("dead", "Dead letters", ("dead_letters",)),
)  # fmt: skip
"""Sections of the report; a question no section names goes under "Other questions"."""

ISOLATED_SQL = """
SELECT c.target_device_uuid FROM {db}.commands AS c
INNER JOIN {db}.command_results AS r ON r.command_id = c.command_id
WHERE r.status = 'applied' AND c.action IN ('quarantine', 'drain', 'stop_new_sessions', 'deweight')
  AND c.target_device_uuid IS NOT NULL
ORDER BY r.completed_at DESC LIMIT 1
"""
DEVICE_SQL = """
SELECT minute, sum(util_sum) / greatest(sum(util_n), 1),
       sum(power_sum_watts) / greatest(sum(power_n), 1), max(temp_max_celsius)
FROM {db}.device_1m WHERE device_uuid = {device} GROUP BY minute ORDER BY minute
"""
DEVICE_ACTIONS_SQL = """
SELECT at, label FROM (
    SELECT c.issued_at AS at, concat(c.action, ' (', c.reason, ')') AS label
    FROM {db}.commands AS c WHERE c.target_device_uuid = {device}
    ORDER BY c.issued_at LIMIT 1 BY c.command_id
    UNION ALL
    SELECT v.observed_at AS at, concat('verdict ', v.status) AS label
    FROM {db}.verdicts AS v WHERE v.device_uuid = {device}
    ORDER BY v.observed_at LIMIT 1 BY v.verdict_id
) ORDER BY at
"""
DEMAND_SQL = """
SELECT d.minute, d.model, d.requests, s.served
FROM (SELECT minute, model, sum(requests) AS requests FROM {db}.demand_1m
      GROUP BY minute, model) AS d
LEFT JOIN (SELECT minute, model, sum(requests) AS served FROM {db}.pool_1m
           GROUP BY minute, model) AS s
ON s.minute = d.minute AND s.model = d.model
ORDER BY d.minute
"""
LATENCY_SQL = """
SELECT minute, pool, sum(tpot_p95_weighted_sum_s) / greatest(sum(requests), 1)
FROM {db}.pool_1m GROUP BY minute, pool ORDER BY minute
"""
_BUSIEST_DEMAND = """(model, region) IN (SELECT model, region FROM {db}.forecasts
                      GROUP BY model, region ORDER BY sum(observed_rps) DESC LIMIT 2)"""
FORECAST_SQL = f"""
SELECT target_at, model, point_rps, high_rps FROM {{db}}.forecasts
WHERE horizon_s = (SELECT min(horizon_s) FROM {{db}}.forecasts) AND {_BUSIEST_DEMAND}
ORDER BY target_at
"""
ACTUAL_SQL = f"""
SELECT made_at, model, any(observed_rps) FROM {{db}}.forecasts
WHERE {_BUSIEST_DEMAND} GROUP BY made_at, model, region ORDER BY made_at
"""
WARM_SQL = """
SELECT decided_at, concat(action, ' ', target, ' x', toString(abs(toInt64(applied))))
FROM {db}.decisions WHERE controller = 'warming' AND outcome != 'refused'
ORDER BY decided_at LIMIT 40
"""
CONTROL_ACTIONS_SQL = """
SELECT decided_at, concat(controller, ': ', action, ' ', target)
FROM {db}.decisions WHERE controller IN ('tpot_guard', 'power')
ORDER BY decided_at LIMIT 1 BY controller, target LIMIT 20
"""
ACTIONS_SQL = """
SELECT issued_at, concat(action, ' ', coalesce(target_device_uuid, target_node_id, target_pool, ''))
FROM {db}.commands ORDER BY issued_at LIMIT 1 BY command_id LIMIT 40
"""

STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;padding:20px 28px;color:#222;
  max-width:1320px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:20px;margin:36px 0 6px;padding-top:10px;
  border-top:2px solid #e4e4e4}h3{font-size:16px;margin:22px 0 2px}
p.q{color:#555;margin:2px 0 8px}nav a{margin-right:14px}
div.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;font:13px ui-monospace,monospace}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top;
  white-space:nowrap}td.w{white-space:normal;min-width:18em;max-width:40em;
  overflow-wrap:break-word}
th{background:#f4f4f4}td.n{text-align:right;white-space:nowrap}
figure.chart{margin:10px 0 18px;max-width:1000px}
svg.chart{width:100%;height:auto;background:#fff;border:1px solid #e6e6e6}
svg .title{font-weight:600;font-size:15px}svg .frame{fill:none;stroke:#bbb}
svg .grid{stroke:#eee}svg .ytick{font-size:12px;text-anchor:end;fill:#444}
svg .xtick{font-size:12px;text-anchor:middle;fill:#444}
svg .ylabel{font-size:12px;text-anchor:middle;fill:#444}
svg .line{fill:none;stroke-width:2}svg .marker{stroke:#777;stroke-dasharray:3 3}
svg .badge{fill:#fff;stroke:#777}svg .badge-n{font-size:10px;text-anchor:middle;fill:#333}
figcaption{font-size:13px;color:#333}.legend{display:flex;flex-wrap:wrap;gap:4px 16px}
.key{display:inline-flex;align-items:center;gap:6px}
ol.markers{margin:6px 0 0;padding-left:28px;columns:2;column-gap:28px}
.note{color:#666;font-size:12px}.err{color:#b00}
"""


@dataclass(frozen=True, slots=True)
class Answer:
    question: Question
    result: QueryResult | None
    error: str | None = None


def answer_all(
    query: Query, *, database: str, values: Mapping[str, Mapping[str, str]] | None = None
) -> list[Answer]:
    """Every question with its answer; a question that needs a parameter nobody gave is skipped
    with a note, and a failing one carries its error instead of stopping the report."""
    out = []
    for q in load_questions().values():
        given = dict((values or {}).get(q.name, {}))
        if any(p.default is None and p.name not in given for p in q.parameters):
            missing = [p.name for p in q.parameters if p.default is None and p.name not in given]
            out.append(Answer(q, None, f"needs {', '.join(missing)}"))
            continue
        try:
            out.append(Answer(q, query(q.render(database=database, values=given))))
        except Exception as exc:  # one broken question must not hide the others
            out.append(Answer(q, None, f"{type(exc).__name__}: {exc}"[:500]))
    return out


def isolated_device(query: Query, *, database: str) -> str | None:
    rows = query(ISOLATED_SQL.format(db=database)).rows
    return str(rows[0][0]) if rows else None


def as_utc(value: Any) -> datetime:
    """A ClickHouse instant (naive means UTC, or an ISO string) as an aware datetime."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(str(value)).replace(tzinfo=UTC)


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


def charts(query: Query, *, database: str, device: str | None) -> list[Chart]:
    """Every chart, with the report section it belongs to."""
    db = database
    out: list[Chart] = []
    if device:
        quoted = literal("String", device)
        rows = query(DEVICE_SQL.format(db=db, device=quoted)).rows
        marks = [
            (as_utc(t), str(label))
            for t, label in query(DEVICE_ACTIONS_SQL.format(db=db, device=quoted)).rows
        ]
        peak_w = max((_num(r[2]) or 0.0 for r in rows), default=1.0) or 1.0
        peak_c = max((_num(r[3]) or 0.0 for r in rows), default=1.0) or 1.0
        out.append((
            "isolated",
            line_chart(
                f"{device}: telemetry, verdicts and actions (power and temperature scaled to "
                "their peak)",
                {
                    "utilisation": [(as_utc(r[0]), _num(r[1])) for r in rows],
                    f"power / {peak_w:.0f} W": [
                        (as_utc(r[0]), (_num(r[2]) or 0) / peak_w) for r in rows
                    ],
                    f"temperature / {peak_c:.0f} C": [
                        (as_utc(r[0]), (_num(r[3]) or 0) / peak_c) for r in rows
                    ],
                },
                markers=marks,
                y_label="ratio",
                step_s=60,
            ),
        ))  # fmt: skip
    demand: dict[str, list[Point]] = {}
    for minute, model, requests, served in query(DEMAND_SQL.format(db=db)).rows:
        demand.setdefault(f"{model} demanded", []).append((as_utc(minute), _num(requests)))
        demand.setdefault(f"{model} served", []).append((as_utc(minute), _num(served)))
    title = "demand against served, requests per minute"
    out.append(("demand", line_chart(title, demand, y_label="requests", step_s=60)))
    forecast: dict[str, list[Point]] = {}
    for target_at, model, point, high in query(FORECAST_SQL.format(db=db)).rows:
        at = as_utc(target_at)
        forecast.setdefault(f"{model} forecast", []).append((at, _num(point)))
        forecast.setdefault(f"{model} band top", []).append((at, _num(high)))
    # what each forecast saw when it was made, from the first: the chart starts where the
    # warming decided on it did (a forecast's target is a horizon later)
    for made_at, model, actual in query(ACTUAL_SQL.format(db=db)).rows:
        forecast.setdefault(f"{model} actual", []).append((as_utc(made_at), _num(actual)))
    warms = [(as_utc(t), str(label)) for t, label in query(WARM_SQL.format(db=db)).rows]
    out.append((
        "demand",
        line_chart(
            "demand forecast (shortest horizon, with the band's top) against actual, and warming",
            forecast,
            markers=warms,
            y_label="requests/s",
        ),
    ))  # fmt: skip
    latency: dict[str, list[Point]] = {}
    for minute, pool, tpot in query(LATENCY_SQL.format(db=db)).rows:
        latency.setdefault(str(pool), []).append((as_utc(minute), _num(tpot)))
    marks = [(as_utc(t), str(label)) for t, label in query(ACTIONS_SQL.format(db=db)).rows]
    title = "latency per pool (p95 TPOT) and the commands sent"
    chart = line_chart(title, latency, markers=marks, y_label="seconds", step_s=60)
    out.append(("commands", chart))
    out.append(("control", _control_chart(query, database=db)))
    return out


def _control_chart(query: Query, *, database: str) -> str:
    """The capacity controller's output against the latency it steers by, busiest pools."""
    result = query(load_questions()["capacity_control"].render(database=database, values={}))
    rows = [dict(zip(result.columns, r, strict=True)) for r in result.rows]
    served: dict[str, float] = {}
    for r in rows:
        served[str(r["pool"])] = served.get(str(r["pool"]), 0.0) + float(r["requests"] or 0)
    busiest = sorted(served, key=lambda p: -served[p])[:3]
    series: dict[str, list[Point]] = {}
    for r in rows:
        pool = str(r["pool"])
        if pool in busiest:
            at = as_utc(r["minute"])
            series.setdefault(f"{pool} budget", []).append((at, _num(r["budget_ratio"])))
            series.setdefault(f"{pool} TPOT p95 / SLO", []).append(
                (at, _num(r["tpot_p95_over_slo"]))
            )
    marks = [
        (as_utc(t), str(label)) for t, label in query(CONTROL_ACTIONS_SQL.format(db=database)).rows
    ]
    return line_chart(
        "controller output against latency: optional-work budget and TPOT p95 over the SLO",
        series,
        markers=marks,
        y_label="ratio",
        step_s=60,
    )


def cell(value: Any) -> str:
    """One value as an SRE reads it: short numbers, instants to the second, no Python
    reprs (a map as ``key: value``, a list comma-separated), empty for NULL."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return fmt_number(value) if math.isfinite(value) else str(value)
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 100_000 else str(value)
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={cell(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ("; " if any(isinstance(v, Mapping) for v in value) else ", ").join(
            cell(v) for v in value
        )
    return str(value)


def html_table(result: QueryResult, limit: int = 200) -> str:
    """``result`` as an HTML table of at most ``limit`` rows ("no rows" when empty)."""
    if not result.rows:
        return "<p>no rows</p>"
    head = "".join(f"<th>{escape(str(c))}</th>" for c in result.columns)

    def td(value: Any) -> str:
        text = cell(value)
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        kind = " class=n" if numeric else " class=w" if len(text) > 40 else ""  # w: wraps
        return f"<td{kind}>{escape(text)}</td>"

    body = "".join("<tr>" + "".join(td(v) for v in row) + "</tr>" for row in result.rows[:limit])
    more = f"<p>{len(result.rows) - limit} more rows</p>" if len(result.rows) > limit else ""
    return f"<div class='scroll'><table><tr>{head}</tr>{body}</table></div>{more}"


def render_html(
    answers: list[Answer], chart_list: list[Chart], *, title: str, refresh_s: int = 0
) -> str:
    """The report: one section per concern, each with its charts, then its questions."""
    refresh = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else ""
    by_name = {a.question.name: a for a in answers}
    named = {n for _, _, names in SECTIONS for n in names}
    sections = [*SECTIONS, ("other", "Other questions",
                            tuple(n for n in by_name if n not in named))]  # fmt: skip
    nav = "".join(f"<a href='#{key}'>{escape(heading)}</a>" for key, heading, _ in sections)
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'>{refresh}<title>{escape(title)}</title>"
        f"<meta name='viewport' content='width=device-width'><style>{STYLE}</style></head>"
        f"<body><h1>{escape(title)}</h1>"
        f"<p class='q'>generated {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC</p><nav>{nav}</nav>",
    ]
    for key, heading, names in sections:
        present = [by_name[n] for n in names if n in by_name]
        drawn = [html for section, html in chart_list if section == key]
        if not present and not drawn:
            continue
        parts.append(f"<h2 id='{key}'>{escape(heading)}</h2>")
        parts += drawn
        for a in present:
            parts.append(
                f"<h3 id='{a.question.name}'>{escape(a.question.name)}</h3>"
                f"<p class='q'>{escape(a.question.question)}</p>"
            )
            if a.result is not None:
                parts.append(html_table(a.result))
            else:
                parts.append(f"<p class='err'>{escape(a.error or '')}</p>")
    parts.append("</body></html>")
    return "".join(parts)
