"""Grey failure and hard fault, end to end on the real broker: the simulated fleet's
telemetry reaches the health processor, verdicts go to the isolation ladder, its signed
commands reach the executors, the devices go quiet, and every step is in ClickHouse.

`fleetloop sim` and `fleetloop worker` run as their own processes, as deployed.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import run_signed_scenario
from tests.integration.sim_proc import SimProcess, until
from tests.integration.worker_proc import WorkerProcess

SCENARIO = """
name: health-e2e
duration_s: 3600
fleet: {nodes: 5, seed: 7}
faults:
  - {kind: grey_slowdown, target: {node: 0, device: 2}, start_s: 60, duration_s: 3000,
     params: {slowdown_ratio: 0.2}}
  - {kind: grey_slowdown, target: {node: 0, device: 6}, start_s: 60, duration_s: 3000,
     params: {slowdown_ratio: 0.25}}
  - {kind: ecc_storm, target: {node: 2, device: 5}, start_s: 30, duration_s: 3000,
     params: {lead_s: 50, growth_per_s: 0.05}}
"""
# node 0 is the only H100 node: its pool of 8 devices may have one isolated at a time (10%,
# at least one), so one of its two slow devices is drained and the other refused
GREYS, DBE = ("node-00000-gpu2", "node-00000-gpu6"), "node-00002-gpu5"


@pytest.fixture
def health_loop(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> Iterator[tuple[SimProcess, WorkerProcess]]:
    yield from run_signed_scenario(kafka_bootstrap, topic_prefix, tmp_path, SCENARIO)


def test_grey_failure_is_drained_and_a_double_bit_fault_quarantined(
    health_loop: tuple[SimProcess, WorkerProcess], topic_prefix: str
) -> None:
    sim, worker = health_loop
    where = f"src_topic LIKE '{topic_prefix}%'"

    def issued(device: str) -> list[str]:
        return worker.issued(device, prefix=topic_prefix)

    until(lambda: "quarantine" in issued(DBE), what="the DBE quarantine", proc=sim, timeout_s=120)
    until(
        lambda: any("drain" in issued(g) for g in GREYS), what="a grey device drained", proc=sim,
        timeout_s=150,
    )  # fmt: skip
    [grey] = [g for g in GREYS if issued(g)]
    [held] = [g for g in GREYS if g != grey]
    assert issued(grey)[:3] == ["deweight", "stop_new_sessions", "drain"]  # the ladder, in order
    refusals = worker.sql(
        f"SELECT reason, message FROM fleetloop.decisions WHERE {where} AND target = '{held}' "
        "AND outcome = 'refused'"
    )
    assert refusals and refusals[0][0] == "pool_cap", refusals
    assert "us-east-h100" in refusals[0][1]

    # the verdicts behind them, with their evidence
    [[signals]] = worker.sql(
        f"SELECT arrayMap(s -> s.1, signals) FROM fleetloop.verdicts WHERE {where} "
        f"AND device_uuid = '{DBE}' AND status = 'failed' ORDER BY observed_at LIMIT 1"
    )
    assert "ecc_dbe" in signals
    [[evidence]] = worker.sql(
        f"SELECT evidence FROM fleetloop.verdicts WHERE {where} AND device_uuid = '{grey}' "
        "AND status = 'dying' ORDER BY observed_at LIMIT 1"
    )
    assert "tpot_vs_peers" in evidence or "probe_slow" in evidence

    # the executor applied the issued commands, and each decision names its command
    def applied() -> bool:
        rows = worker.sql(
            "SELECT d.target, d.action, r.status FROM fleetloop.decisions AS d "
            "INNER JOIN fleetloop.command_results AS r ON r.command_id = d.command_id "
            f"WHERE d.src_topic LIKE '{topic_prefix}%' AND r.src_topic LIKE '{topic_prefix}%'"
        )
        done = {(t, a) for t, a, s in rows if s == "applied"}
        return done >= {(DBE, "quarantine"), (grey, "drain")}

    until(applied, what="the executors' results for both", proc=sim, timeout_s=60)
    # nothing else was even proposed: no false positives on the 37 healthy devices
    others = worker.sql(
        f"SELECT DISTINCT target FROM fleetloop.decisions WHERE {where} AND controller = "
        f"'isolation' AND target NOT IN ('{grey}', '{held}', '{DBE}') AND action != 'restore'"
    )
    assert others == []

    # and the fleet's telemetry shows it: the drained device stops serving
    def idle() -> bool:
        util = worker.sql(
            "SELECT avg(gpu_util_ratio) FROM (SELECT gpu_util_ratio FROM "
            f"fleetloop.accelerator_telemetry WHERE {where} AND device_uuid = '{grey}' "
            "ORDER BY observed_at DESC LIMIT 5)"
        )
        return float(util[0][0]) < 0.01

    until(idle, what="the drained device going idle", proc=sim, timeout_s=90)

    # the health metrics, and the guardrail as a person sees and resets it
    assert worker.metric("fleetloop_verdicts_total") > 0
    assert worker.metric("fleetloop_isolated_devices") >= 2
    state = json.loads(worker.get("/guardrail"))
    assert DBE in state["isolated"] and state["locked_out"] is False
    assert worker.post("/guardrail/reset", {}) == {"locked_out": False, "was_locked_out": False}
    # and nobody else: no token, a browser's cross-origin text/plain POST, a rebound name
    for headers, status in [
        ({"Content-Type": "application/json"}, 401),
        ({"Content-Type": "text/plain", "Origin": "http://evil.example"}, 403),
        ({"Content-Type": "text/plain", "Authorization": f"Bearer {worker.token}"}, 415),
        ({"Host": "evil.example", "Authorization": f"Bearer {worker.token}"}, 421),
    ]:
        request = urllib.request.Request(
            worker.url + "/guardrail/reset", data=b"{}", method="POST", headers=headers
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == status, (headers, refused.value.read())
