"""`fleetloop demo`: the closed loop, live, on embedded defaults.

Starts the local broker (unless ``KAFKA_BOOTSTRAP`` names one) and creates the
topics; starts a stream worker (which owns the embedded ClickHouse, judges
health, runs the isolation ladder, forecasts demand and warms) and the
simulated fleet with its node, router and warmer executors (`fleetloop sim`
on ``scenarios/demo.yaml``), each as its own process. The health processor
finds the grey-failing device and walks it down the ladder (de-weight, stop
new sessions, drain) and quarantines the device whose ECC storm ends in a
double-bit fault; the warming controller sees demand for a model loaded
nowhere and warms it. Beside them, a scripted operator reads only ClickHouse
and acts only through signed commands on Kafka:

- the isolation controller's quarantine, replayed byte for byte -> ``duplicate``;
- a forged and an expired command, which the executors refuse with a result.

It ends with what ClickHouse holds: rows per table, every command with its
result, the controllers' decisions and the verdicts behind them, the
quarantined device going idle, the cold model starting to serve.
A per-run HMAC key is generated unless ``FLEETLOOP_COMMAND_KEYS`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import secrets
import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import SecretStr

from agents.publisher import KafkaPublisher
from fleetloop.kafka_broker import LocalKafkaBroker
from fleetloop.procs import get_json, spawn, stop_all, wait_for
from fleetloop.report import run_report
from fleetloop.settings import REPO_ROOT, BrokerSettings, SimSettings
from fleetloop.sqlclient import format_table, run_query
from fleetloop.topics_admin import ensure_topics, read_topic
from schemas.base import Contract
from schemas.codec import decode, encode
from schemas.commands import RouteAction, RouteCommand, Target
from schemas.signing import sign
from schemas.topics import ACCELERATOR, ROUTE_COMMANDS, SERVING, TopicSpec

DEMO_SCENARIO = REPO_ROOT / "scenarios" / "demo.yaml"
DEMO_SPEED = 5.0  # simulated seconds per wall second unless --speed says otherwise
MALFORMED = (
    (ACCELERATOR.name, b"{not json"),
    (ACCELERATOR.name, b'{"schema_version": 9}'),
    (SERVING.name, b'{"schema_version": 1, "tpot_p95_s": NaN}'),
)
TABLES = (
    "accelerator_telemetry",
    "node_health",
    "pdu_readings",
    "serving_metrics",
    "demand",
    "commands",
    "command_results",
)
SUMMARY_SQL = (
    " UNION ALL ".join(
        f"SELECT '{t}' AS table, count() AS rows FROM {{db}}.{t} WHERE ingested_at >= {{since}}"
        for t in TABLES
    )
    + " UNION ALL SELECT 'dead_letters', count() FROM {db}.dead_letters"
    + " WHERE ingested_at >= {since}"
)
RESULTS_SQL = """
SELECT c.action, coalesce(c.target_device_uuid, c.target_pool, c.target_node_id) AS target,
       c.reason, r.executor, r.status, substring(r.detail, 1, 58) AS detail
FROM {db}.command_results AS r INNER JOIN {db}.commands AS c ON c.command_id = r.command_id
WHERE r.ingested_at >= {since} AND c.ingested_at >= {since}
  AND c.action NOT IN ('opportunistic_budget', 'power_cap', 'clock_mode')
ORDER BY r.completed_at, r.src_offset LIMIT 1 BY r.result_id
"""
DEVICE_SQL = """
SELECT toStartOfInterval(observed_at, INTERVAL 15 SECOND) AS t,
       round(avg(gpu_util_ratio), 2) AS util, max(ecc_sbe_volatile_total) AS sbe,
       max(ecc_dbe_volatile_total) AS dbe,
       round(avg(power_usage_watts)) AS watts
FROM {db}.accelerator_telemetry WHERE device_uuid = '{device}' AND ingested_at >= {since}
GROUP BY t ORDER BY t
"""
COLD_SQL = """
SELECT t, d.requests AS demanded, s.served AS served, s.replicas AS replicas
FROM (SELECT toStartOfInterval(observed_at, INTERVAL 15 SECOND) AS t, sum(requests) AS requests
      FROM {db}.demand WHERE model = '{model}' AND ingested_at >= {since} GROUP BY t) AS d
LEFT JOIN (SELECT toStartOfInterval(observed_at, INTERVAL 15 SECOND) AS t,
                  sum(requests) AS served, uniqExact(replica_id) AS replicas
           FROM {db}.serving_metrics WHERE model = '{model}' AND ingested_at >= {since}
           GROUP BY t) AS s USING t
ORDER BY t
"""
ISOLATED_SQL = """
SELECT target, action, reason, substring(message, 1, 70), toString(command_id), controller
FROM {db}.decisions WHERE ingested_at >= {since} AND outcome = 'issued'
ORDER BY decided_at
"""
DECISIONS_SQL = """
SELECT decided_at, controller, target, action, outcome, reason,
       substring(message, 1, 50) AS message
FROM {db}.decisions WHERE ingested_at >= {since} AND (outcome != 'refused' OR reason != 'pool_cap'
   OR target IN (SELECT target FROM {db}.decisions WHERE outcome = 'issued'))
   AND controller NOT IN ('capacity', 'power')
ORDER BY decided_at LIMIT 40
"""
CONTROL_SQL = """
SELECT controller, target, count() AS decisions, groupUniqArray(reason) AS reasons,
       round(argMax(applied, decided_at), 3) AS last_applied,
       round(argMax(p_term, decided_at), 3) AS p, round(argMax(i_term, decided_at), 3) AS i
FROM {db}.decisions
WHERE ingested_at >= {since} AND controller IN ('capacity', 'tpot_guard', 'power')
GROUP BY controller, target ORDER BY controller, target
"""
VERDICTS_SQL = """
SELECT observed_at, status, previous_status AS was, score, substring(evidence, 1, 70) AS evidence
FROM {db}.verdicts WHERE ingested_at >= {since} AND device_uuid = '{device}'
  AND status != previous_status
ORDER BY observed_at
"""


class Operator:
    """Stands in for the controllers: reads ClickHouse, sends signed commands."""

    def __init__(self, settings: SimSettings, sim_url: str, since: str) -> None:
        self.s = settings
        self.sim_url = sim_url
        self.since = since
        self.kid, self.key = settings.signing_key()
        self.sent = 0
        self.quarantined: str | None = None

    def sim_now(self) -> datetime:
        return datetime.fromisoformat(str(get_json(self.sim_url + "/healthz")["source_time"]))

    def query(self, sql: str) -> list[list[object]]:
        return run_query(self.s, sql.format(db=self.s.clickhouse_database, since=self.since)).rows

    def send(
        self, messages: list[tuple[TopicSpec, Contract]], raw: tuple[tuple[str, bytes], ...] = ()
    ) -> None:
        async def go() -> None:
            async with KafkaPublisher(
                self.s.kafka_bootstrap, topic_prefix=self.s.topic_prefix
            ) as p:
                for spec, value in messages:
                    await p.publish_raw(spec.name, spec.key_for(value), encode(value))
                for topic, payload in raw:
                    await p.publish_raw(topic, b"demo", payload)
                await p.flush()

        asyncio.run(go())
        self.sent += len(messages)

    def route(
        self,
        device: str,
        action: RouteAction,
        reason: str,
        *,
        at: datetime | None = None,
        ttl_s: float = 120.0,
        key: bytes | None = None,
        cause: tuple[uuid.UUID, datetime] | None = None,
    ) -> RouteCommand:
        """A signed route command (``key``: sign with another key, a forgery); ``cause``
        names the triggering event and when it was observed."""
        issued = at or self.sim_now()
        command = RouteCommand(
            command_id=uuid.uuid4(),
            issued_at=issued,
            expires_at=issued + timedelta(seconds=ttl_s),
            issuer="demo-operator",
            target=Target(device_uuid=device),
            reason=reason,
            action=action,
            cause_event_id=None if cause is None else cause[0],
            cause_observed_at=None if cause is None else cause[1],
        )
        return sign(command, key_id=self.kid, key=key or self.key)

    def replay(self, command_id: uuid.UUID) -> bool:
        """Publish a command already on the topic again, byte for byte (a replay)."""
        topic = self.s.topic_prefix + ROUTE_COMMANDS.name
        for raw, _at in asyncio.run(read_topic(self.s.kafka_bootstrap, topic)):
            if decode(raw, RouteCommand).command_id == command_id:
                self.send([], raw=((ROUTE_COMMANDS.name, raw),))
                self.sent += 1
                return True
        return False


def run_demo(
    broker_settings: BrokerSettings, settings: SimSettings, *, keep_running: bool, speed: float
) -> int:
    """Run the demo; return a process exit code."""
    started = datetime.now(UTC)
    since = f"toDateTime64('{started:%Y-%m-%d %H:%M:%S}', 3, 'UTC')"  # this run's rows only
    env = dict(os.environ)
    broker: LocalKafkaBroker | None = None
    if "KAFKA_BOOTSTRAP" not in os.environ:
        broker = LocalKafkaBroker(broker_settings)
        print(f"[demo] starting Kafka {broker.version} (jars from Maven Central, cached)")
        print("[demo] " + broker.up().describe())
        settings = settings.model_copy(update={"kafka_bootstrap": broker.bootstrap})
    env["KAFKA_BOOTSTRAP"] = settings.kafka_bootstrap
    if settings.command_keys is None:  # a fresh key for this run, shared by issuer and executors
        env["FLEETLOOP_COMMAND_KEYS"] = f"demo={secrets.token_urlsafe(24)}"
        settings = settings.model_copy(
            update={"command_keys": SecretStr(env["FLEETLOOP_COMMAND_KEYS"])}
        )
    created = asyncio.run(ensure_topics(settings.kafka_bootstrap, prefix=settings.topic_prefix))
    print(f"[demo] topics ready ({len(created)} created)")
    scenario = settings.scenario or DEMO_SCENARIO
    ticks = settings.ticks or 240
    web_port = settings.query_url.rsplit(":", 1)[-1].strip("/")
    sim_url = f"http://{settings.web_bind}:{settings.web_port}"
    procs = {
        "worker": spawn(
            "worker",
            [
                "worker",
                "--web-port",
                web_port,
                "--clickhouse-dir",
                str(settings.clickhouse_dir),
                "--worker-dir",
                "var/worker",
                "--topic-prefix",
                settings.topic_prefix,
            ],
            env,
        ),
    }
    print("[demo] stream worker starting (log: var/worker.log)")
    try:
        wait_for(lambda: get_json(settings.query_url + "/healthz"), procs, "the worker", 90)
        procs["sim"] = spawn(
            "sim",
            [
                "sim",
                "--scenario",
                str(scenario),
                "--speed",
                str(speed),
                "--ticks",
                str(ticks),
                "--web-port",
                str(settings.web_port),
                "--topic-prefix",
                settings.topic_prefix,
                *(["--nodes", str(settings.nodes)] if settings.nodes else []),
            ],
            env,
        )
        wait_for(lambda: get_json(sim_url + "/healthz"), procs, "the simulator", 60)
        print(
            f"[demo] fleet simulator up ({scenario.name}, x{speed:g} real time, {ticks} steps); "
            f"router table at {sim_url}/routes, log var/sim.log"
        )
        op = Operator(settings, sim_url, since)
        _play(op, procs, ticks / speed + 30)
        _report(op, settings, sim_url)
        if keep_running:
            print("\n[demo] the worker keeps serving `fleetloop sql`; Ctrl-C stops it")
            with contextlib.suppress(KeyboardInterrupt):
                procs["worker"].wait()
        return 0
    finally:
        stop_all(procs)
        if broker is not None and not keep_running:
            broker.down()
            print("[demo] broker stopped")


def _play(op: Operator, procs: dict[str, subprocess.Popen[bytes]], budget_s: float) -> None:
    """React to what ClickHouse shows until the simulator finishes its run."""
    now = op.sim_now()
    forged = op.route("node-00001-gpu0", RouteAction.DRAIN, "demo_forged", key=b"x" * 32)
    expired = op.route(
        "node-00002-gpu0",
        RouteAction.DRAIN,
        "demo_expired",
        at=now - timedelta(minutes=10),
        ttl_s=60,
    )
    op.send([(ROUTE_COMMANDS, forged), (ROUTE_COMMANDS, expired)], raw=MALFORMED)
    print("[demo] sent a forged and an expired command, and 3 malformed telemetry messages")
    replayed = False
    seen: set[tuple[str, str]] = set()
    deadline = time.monotonic() + budget_s
    while procs["sim"].poll() is None and time.monotonic() < deadline:
        for target, action, reason, message, command_id, controller in op.query(ISOLATED_SQL):
            if (str(target), str(action)) in seen:
                continue
            seen.add((str(target), str(action)))
            print(f"[demo] {controller} controller: {action} {target} ({reason}: {message})")
            if action == "quarantine" and reason == "hard_fault" and not replayed:
                op.quarantined = str(target)
                replayed = op.replay(uuid.UUID(str(command_id)))
                print("[demo] replayed that quarantine's exact bytes: the executor must dedupe")
        time.sleep(1.0)
    procs["sim"].wait(timeout=60)
    print(f"[demo] the simulator finished; {op.sent} commands sent")


def _report(op: Operator, settings: SimSettings, sim_url: str) -> None:
    def table(title: str, sql: str, **fmt: str) -> None:
        print(f"\n[demo] {title}")
        db = settings.clickhouse_database
        print(format_table(run_query(settings, sql.format(db=db, since=op.since, **fmt))))

    expected = op.sent + len(op.query(ISOLATED_SQL))
    for _ in range(60):  # let the worker catch up with the last results
        rows = op.query("SELECT count() FROM {db}.command_results WHERE ingested_at >= {since}")
        if int(str(rows[0][0])) >= expected:
            break
        time.sleep(1)
    table("ClickHouse (embedded chDB, owned by the worker): rows this run", SUMMARY_SQL)
    table("every command and its result (budgets and caps: see control, below)", RESULTS_SQL)
    table("the controllers' decisions (and the guardrail's refusals)", DECISIONS_SQL)
    table("capacity, batch and power control: what each pool and rack was given", CONTROL_SQL)
    if op.quarantined:
        table(f"{op.quarantined}: its health verdicts", VERDICTS_SQL, device=op.quarantined)
        table(
            f"{op.quarantined}: ECC storm, double-bit fault, quarantine",
            DEVICE_SQL,
            device=op.quarantined,
        )
    table("gemma-27b: cold, then warmed by the warming controller", COLD_SQL, model="gemma-27b")
    table(
        "dead letters",
        "SELECT source_topic, source_offset, error_kind FROM {db}.dead_letters "
        "WHERE ingested_at >= {since} ORDER BY received_at",
    )
    print(f"\n[demo] ground truth of the injected faults: {settings.truth_file}")
    report = Path("var/report.html")
    with contextlib.redirect_stdout(io.StringIO()):  # the tables above already said it
        run_report(settings, report, op.quarantined)
    print(
        f"[demo] every SRE question answered, with charts: {report} (`fleetloop report`); "
        f"live dashboards at {settings.query_url}/dashboards while the worker runs"
    )
