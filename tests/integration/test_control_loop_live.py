"""A rack's feed loss and a pool-wide slowdown together, end to end on the real broker:
the simulated fleet's telemetry reaches the control role, its signed caps and routing
weights reach the executors, and what happened is read back from ClickHouse: the breaker
never trips, capped replicas are weighted down and back, and the slowed pool's TPOT is
back within its SLO two control periods after the slowdown ends.

`fleetloop sim` and `fleetloop worker` run as their own processes, as deployed.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.integration.conftest import run_signed_scenario
from tests.integration.sim_proc import SimProcess, until
from tests.integration.worker_proc import WorkerProcess

# 8 nodes, 4 to a rack: rack 0 holds an H100 node and rack 1 the other, so the H100 pool
# has replicas on both sides of the feed loss; the rollout slows every H100 by 30%, from
# during the feed loss to a minute after it
SCENARIO = """
name: control-live
duration_s: 3600
fleet: {nodes: 8, seed: 7}
demand: {kind: synthetic, load_ratio: 0.7}
faults:
  - {kind: pdu_overload, target: {rack: 0}, start_s: 30, duration_s: 120,
     params: {breaker_limit_ratio: 0.45, trip_after_s: 10}}
  - {kind: rollout_slowdown, target: {accelerator_type: H100}, start_s: 60, duration_s: 150,
     params: {slowdown_ratio: 0.3}}
"""
FEED_S, SLOW_S, SLOW_END_S, WATCH_S = 30, 60, 210, 300  # the feed is lost from 30 s to 150 s
TRIP_AFTER_S = 10
SLO_S = 0.05  # the pool runs at 0.7-0.85 of it unhurt; capped and slowed, well over it
PERIOD_S = 10.0  # the control role's default period
POOL, RACK = "us-east-h100", "rack-0000"


@pytest.fixture
def control_loop(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> Iterator[tuple[SimProcess, WorkerProcess]]:
    yield from run_signed_scenario(
        kafka_bootstrap,
        topic_prefix,
        tmp_path,
        SCENARIO,
        worker_extra=("--control.tpot-slo-s", str(SLO_S)),
        nodes=None,  # the scenario's eight
    )


def test_a_feed_loss_and_a_slowdown_together_trip_nothing_and_leave_no_breach(
    control_loop: tuple[SimProcess, WorkerProcess], topic_prefix: str
) -> None:
    sim, worker = control_loop
    mine = f"src_topic LIKE '{topic_prefix}%'"

    def ms(table: str, column: str, fold: str = "max") -> float:
        """The ``fold`` of a time column of our rows, in milliseconds since the epoch."""
        rows = worker.sql(
            f"SELECT {fold}(toUnixTimestamp64Milli({column})) FROM fleetloop.{table} WHERE {mine}"
        )
        return float(rows[0][0] or 0) if rows else 0.0

    until(lambda: ms("serving_metrics", "observed_at", "min") > 0,
          what="the first serving report", proc=sim)  # fmt: skip
    start_ms = ms("serving_metrics", "observed_at", "min")
    start = datetime.fromtimestamp(start_ms / 1000, UTC)
    end_ms = start_ms + WATCH_S * 1000
    until(lambda: sim.now() >= start + timedelta(seconds=WATCH_S),
          what="the scenario's faults and their aftermath", proc=sim,
          timeout_s=2 * WATCH_S + 120)  # fmt: skip
    stored = end_ms - PERIOD_S * 1000
    until(lambda: ms("pdu_readings", "observed_at") >= stored, what="the readings", proc=sim)
    until(lambda: ms("decisions", "decided_at") >= stored, what="the decisions", proc=sim)

    # no trip: the rack was never over its breaker limit for the trip time, and its devices
    # kept reporting to the end (a tripped rack goes dark)
    readings = worker.sql(
        "SELECT observed_at, toUInt8(sum(power_watts) > sum(breaker_limit_watts)) FROM "
        f"fleetloop.pdu_readings WHERE {mine} AND rack_id = '{RACK}' "
        "GROUP BY observed_at ORDER BY observed_at"
    )
    longest = run = 0
    for _, over in readings:
        run = run + 1 if over else 0
        longest = max(longest, run)
    assert readings and longest < TRIP_AFTER_S, longest
    [[last]] = worker.sql(
        "SELECT max(toUnixTimestamp64Milli(observed_at)) FROM fleetloop.accelerator_telemetry "
        f"WHERE {mine} AND node_id = 'node-00000'"
    )
    assert float(last) >= stored

    # the power side capped the rack, and power-aware routing weighted its replicas down
    # and back, each a decision with its reason whose command the router applied
    decided = worker.sql(
        "SELECT controller, reason, count() FROM fleetloop.decisions "
        f"WHERE {mine} AND outcome = 'issued' GROUP BY controller, reason"
    )
    said = {(c, r): n for c, r, n in decided}
    assert said.get(("power", "over_target"), 0) > 0, said
    assert said.get(("power_routing", "device_capped"), 0) > 0, said
    assert said.get(("power_routing", "caps_lifted"), 0) > 0, said
    applied = worker.sql(
        "SELECT count() FROM fleetloop.decisions AS d INNER JOIN fleetloop.command_results "
        f"AS r ON r.command_id = d.command_id WHERE d.{mine} AND r.{mine} "
        "AND d.controller = 'power_routing' AND r.status = 'applied'"
    )
    assert applied[0][0] > 0

    # the slowed pool: its TPOT p95 (replica p95s weighted by requests) per control period
    rows = worker.sql(
        f"SELECT intDiv(toUnixTimestamp64Milli(observed_at) - {start_ms:.0f}, "
        f"{PERIOD_S * 1000:.0f}) AS period, "
        "quantileExactWeighted(0.95)(tpot_p95_s, requests) FROM fleetloop.serving_metrics "
        f"WHERE {mine} AND pool = '{POOL}' AND requests > 0 AND tpot_p95_s IS NOT NULL "
        "GROUP BY period ORDER BY period"
    )
    by_s = {int(period) * PERIOD_S: float(tpot) for period, tpot in rows}
    # before: the pool unhurt, before the feed loss (whose caps raise its TPOT too)
    before = [t for s, t in by_s.items() if 0 <= s <= FEED_S - PERIOD_S]
    during = [t for s, t in by_s.items() if SLOW_S + PERIOD_S <= s < SLOW_END_S]
    after = {s: t for s, t in by_s.items() if SLOW_END_S + 2 * PERIOD_S <= s < WATCH_S}
    assert before and during and after
    # the slowdown shows in the pool's TPOT
    assert max(during) > 1.15 * max(before), (before, during)
    # and two periods after it ends (the feed came back a minute before) the pool is back
    # within its SLO, and stays there
    late = {s: round(t, 4) for s, t in after.items() if t > SLO_S}
    assert not late, late


# rack 0 holds the region's whole A100 pool (nodes 0-3), rack 1 the H100 pool serving the
# same models; rack 0 loses 65% of its feed from 30 s to 150 s (pool-capped, shortened)
POOL_CAPPED = """
name: pool-capped-live
duration_s: 3600
fleet: {nodes: 8, seed: 7, type_mix: [A100, A100, A100, A100, H100, H100, H100, H100]}
demand: {kind: synthetic, load_ratio: 0.6}
faults:
  - {kind: pdu_overload, target: {rack: 0}, start_s: 30, duration_s: 120,
     params: {breaker_limit_ratio: 0.35, trip_after_s: 10}}
"""
CAPPED_POOL = "us-east-a100"


@pytest.fixture
def pool_capped_loop(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> Iterator[tuple[SimProcess, WorkerProcess]]:
    yield from run_signed_scenario(
        kafka_bootstrap, topic_prefix, tmp_path, POOL_CAPPED,
        worker_extra=("--control.tpot-slo-s", "0.05"), nodes=None,  # the scenario's eight
    )  # fmt: skip


def test_a_pool_every_cap_holds_sends_a_models_share_to_the_other_pool_and_takes_it_back(
    pool_capped_loop: tuple[SimProcess, WorkerProcess], topic_prefix: str
) -> None:
    """Every A100 replica capped, none free to take a share: the control role moves the
    A100 pool's weight for a model (llama-70b is 55 ms and more a token there capped,
    against a 50 ms SLO) to the H100 pool through a signed command the simulated router
    applies, and back once the caps lift; decisions and results in ClickHouse."""
    sim, worker = pool_capped_loop
    mine = f"src_topic LIKE '{topic_prefix}%'"

    def weights() -> dict[str, float]:
        table = sim.get("/routes")["pool_weights"]
        return {k: float(w) for k, w in table.items() if k.endswith(f"@{CAPPED_POOL}")}

    lowest: dict[str, float] = {}

    def moved() -> bool:
        for key, w in weights().items():
            lowest[key] = min(w, lowest.get(key, 1.0))
        return any(w < 0.5 for w in lowest.values())

    until(moved, what="a model's share moved off the capped pool", proc=sim, timeout_s=240)
    # the feed is back at 150 s: the caps lift, and every share comes back
    until(lambda: bool(weights()) and set(weights().values()) == {1.0},
          what="the shares back", proc=sim, timeout_s=300)  # fmt: skip

    def said() -> dict[tuple[str, str, int], int]:
        rows = worker.sql(
            "SELECT d.reason, r.status, toUInt8(d.applied >= 1), count() "
            "FROM fleetloop.decisions AS d INNER JOIN "
            "fleetloop.command_results AS r ON r.command_id = d.command_id "
            f"WHERE d.{mine} AND r.{mine} AND d.controller = 'power_routing' "
            f"AND d.pool = '{CAPPED_POOL}' AND startsWith(d.reason, 'pool_') "
            "GROUP BY d.reason, r.status, d.applied >= 1"
        )
        return {(reason, status, int(back)): int(n) for reason, status, back, n in rows}

    # a share comes back once the caps lift (pool_caps_lifted) or, sooner, while work
    # waits on the other pool and none here (pool_capped, rising): either way a decision
    # with the weight at 1, applied
    until(lambda: any(back and status == "applied" for _, status, back in said()),
          what="the decisions and their results", proc=sim)  # fmt: skip
    results = said()
    assert results.get(("pool_capped", "applied", 0), 0) > 0, results
    assert {status for _, status, _ in results} == {"applied"}, results
    [[targets]] = worker.sql(
        "SELECT groupUniqArray(target) FROM fleetloop.decisions "
        f"WHERE {mine} AND controller = 'power_routing' AND startsWith(reason, 'pool_')"
    )
    assert set(targets) <= {"llama-70b", "mixtral-8x7b", "qwen-7b"} and set(targets), targets
