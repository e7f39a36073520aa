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


def _idle(worker: WorkerProcess, rows: str, *, last: int) -> bool:
    """Whether the ``last`` accelerator samples matching ``rows`` (a WHERE clause) show the
    devices idle."""
    util = worker.sql(
        "SELECT avg(gpu_util_ratio) FROM (SELECT gpu_util_ratio FROM "
        f"fleetloop.accelerator_telemetry WHERE {rows} ORDER BY observed_at DESC LIMIT {last})"
    )
    return float(util[0][0]) < 0.01


def _moved(worker: WorkerProcess, rows: str) -> list[list[str]]:
    """The targets of isolation steps (not an alert, not a restore) matching ``rows``."""
    return worker.sql(
        "SELECT DISTINCT target FROM fleetloop.decisions WHERE controller = 'isolation' "
        f"AND action NOT IN ('attribute', 'restore') AND {rows}"
    )


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
    assert _moved(worker, f"{where} AND target NOT IN ('{grey}', '{held}', '{DBE}')") == []

    # and the fleet's telemetry shows it: the drained device stops serving
    until(
        lambda: _idle(worker, f"{where} AND device_uuid = '{grey}'", last=5),
        what="the drained device going idle", proc=sim, timeout_s=90,
    )  # fmt: skip

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


RUNAWAY = """
name: runaway-e2e
duration_s: 3600
fleet: {nodes: 10, seed: 7}
demand: {kind: synthetic, load_ratio: 0.7}
faults:
  - {kind: thermal_runaway, target: {node: 1}, start_s: 30, duration_s: 3000,
     params: {resistance_factor: 2.0, inlet_rise_celsius: 12}}
"""
# node 1's cooling fails: its eight devices run hot together, from a cause of the node's
# own, and the node is drained as one unit; node 1 shares its rack, so its neighbours,
# cool, tell it from hot air on the rack


@pytest.fixture
def runaway_loop(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> Iterator[tuple[SimProcess, WorkerProcess]]:
    yield from run_signed_scenario(kafka_bootstrap, topic_prefix, tmp_path, RUNAWAY, nodes=None)


def test_a_node_whose_cooling_fails_is_drained_as_one_unit(
    runaway_loop: tuple[SimProcess, WorkerProcess], topic_prefix: str
) -> None:
    sim, worker = runaway_loop
    node, where = "node-00001", f"src_topic LIKE '{topic_prefix}%'"
    # the node's verdict reaches the ladder (not only the alert): a drain, signed, issued
    until(
        lambda: "drain" in worker.issued(node, prefix=topic_prefix), what="the node drained",
        proc=sim, timeout_s=180,
    )  # fmt: skip
    [[reason, message, command]] = worker.sql(
        f"SELECT reason, message, toString(command_id) FROM fleetloop.decisions WHERE {where} "
        f"AND target = '{node}' AND action = 'drain' AND outcome = 'issued' "
        "ORDER BY decided_at LIMIT 1"
    )
    assert reason == "node_fault" and "drained as one unit" in message, message

    def applied() -> bool:
        rows = worker.sql(
            f"SELECT status FROM fleetloop.command_results WHERE {where} "
            f"AND toString(command_id) = '{command}'"
        )
        return any(r[0] == "applied" for r in rows)

    until(applied, what="the executor's result for the drain", proc=sim, timeout_s=60)
    # no device of another node was moved for it
    besides = f"target != '{node}' AND NOT startsWith(target, '{node}-')"
    assert _moved(worker, f"{where} AND {besides}") == []

    # and the node's devices stop serving
    until(
        lambda: _idle(worker, f"{where} AND startsWith(device_uuid, '{node}-')", last=16),
        what="the drained node going idle", proc=sim, timeout_s=90,
    )  # fmt: skip
