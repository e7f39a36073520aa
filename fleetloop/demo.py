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
- a forged, an expired and a future-dated command, which the executors refuse with a
  result each (bad_signature, expired, bad_time).

It starts clean (``--resume`` keeps ``var/``), waits until the worker's committed
offsets reach the end of every ingested topic before it counts anything, and ends
with what ClickHouse holds: rows per table, every command with its result, the
controllers' decisions and the verdicts behind them, the device the scenario
gave the ECC storm going idle, the cold model starting to serve. Last, the
safety promises, read from the simulator's ground truth: no breaker trips (and
how close each rack came: its longest time over the limit against the trip
time), no device lost to heat, no device isolated that had nothing wrong. A
broken promise makes the run exit 1.
A per-run HMAC key is generated unless ``FLEETLOOP_COMMAND_KEYS`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import secrets
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import SecretStr

from agents.publisher import KafkaPublisher
from fleetloop.kafka_broker import LocalKafkaBroker
from fleetloop.procs import get_json, spawn, stop_all, wait_for
from fleetloop.report import run_report
from fleetloop.settings import REPO_ROOT, BrokerSettings, DemoSettings, SimSettings, WorkerSettings
from fleetloop.sqlclient import format_table, run_query
from fleetloop.topics_admin import ensure_topics, read_topic
from schemas.base import Contract
from schemas.codec import decode, encode
from schemas.commands import RouteAction, RouteCommand, Target
from schemas.signing import sign
from schemas.topics import ACCELERATOR, INGESTED_TOPICS, ROUTE_COMMANDS, SERVING, TopicSpec
from streams.app import ingest_group
from streams.lag import fetch_lag

DEMO_SCENARIO = REPO_ROOT / "scenarios" / "demo.yaml"
WORKER_DIR = Path("var/worker")
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
  AND c.action NOT IN ('optional_budget', 'power_cap', 'clock_mode')
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
SELECT t, d.requests AS demanded, s.baseline AS served, s.harvest AS `optional+batch`,
       s.replicas AS replicas
FROM (SELECT toStartOfInterval(observed_at, INTERVAL 15 SECOND) AS t, sum(requests) AS requests
      FROM {db}.demand WHERE model = '{model}' AND ingested_at >= {since} GROUP BY t) AS d
LEFT JOIN (SELECT toStartOfInterval(observed_at, INTERVAL 15 SECOND) AS t,
                  sum(requests - ifNull(optional_requests, 0) - ifNull(batch_requests, 0))
                      AS baseline,
                  sum(ifNull(optional_requests, 0) + ifNull(batch_requests, 0)) AS harvest,
                  uniqExact(replica_id) AS replicas
           FROM {db}.serving_metrics WHERE model = '{model}' AND ingested_at >= {since}
           GROUP BY t) AS s USING t
ORDER BY t
"""
UNANSWERED_SQL = """
SELECT c.action, count() AS commands, toString(min(c.issued_at)) AS first_issued
FROM {db}.commands AS c
WHERE c.ingested_at >= {since}
  AND c.command_id NOT IN (SELECT command_id FROM {db}.command_results WHERE ingested_at >= {since})
GROUP BY c.action ORDER BY c.action
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
    broker_settings: BrokerSettings,
    settings: DemoSettings,
    *,
    keep_running: bool,
    resume: bool = False,
) -> int:
    """Run the demo; return a process exit code (1 when a safety promise was broken)."""
    speed = settings.speed
    own_broker = not settings.broker_given
    if not resume:
        _clean(broker_settings, settings, own_broker=own_broker)
    started = datetime.now(UTC)
    since = f"toDateTime64('{started:%Y-%m-%d %H:%M:%S}', 3, 'UTC')"  # this run's rows only
    env = dict(os.environ)
    broker: LocalKafkaBroker | None = None
    if own_broker:
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
    created = asyncio.run(
        ensure_topics(
            settings.kafka_bootstrap,
            prefix=settings.topic_prefix,
            log_append_time=settings.topic_timestamps == "log_append",
        )
    )
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
                str(WORKER_DIR),
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
        _catch_up(settings, procs)
        truth = Truth.read(settings.truth_file)
        _report(op, settings, truth)
        broken = _safety(op, truth)
        if keep_running:
            print("\n[demo] the worker keeps serving `fleetloop sql`; Ctrl-C stops it")
            with contextlib.suppress(KeyboardInterrupt):
                procs["worker"].wait()
        return 1 if broken else 0
    finally:
        stop_all(procs)
        if broker is not None and not keep_running:
            broker.down()
            print("[demo] broker stopped")


def _clean(broker_settings: BrokerSettings, settings: SimSettings, *, own_broker: bool) -> None:
    """Start from nothing: an earlier run's topics, offsets and tables would be resumed
    (its commands expired, its telemetry stale, its decisions replayed)."""
    paths = [settings.clickhouse_dir, WORKER_DIR, Path("var/report.html")]
    paths += [
        p for p in (settings.truth_file, settings.spool_dir, settings.seen_file) if p is not None
    ]
    paths += [Path("var") / f"{name}.log" for name in ("worker", "sim")]
    if own_broker:
        LocalKafkaBroker(broker_settings).down()  # one an earlier --keep-running left up
        paths.append(broker_settings.broker_dir)
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    print("[demo] starting clean (var/ from an earlier run removed; --resume keeps it)")


def _catch_up(
    settings: SimSettings, procs: dict[str, subprocess.Popen[bytes]], timeout_s: float = 120.0
) -> None:
    """Wait until the worker's ingest loop has committed every ingested topic to its end.

    The ingest loop (its own group, ``<app id>.ingest``) commits offsets only after
    ClickHouse holds the rows, so zero lag on every topic means everything the fleet
    and the controllers sent is stored.
    """
    group = ingest_group(WorkerSettings().app_id)
    topics = [settings.topic_prefix + t.name for t in INGESTED_TOPICS]
    started = time.monotonic()
    lag: dict[str, int] = {}
    while time.monotonic() - started < timeout_s:
        if procs["worker"].poll() is not None:
            raise RuntimeError(
                f"the worker exited ({procs['worker'].returncode}); see var/worker.log"
            )
        lag = asyncio.run(fetch_lag(settings.kafka_bootstrap, group, topics))
        if len(lag) == len(topics) and not any(lag.values()):
            print(f"[demo] ingestion caught up: every topic committed to its end "
                  f"({time.monotonic() - started:.1f} s after the fleet stopped)")  # fmt: skip
            return
        time.sleep(0.5)
    behind = {t: n for t, n in lag.items() if n}
    print(f"[demo] ingestion still behind after {timeout_s:.0f} s: {behind}; counts are partial")


@dataclass(slots=True)
class Truth:
    """What the simulator says happened (``var/sim/truth.jsonl``)."""

    faults: list[dict[str, object]] = field(default_factory=list)
    consequences: list[dict[str, object]] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path | None) -> Truth:
        truth = cls()
        if path is None or not path.exists():
            return truth
        for line in path.read_text().splitlines():
            row = json.loads(line)
            (truth.faults if row["record"] == "fault" else truth.consequences).append(row)
        return truth

    def device_with(self, kind: str) -> str | None:
        return next((str(f["device_uuid"]) for f in self.faults if f["kind"] == kind), None)

    def observed(self, what: str) -> list[dict[str, object]]:
        return [c for c in self.consequences if c["what"] == what]

    def named(self, device: str) -> bool:
        """Whether a fault targets ``device`` or its node."""
        return any(
            device == f.get("device_uuid") or device.startswith(f"{f.get('node_id')}-")
            for f in self.faults
        )


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
    future = op.route(  # validly signed, but dated an hour ahead of the executors' clock
        "node-00003-gpu0", RouteAction.DRAIN, "demo_future", at=now + timedelta(hours=1)
    )
    op.send(
        [(ROUTE_COMMANDS, forged), (ROUTE_COMMANDS, expired), (ROUTE_COMMANDS, future)],
        raw=MALFORMED,
    )
    print(
        "[demo] sent a forged, an expired and a future-dated command, "
        "and 3 malformed telemetry messages"
    )
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


def _report(op: Operator, settings: SimSettings, truth: Truth) -> None:
    def table(title: str, sql: str, **fmt: str) -> None:
        print(f"\n[demo] {title}")
        db = settings.clickhouse_database
        print(format_table(run_query(settings, sql.format(db=db, since=op.since, **fmt))))

    table("ClickHouse (embedded chDB, owned by the worker): rows this run", SUMMARY_SQL)
    table("every command and its result (budgets and caps: see control, below)", RESULTS_SQL)
    unanswered = op.query(UNANSWERED_SQL)
    if unanswered:
        table(
            "commands with no result: issued after the simulator (and its executors) stopped, "
            "or still in flight",
            UNANSWERED_SQL,
        )
    table("the controllers' decisions (and the guardrail's refusals)", DECISIONS_SQL)
    table("capacity, batch and power control: what each pool and rack was given", CONTROL_SQL)
    storm = truth.device_with("ecc_storm")
    if storm:
        table(f"{storm} (the scenario's ECC storm): its health verdicts", VERDICTS_SQL,
              device=storm)  # fmt: skip
        table(f"{storm}: ECC storm, double-bit fault, quarantine", DEVICE_SQL, device=storm)
    table(
        "gemma-27b: cold, then warmed by the warming controller (requests per 15 s: served is "
        "its demand's; optional+batch is the idle capacity the capacity controller lent out)",
        COLD_SQL, model="gemma-27b",
    )  # fmt: skip
    table(
        "dead letters",
        "SELECT source_topic, source_offset, error_kind FROM {db}.dead_letters "
        "WHERE ingested_at >= {since} ORDER BY received_at",
    )
    print(f"\n[demo] ground truth of the injected faults: {settings.truth_file}")
    report = Path("var/report.html")
    with contextlib.redirect_stdout(io.StringIO()):  # the tables above already said it
        run_report(settings, report, storm or op.quarantined)
    print(
        f"[demo] every SRE question answered, with charts: {report} (`fleetloop report`); "
        f"live dashboards at {settings.query_url}/dashboards while the worker runs"
    )


def _safety(op: Operator, truth: Truth) -> list[str]:
    """Print each safety promise kept or broken; return the broken ones."""
    broken = [f"breaker tripped on {c['target']} at t={c['t_s']} s"
              for c in truth.observed("breaker_trip")]  # fmt: skip
    broken += [f"{c['target']} lost to heat at t={c['t_s']} s"
               for c in truth.observed("device_lost_overheat")]  # fmt: skip
    isolated = {str(target) for target, action, *_ in op.query(ISOLATED_SQL)
                if action in ("drain", "quarantine")}  # fmt: skip
    broken += [f"{d} isolated with nothing wrong with it"
               for d in sorted(isolated) if not truth.named(d)]  # fmt: skip
    print("\n[demo] safety promises")
    for c in truth.observed("over_breaker_limit"):
        margin = float(str(c["trip_after_s"])) - float(str(c["duration_s"]))
        print(
            f"  {c['target']}: over its breaker limit for {c['duration_s']} s of the "
            f"{c['trip_after_s']} s that trip it (margin {margin:.1f} s), t={c['t_s']} s"
        )
    for line in broken:
        print(f"  BROKEN: {line}")
    if not broken:
        print("  kept: no breaker trip, no device lost, no healthy device isolated")
    return broken
