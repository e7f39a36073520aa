"""Every SRE question runs on ClickHouse seeded from a simulated scenario, with the right answer."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from html import escape, unescape
from pathlib import Path
from typing import Any

import pytest

from controllers.isolation import REASONS
from controllers.warming import WarmReason
from fleetloop.settings import REPO_ROOT
from sre.charts import line_chart
from sre.dashboards import expand, load_dashboards, render_page, time_range
from sre.questions import QuestionError, literal, load_questions
from sre.report import answer_all, charts, isolated_device, render_html
from sre.results import QueryResult
from streams.clickhouse_store import ClickHouseStore
from tests.factories import START
from tests.seed_scenario import COLD_MODEL, CRASHED, FAULTY, TRIPPED_RACK, Seeded, seed

QUESTIONS = load_questions()


@pytest.fixture(scope="module")
def seeded(store: ClickHouseStore) -> Iterator[tuple[ClickHouseStore, Seeded]]:
    db = store.on_database("fl_questions")
    db.apply_schema()
    yield db, seed(db)


def ask(db: ClickHouseStore, name: str, **values: str) -> list[dict[str, Any]]:
    sql = QUESTIONS[name].render(database=db.database, values=values)
    result = db.query(sql, readonly=True)
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


def test_every_question_file_has_a_header_and_renders() -> None:
    assert len(QUESTIONS) >= 9
    for q in QUESTIONS.values():
        assert q.question.endswith("?") or "?" in q.question, q.name
        assert q.answer, q.name
        assert "${database}" in q.sql


def test_every_question_answers_non_empty_on_the_seeded_run(
    seeded: tuple[ClickHouseStore, Seeded],
) -> None:
    db, _ = seeded
    for name in QUESTIONS:
        values = {"device_uuid": FAULTY} if name == "device_timeline" else {}
        assert ask(db, name, **values), f"{name} answered nothing"


def test_fleet_health_now(seeded: tuple[ClickHouseStore, Seeded]) -> None:
    rows = {r["accelerator_type"]: r for r in ask(seeded[0], "fleet_health_now")}
    # node 0 (H100) carries the double-bit fault; node 3 (MI300X) crashed; rack 1 is dark
    assert rows["H100"]["devices_with_dbe"] == 1 and rows["H100"]["nodes_reporting"] == 1
    assert "MI300X" not in rows and "MTIA" not in rows
    assert rows["A100"]["nodes_reporting"] == 1 and rows["A100"]["devices_reporting"] == 8
    assert all(r["devices_with_dbe"] == 0 for t, r in rows.items() if t != "H100")


def test_silent_nodes(seeded: tuple[ClickHouseStore, Seeded]) -> None:
    rows = ask(seeded[0], "silent_nodes", timeout_s="10")
    silent = {r["node_id"] for r in rows}
    assert silent == {CRASHED, "node-00004", "node-00005", "node-00006", "node-00007"}
    crashed = next(r for r in rows if r["node_id"] == CRASHED)
    assert 100 <= crashed["silent_s"] <= 125  # crashed at t=60 s of 180


def test_device_timeline_explains_the_quarantine(seeded: tuple[ClickHouseStore, Seeded]) -> None:
    db, s = seeded
    assert s.quarantine is not None
    rows = ask(db, "device_timeline", device_uuid=FAULTY)
    kinds = [r["kind"] for r in rows]
    assert kinds.count("command") == 2 and kinds.count("result") == 2  # sent twice
    first_dbe = next(
        i for i, r in enumerate(rows) if r["kind"] == "telemetry" and "dbe 1" in r["what"]
    )
    command = next(i for i, r in enumerate(rows) if r["kind"] == "command")
    assert first_dbe < command  # the fault shows before the command
    assert "xids [48]" in rows[first_dbe]["what"]
    assert "quarantine" in rows[command]["what"] and "double_bit_ecc" in rows[command]["what"]
    results = [r["what"] for r in rows if r["kind"] == "result"]
    assert results[0].startswith("node-executor applied") and "duplicate" in results[1]
    after = [r for r in rows[command:] if r["kind"] == "telemetry"]
    assert after and after[-1]["what"].startswith("util 0 ")  # idle once quarantined
    # the health verdict and the ladder's decision sit on the same axis, before the command
    verdict = next(
        i for i, r in enumerate(rows) if r["kind"] == "verdict" and "failed" in r["what"]
    )
    decision = next(
        i
        for i, r in enumerate(rows)
        if r["kind"] == "decision" and "quarantine advisory (hard_fault)" in r["what"]
    )  # once a second sample confirmed the fault (the first was held to the pool's cap)
    assert "ecc_dbe" in rows[verdict]["what"]
    assert verdict < decision < command


def test_devices_by_verdict(seeded: tuple[ClickHouseStore, Seeded]) -> None:
    rows = {r["device_uuid"]: r for r in ask(seeded[0], "devices_by_verdict")}
    assert rows[FAULTY]["status"] == "failed"
    assert "ecc_dbe" in [signal["name"] for signal in rows[FAULTY]["over"]]
    assert "ecc_dbe" in rows[FAULTY]["evidence"]
    crashed = {d for d, r in rows.items() if r["node_id"] == CRASHED}
    assert len(crashed) == 8 and all(rows[d]["status"] == "failed" for d in crashed)
    assert all("heartbeat_lost" in rows[d]["evidence"] for d in crashed)
    first_status = next(iter(rows.values()))["status"]
    assert first_status == "failed"  # worst first


def test_decisions_by_reason(seeded: tuple[ClickHouseStore, Seeded]) -> None:
    rows = ask(seeded[0], "decisions_by_reason")
    by = {(r["outcome"], r["reason"], r["action"]): r for r in rows}
    # the double-bit fault, confirmed, skips the caps; the crashed node's 8 devices and the
    # tripped rack's 32 went silent, and silence pays the pool and rack caps like any isolation
    quarantined = by[("advisory", "hard_fault", "quarantine")]["targets"]
    assert 1 <= quarantined < 1 + 8 + 32
    capped = {
        r["reason"] for r in rows if r["outcome"] == "refused" and r["action"] == "quarantine"
    }
    assert capped and capped <= {"pool_cap", "rack_cap", "rate_limited"}
    isolation = [r for r in rows if r["controller"] == "isolation"]
    assert all(r["reason"] in REASONS for r in isolation)
    warming = {r["reason"] for r in rows if r["controller"] == "warming"}
    assert warming and warming <= {r.value for r in WarmReason}  # gemma-27b, wanted, unloaded
    controllers = {r["controller"] for r in rows}
    assert {"isolation", "warming", "capacity", "power"} <= controllers
    assert controllers <= {"isolation", "warming", "capacity", "power", "tpot_guard",
                           "power_routing"}  # fmt: skip
    # the tripped rack's feed: the power controller wanted caps (advisory: no keys)
    power = [r for r in rows if r["controller"] == "power"]
    assert any(r["reason"] in ("over_target", "move_batch") for r in power)


def test_capacity_control_against_latency(seeded: tuple[ClickHouseStore, Seeded]) -> None:
    rows = ask(seeded[0], "capacity_control")
    pools = {r["pool"] for r in rows}
    assert "us-east-h100" in pools and len(pools) >= 3
    assert all(r["tpot_p95_over_slo"] >= 0 for r in rows)
    budgeted = [r for r in rows if r["budget_ratio"] > 0]
    assert budgeted, "pools with headroom got an optional-work budget"
    # every budget carries its reason and its terms (a P term can round to 0 at the setpoint)
    assert all(r["reason"] for r in budgeted) and any(r["p_term"] != 0 for r in budgeted)
    assert any(r["i_term"] != 0 for r in rows)  # later minutes carry the integral
    # a pool the controller never budgeted shows none, with no reason
    assert all(r["budget_ratio"] == 0 for r in rows if r["reason"] == "")


def test_forecast_error(seeded: tuple[ClickHouseStore, Seeded]) -> None:
    rows = ask(seeded[0], "forecast_error")
    assert rows and {r["horizon_s"] for r in rows} == {60.0}  # three minutes: one-step only
    cold = next(r for r in rows if r["model"] == COLD_MODEL)
    assert cold["scored"] >= 1 and cold["mase"] >= 0 and 0 <= cold["in_band_ratio"] <= 1


def test_command_latency_and_outcomes(seeded: tuple[ClickHouseStore, Seeded]) -> None:
    db = seeded[0]
    latency = {
        (r["command_type"], r["executor"], r["status"]): r for r in ask(db, "command_latency")
    }
    assert set(latency) == {
        ("RouteCommand", "node-executor", "applied"),
        ("RouteCommand", "node-executor", "duplicate"),
        ("RouteCommand", "node-executor", "bad_signature"),
        ("WarmCommand", "warmer", "applied"),
        ("ThrottleCommand", "router-executor", "applied"),  # a batch move and its return
    }
    assert all(r["result_max_s"] >= 0 for r in latency.values())
    assert [r["results"] for k, r in sorted(latency.items())] == [1, 1, 1, 2, 1]
    quarantine = latency[("RouteCommand", "node-executor", "applied")]
    assert quarantine["with_cause"] == 1
    # the double-bit fault was observed at t=50 s; the quarantine was issued and applied at 60 s
    assert (
        quarantine["event_to_issue_p50_s"] == 10.0 and quarantine["event_to_result_p50_s"] == 10.0
    )
    # it carries the isolation controller's decision, made when the fault showed
    assert quarantine["with_decision"] == 1
    assert 0 <= quarantine["event_to_decision_p50_s"] <= 2.0
    assert quarantine["decision_to_result_p50_s"] == pytest.approx(
        10.0 - quarantine["event_to_decision_p50_s"], abs=0.01
    )
    assert latency[("WarmCommand", "warmer", "applied")]["with_decision"] == 0
    outcomes = {
        (r["action"], r["reason"], r["status"]): r["commands"]
        for r in ask(db, "commands_by_outcome")
    }
    assert outcomes[("quarantine", "double_bit_ecc", "applied")] == 2  # two messages, one command
    assert outcomes[("drain", "forged", "bad_signature")] == 1
    assert outcomes[("warm", "cold_model_demand", "applied")] == 1


def test_batch_moves(seeded: tuple[ClickHouseStore, Seeded]) -> None:
    rows = ask(seeded[0], "batch_moves")
    assert len(rows) == 1
    move = rows[0]
    assert (move["rack_id"], move["pool"], move["to_pool"]) == (
        "rack-0001", "us-east-a100", "us-east-h100",
    )  # fmt: skip
    assert move["moves"] == 1 and move["last_status"] == "applied"
    assert move["back_at"] is not None and move["away_s"] == pytest.approx(50.0, abs=1.0)


def test_power_routing(seeded: tuple[ClickHouseStore, Seeded]) -> None:
    # the tripped rack's feed: its capped replicas weighted down (advisory here: no keys)
    rows = ask(seeded[0], "power_routing")
    assert rows, "the capped rack's replicas were weighted down"
    assert all(0.1 <= r["lowest_weight"] < 1.0 and r["changes"] >= 1 for r in rows)
    replicas = [r for r in rows if r["device_uuid"] is not None]
    assert replicas and all(r["model"] is None for r in replicas)
    assert all(r["last_reason"] in {"device_capped", "rack_over_limit", "caps_lifted"}
               for r in replicas)  # fmt: skip
    assert all(r["rack_id"] and r["device_uuid"] in r["last_message"] for r in replicas)
    # a pool's weight for one model (every replica of it capped): named by its model
    pools = [r for r in rows if r["device_uuid"] is None]
    assert all(r["model"] in r["last_message"] and r["last_reason"].startswith("pool_")
               for r in pools)  # fmt: skip


def test_dead_letters_by_topic_and_error(seeded: tuple[ClickHouseStore, Seeded]) -> None:
    rows = {(r["source_topic"], r["error_kind"]): r for r in ask(seeded[0], "dead_letters")}
    assert set(rows) == {
        ("telemetry.accelerator.v1", "bad_json"),
        ("telemetry.accelerator.v1", "unknown_version"),
        ("telemetry.serving.v1", "schema"),
    }
    assert all(
        r["dead_letters"] == 1 and r["example_at"].startswith("partition 0 offset")
        for r in rows.values()
    )


def test_power_headroom(seeded: tuple[ClickHouseStore, Seeded]) -> None:
    rows = {r["rack_id"]: r for r in ask(seeded[0], "power_headroom", window_s="3600")}
    assert set(rows) == {"rack-0000", TRIPPED_RACK}
    tripped = rows[TRIPPED_RACK]
    assert tripped["readings_over_limit"] >= 10 and tripped["headroom_min_watts"] < 0
    assert tripped["power_now_watts"] == 0  # dark after the trip
    assert rows["rack-0000"]["readings_over_limit"] == 0
    assert rows["rack-0000"]["headroom_now_watts"] > 0


def test_slo_attainment_per_pool(seeded: tuple[ClickHouseStore, Seeded]) -> None:
    db = seeded[0]
    rows = {(r["pool"], r["model"]): r for r in ask(db, "slo_attainment", ttft_p95_slo_s="2.5")}
    assert {p for p, _ in rows} >= {"us-east-h100", "us-east-b200", "us-east-a100"}
    assert all(0.0 <= r["within_slo_ratio"] <= 1.0 for r in rows.values())
    # recompute one pool's answer from the raw rows
    raw = db.query(
        f"SELECT requests, tpot_p95_s, ttft_p95_s, errors FROM {db.database}.serving_metrics "
        "WHERE pool = 'us-east-h100' AND model = 'mixtral-8x7b'"
    ).rows
    total = sum(r[0] for r in raw)
    within = sum(r[0] for r in raw if r[1] is not None and r[1] <= 0.1 and r[2] <= 2.5)
    answer = rows[("us-east-h100", "mixtral-8x7b")]
    assert answer["requests"] == total
    assert answer["within_slo_ratio"] == pytest.approx(within / total, abs=1e-4)
    assert answer["error_ratio"] > 0  # the failed device served errors until quarantined
    # losing 5 of 8 nodes (a crash and a tripped rack) queues the rest past the TTFT SLO
    assert rows[("us-east-b200", "qwen-7b")]["ttft_within_slo_ratio"] < 0.9
    tight = ask(db, "slo_attainment", tpot_p95_slo_s="0.001")
    assert all(r["tpot_within_slo_ratio"] == 0.0 for r in tight)


def test_cold_starts(seeded: tuple[ClickHouseStore, Seeded]) -> None:
    db, s = seeded
    assert s.warm is not None
    rows = ask(db, "cold_starts")
    cold = next(r for r in rows if r["model"] == COLD_MODEL)
    assert cold["region"] == "us-east" and 35 <= cold["cold_seconds"] <= 45  # t=5 s to ~43 s
    assert cold["requests_while_cold"] > 0 and cold["warm_result"] == "applied"
    assert all(r["model"] == COLD_MODEL for r in rows)  # served models were never cold


def test_rollups_agree_with_raw_rows(seeded: tuple[ClickHouseStore, Seeded]) -> None:
    db = seeded[0]
    d = db.database
    raw = db.query(f"SELECT count(), sum(requests) FROM {d}.serving_metrics").rows[0]
    rolled = db.query(f"SELECT sum(samples), sum(requests) FROM {d}.pool_1m").rows[0]
    assert list(raw) == list(rolled)
    raw = db.query(f"SELECT count() FROM {d}.accelerator_telemetry").rows[0][0]
    assert db.query(f"SELECT sum(samples) FROM {d}.device_1m").rows[0][0] == raw


def test_parameters_are_typed_and_checked() -> None:
    q = QUESTIONS["device_timeline"]
    with pytest.raises(QuestionError, match=r"device_uuid \(String\) is required"):
        q.render(database="db")
    with pytest.raises(QuestionError, match="unknown parameters"):
        q.render(database="db", values={"device_uuid": "x", "nope": "1"})
    assert "'it\\'s'" in q.render(database="db", values={"device_uuid": "it's"})
    with pytest.raises(QuestionError, match="not a UInt32"):
        literal("UInt32", "-5")
    with pytest.raises(QuestionError, match="not a Float64"):
        literal("Float64", "nan")
    assert literal("DateTime64(3)", "2026-11-01T12:00:00+01:00").startswith(
        "toDateTime64('2026-11-01 11:00:00"
    )


def test_report_answers_everything_and_draws_the_isolation(
    seeded: tuple[ClickHouseStore, Seeded],
) -> None:
    db = seeded[0]

    def query(sql: str) -> QueryResult:
        return db.query(sql, readonly=True)

    device = isolated_device(query, database=db.database)
    assert device == FAULTY
    answers = answer_all(
        query, database=db.database, values={"device_timeline": {"device_uuid": device}}
    )
    assert [a.error for a in answers if a.error] == []
    assert {a.question.name for a in answers} == set(QUESTIONS)
    drawn = charts(query, database=db.database, device=device)
    svgs = [html for _, html in drawn]
    assert [section for section, _ in drawn] == [
        "isolated", "demand", "demand", "commands", "control"
    ]  # fmt: skip
    assert len(svgs) == 5 and all("<polyline" in s for s in svgs)
    assert " budget" in svgs[4] and "TPOT p95 / SLO" in svgs[4] and "power: power_cap" in svgs[4]
    assert " forecast" in svgs[2] and " actual" in svgs[2] and "warm gemma-27b@us-east" in svgs[2]
    assert "quarantine (double_bit_ecc)" in svgs[0] and "verdict failed" in svgs[0]
    html = render_html(answers, drawn, title="t")
    for name in QUESTIONS:
        assert f"<h3 id='{name}'>" in html
    assert html.count("<table>") == len(QUESTIONS)
    # sections in the order an SRE reads them, each chart inside its own
    headings = ["Fleet now", "What was isolated, and why", "Commands and results",
                "Capacity and power", "Demand and warming", "Dead letters"]  # fmt: skip
    at = [html.index(f">{escape(h)}</h2>") for h in headings]
    assert at == sorted(at)
    assert at[1] < html.index("verdict failed") < at[2]
    assert "{'" not in html and "Decimal(" not in html  # no Python reprs in cells


LAYOUT_PROBE = """<script>
const figures = [...document.querySelectorAll('figure.chart, figcaption, table')];
document.body.setAttribute('data-layout', JSON.stringify({
  overflow: document.documentElement.scrollWidth - window.innerWidth,
  right: Math.max(...[...document.querySelectorAll('figure.chart, figcaption')]
                  .map(e => e.getBoundingClientRect().right)),
  charts: document.querySelectorAll('figure.chart svg.chart').length,
  width: window.innerWidth}));
</script>"""


def test_the_report_reads_at_1400_px_in_headless_chromium(
    seeded: tuple[ClickHouseStore, Seeded], tmp_path: Path
) -> None:
    # Debian's chromium lays the page out: nothing runs off the side (a wide table
    # scrolls in its own box), every chart with its legend and markers fits the window.
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "needs Debian's chromium package (scripts/test.sh installs it)"
    db = seeded[0]

    def query(sql: str) -> QueryResult:
        return db.query(sql, readonly=True)

    device = isolated_device(query, database=db.database)
    answers = answer_all(
        query, database=db.database, values={"device_timeline": {"device_uuid": str(device)}}
    )
    html = render_html(answers, charts(query, database=db.database, device=device), title="t")
    page = tmp_path / "report.html"
    page.write_text(html.replace("</body>", LAYOUT_PROBE + "</body>"))
    done = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--window-size=1400,1000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'data-layout="([^"]+)"', done.stdout)
    assert found, done.stdout[-2000:]
    layout = json.loads(unescape(found.group(1)))
    assert layout["width"] == 1400
    assert layout["overflow"] <= 0, layout  # the page never scrolls sideways
    assert layout["right"] <= 1400, layout
    assert layout["charts"] == 5


def test_fleetloop_report_and_ask_on_an_embedded_directory(tmp_path: Path) -> None:
    data = tmp_path / "ch"
    code = (
        "from pathlib import Path; from streams.clickhouse_store import open_store; "
        "from tests.seed_scenario import seed; "
        f"s = open_store(url=None, data_dir=Path({str(data)!r}), database='fleetloop'); "
        "s.apply_schema(); seed(s); s.close()"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT, timeout=120)
    env = {**os.environ, "FLEETLOOP_QUERY_URL": "http://127.0.0.1:9"}  # no owner: read the dir
    base = [sys.executable, "-m", "fleetloop"]
    out = tmp_path / "report.html"
    done = subprocess.run(
        [*base, "report", "--clickhouse-dir", str(data), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "== power_headroom" in done.stdout and TRIPPED_RACK in done.stdout
    assert "<svg" in out.read_text()
    asked = subprocess.run(
        [
            *base,
            "ask",
            "silent_nodes",
            "-p",
            "timeout_s=130",
            "--format",
            "json",
            "--clickhouse-dir",
            str(data),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=60,
    )
    assert asked.returncode == 0, asked.stderr
    # the rack tripped at t=40 s, before the crash at t=60 s: only its nodes are that silent
    assert [r[0] for r in json.loads(asked.stdout)["rows"]] == [
        f"node-0000{i}" for i in range(4, 8)
    ]
    bad = subprocess.run(
        [*base, "ask", "silent_nodes", "-p", "timeout_s=-1", "--clickhouse-dir", str(data)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=60,
    )
    assert bad.returncode == 1 and "is not a UInt32" in bad.stderr


def test_every_dashboard_panel_runs_on_the_real_schema(
    seeded: tuple[ClickHouseStore, Seeded],
) -> None:
    db = seeded[0]

    def query(sql: str) -> QueryResult:
        return db.query(sql, readonly=True)

    start, end = time_range(query, database=db.database, span=timedelta(hours=1))
    assert end - timedelta(minutes=1) == START + timedelta(seconds=180)  # the newest heartbeat
    panels = [p for d in load_dashboards() for p in d.panels]
    assert len(panels) >= 8
    answered = {}
    for panel in panels:
        sql = expand(panel.sql, database=db.database, start=start, end=end)
        assert "$__" not in sql and "${" not in sql, panel.title
        answered[panel.title] = query(sql)  # raises if the SQL does not fit the schema
    assert all(r.rows for r in answered.values()), [t for t, r in answered.items() if not r.rows]
    attention = answered["Devices needing attention"]
    assert FAULTY in {row[0] for row in attention.rows}
    verdicts = {row[0]: row[1] for row in answered["Devices by health verdict"].rows}
    assert verdicts[FAULTY] == "failed"
    reasons = {row[2] for row in answered["Controller decisions by reason"].rows}
    assert "hard_fault" in reasons
    budgeted = {row[1] for row in answered["Optional-work budget by pool"].rows}
    assert "us-east-h100" in budgeted
    power = {row[1] for row in answered["Power and batch actions by rack and pool"].rows}
    assert TRIPPED_RACK in power
    page = render_page(query, database=db.database)
    assert page.count("<polyline") >= 10 and "no data yet" not in page
    assert all(escape(p.title) in page for p in panels)
    assert "class='err'" not in page


def test_charts_break_lines_at_gaps_and_say_when_empty() -> None:
    t0 = START
    steady = [(t0 + timedelta(minutes=i), float(i)) for i in range(5)]
    later = [(t0 + timedelta(hours=2, minutes=i), float(i)) for i in range(5)]
    svg = line_chart("t", {"a": steady + later})
    assert svg.count("<polyline") == 2  # two runs, not one line across two hours
    holed = [(t, None if i == 2 else v) for i, (t, v) in enumerate(steady)]
    assert line_chart("t", {"a": holed}).count("<polyline") == 2  # a missing value, a gap
    assert "no data yet" in line_chart("t", {"a": []})
    assert "&lt;b&gt;" in line_chart("<b>", {"a": steady})  # titles are escaped
