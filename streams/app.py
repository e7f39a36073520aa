"""The worker: the ingest loop, the controller roles' processors, the web surface.

Nothing that reads telemetry is a faust agent, because faust's cost per message
capped it. Ingest runs as its own aiokafka consumer group inside this process
(:mod:`streams.ingest_loop`): it splits each batch into valid events and dead
letters (pure), publishes dead letters to ``<topic>.dlq``, writes both to
ClickHouse, and only then commits, so offsets move only for rows ClickHouse
holds. The roles' processors (``health.detect``, ``health.isolate``,
``demand.plan``, ``control.plan``) are role loops (:mod:`streams.role_loop`), one
consumer group each. faust keeps the dead-letter census, the timers, the producer
and the pages. Several workers
with the same app id split the partitions of every one of these groups.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from planning.issuing import IssuerWiring
from schemas.topics import INGESTED_TOPICS, STATE_RECORD_BYTES, TopicSpec, dead_letter_topic
from sre.dashboards import load_dashboards, render_page
from sre.results import QueryResult
from streams.clickhouse_store import ClickHouseStore
from streams.control import add_control
from streams.demand import add_demand
from streams.fatal import fail_stop
from streams.health import add_health
from streams.ingest_loop import IngestLoop, IngestSettings
from streams.lag import fetch_lag
from streams.outputs import ControllerMetrics, Outputs
from streams.page_access import PageAccess, refusal
from streams.role_loop import RoleLoops, role_group
from streams.sink import ClickHouseSink

log = logging.getLogger(__name__)

PRODUCER_BATCH_BYTES = 512 * 1024
"""The worker's producer batches records per partition up to this many bytes: while one
request is in flight, what is sent meanwhile waits in one batch (no linger is added)."""


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What the worker needs, as plain values (the CLI maps settings onto it)."""

    app_id: str
    bootstrap: str
    worker_dir: Path
    web_port: int
    web_bind: str = "127.0.0.1"
    commit_interval_s: float = 2.8
    topic_prefix: str = ""
    batch_max: int = 10_000
    batch_within_s: float = 1.0
    session_timeout_s: float = 10.0
    lag_interval_s: float = 15.0
    wirings: Mapping[str, IssuerWiring] = field(default_factory=dict)  # role -> its wiring
    page_access: PageAccess | None = None  # None: /sql and the guarded pages answer 503


PROCESSORS: dict[str, Callable[..., list[TopicSpec]]] = {
    "health": add_health,
    "demand": add_demand,
    "control": add_control,
}
"""Each controller role's processors: ``add(app, wiring, outputs, registry, access, loops)``
registers them (their role loops on ``loops``, their pages behind ``access``) and returns
the topics faust reads for them."""


class IngestMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.events = Counter(
            "fleetloop_ingest_events_total",
            "Messages consumed by ingest, by outcome",
            ["topic", "outcome"],
            registry=registry,
        )
        self.dead_letters = Counter(
            "fleetloop_dead_letters_total",
            "Messages sent to a dead letter topic",
            ["topic", "error_kind"],
            registry=registry,
        )
        self.uncommitted = Gauge(
            "fleetloop_ingest_uncommitted_messages",
            "Messages written to ClickHouse whose offsets are not yet committed: what a crash "
            "now would read again (and the sink's watermarks drop)",
            registry=registry,
        )
        self.errors = Counter(
            "fleetloop_processing_errors_total",
            "Batches that failed in a processor",
            ["processor"],
            registry=registry,
        )
        self.on_dead_letter_topics = Counter(
            "fleetloop_dead_letter_topic_records_total",
            "Records read off the dead letter topics (by every ingest process), per topic",
            ["topic"],
            registry=registry,
        )
        self.lag = Gauge(
            "fleetloop_consumer_lag_messages",
            "Messages on the broker not yet committed, per source topic and consumer group "
            "(the roles' faust group, the ingest loop's own)",
            ["topic", "group"],
            registry=registry,
        )
        self.lag_errors = Counter(
            "fleetloop_consumer_lag_errors_total",
            "Lag measurements that failed (the broker did not answer)",
            registry=registry,
        )


def create_app(
    config: WorkerConfig,
    store: ClickHouseStore | None,
    registry: CollectorRegistry | None = None,
    *,
    on_fatal: Callable[[str, BaseException], None] = fail_stop,
) -> faust.App:
    """Build the faust app with its processors and web pages.

    With a ``store``, the worker ingests every topic into ClickHouse and serves its
    questions; with ``config.health``, it runs health detection and isolation. A worker
    may do either or both (run them apart so a slow insert never delays an isolation).
    """
    registry = registry or CollectorRegistry()
    app = faust.App(
        config.app_id,
        broker=[f"kafka://{h.strip()}" for h in config.bootstrap.split(",")],
        datadir=str(config.worker_dir),
        store="memory://",
        value_serializer="raw",
        key_serializer="raw",
        web_port=config.web_port,
        web_bind=config.web_bind,
        web_host="127.0.0.1",
        broker_commit_interval=config.commit_interval_s,
        broker_session_timeout=config.session_timeout_s,
        broker_heartbeat_interval=min(3.0, config.session_timeout_s / 3),
        consumer_auto_offset_reset="earliest",
        topic_disable_leader=True,
        producer_acks=-1,
        # a batch per partition up to this size (faust's default, 16 KB, holds four node
        # envelopes: a produce request every four records where a role forwards them)
        producer_max_batch_size=PRODUCER_BATCH_BYTES,
        producer_max_request_size=STATE_RECORD_BYTES,  # a state record may be that large
        topic_allow_declare=False,
    )
    metrics = IngestMetrics(registry)
    sources = [dead_letter_topic(s) for s in INGESTED_TOPICS]  # the census, in every worker
    if store is not None:
        sink = ClickHouseSink(store, registry=registry)
        _add_ingest(app, config, sink, metrics, on_fatal)
    _add_dead_letter_census(app, config, metrics)
    outputs = Outputs(
        app, ControllerMetrics(registry), topic_prefix=config.topic_prefix,
        roles=set(config.wirings),
    )  # fmt: skip
    loops = RoleLoops(
        app, app_id=config.app_id, topic_prefix=config.topic_prefix, bootstrap=config.bootstrap,
        session_timeout_s=config.session_timeout_s, commit_interval_s=config.commit_interval_s,
        on_fatal=on_fatal,
    )  # fmt: skip
    for role, wiring in config.wirings.items():
        read = PROCESSORS[role](app, wiring, outputs, registry, config.page_access, loops)
        sources += [s for s in read if s not in sources]
    groups = {config.app_id: sources, **loops.groups}
    if store is not None:
        groups[ingest_group(config.app_id)] = list(INGESTED_TOPICS)
    _add_lag_timer(app, config, metrics, groups)
    _add_stall_watch(app, registry)
    _add_metrics_pages(app, store, registry)
    if store is not None:
        _add_clickhouse_pages(app, store, config.page_access)
    return app


def ingest_group(app_id: str) -> str:
    """The consumer group of a worker's ingest loop (apart from faust's, ``app_id``)."""
    return role_group(app_id, "ingest")


def _add_ingest(
    app: faust.App,
    config: WorkerConfig,
    sink: ClickHouseSink,
    metrics: IngestMetrics,
    on_fatal: Callable[[str, BaseException], None],
) -> None:
    topics = {config.topic_prefix + spec.name: spec for spec in INGESTED_TOPICS}
    settings = IngestSettings(
        bootstrap=config.bootstrap,
        group_id=ingest_group(config.app_id),
        topics=topics,
        dlq_names={name: config.topic_prefix + spec.dlq_name for name, spec in topics.items()},
        batch_max=config.batch_max,
        batch_within_s=config.batch_within_s,
        session_timeout_s=config.session_timeout_s,
        commit_interval_s=config.commit_interval_s,
    )
    loop = IngestLoop(
        settings, sink, events=metrics.events, dead_letters=metrics.dead_letters,
        errors=metrics.errors, on_fatal=on_fatal, uncommitted=metrics.uncommitted,
    )  # fmt: skip

    async def ingest() -> None:
        try:
            await loop.run()
        except asyncio.CancelledError:
            raise  # the worker is stopping: the write in flight was finished and committed
        except Exception as exc:  # the broker refused us at start, or a write failed
            on_fatal("ingest", exc)
            raise

    ingest.__name__ = ingest.__qualname__ = "ingest"  # what faust logs
    app.task(ingest)


def _add_dead_letter_census(app: faust.App, config: WorkerConfig, metrics: IngestMetrics) -> None:
    """Count what lies on the dead letter topics, whichever ingest process put it there (the
    census of a fleet of ingest processes: every worker counts the partitions it holds in
    the app's group, and the sum over workers is the whole). It is also the faust
    subscription of a worker whose processors are all loops: faust will not run a consumer
    with nothing to read."""
    names = [config.topic_prefix + spec.dlq_name for spec in INGESTED_TOPICS]
    source = app.topic(*names, value_type=bytes, key_type=bytes)

    async def census(stream: Any) -> None:
        async for events in stream.take_events(1_000, within=1.0):
            for e in events:
                metrics.on_dead_letter_topics.labels(e.message.topic).inc()

    census.__name__ = census.__qualname__ = "ingest.dead_letter_census"
    app.agent(source, name="ingest.dead_letter_census", concurrency=1)(census)


def _add_lag_timer(
    app: faust.App,
    config: WorkerConfig,
    metrics: IngestMetrics,
    groups: Mapping[str, list[TopicSpec]],
) -> None:
    async def consumer_lag() -> None:
        for group, specs in groups.items():
            if not specs:
                continue
            topics = [config.topic_prefix + spec.name for spec in specs]
            try:
                lag = await fetch_lag(config.bootstrap, group, topics)
            except Exception as exc:  # a metric must never stop the worker
                metrics.lag_errors.inc()
                log.warning("consumer lag of %s not measured: %r", group, exc)
                continue
            for topic, messages in lag.items():
                metrics.lag.labels(topic, group).set(messages)

    app.timer(interval=config.lag_interval_s, name="consumer_lag")(consumer_lag)


STALL_PROBE_S = 0.1


def _add_stall_watch(app: faust.App, registry: CollectorRegistry) -> None:
    """How late the event loop runs a wake-up due every :data:`STALL_PROBE_S`: every
    processor, timer and page of the worker shares the loop, so a stall here (a long
    batch, a collection, a burst of sends) is a delay in every decision made meanwhile."""
    stalls = Histogram(
        "fleetloop_event_loop_stall_seconds",
        f"How late the worker's event loop ran a wake-up due every {STALL_PROBE_S} s",
        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        registry=registry,
    )

    async def watch() -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + STALL_PROBE_S
            await asyncio.sleep(STALL_PROBE_S)
            stalls.observe(max(0.0, loop.time() - due))

    watch.__name__ = watch.__qualname__ = "event_loop_stall_watch"
    app.task(watch)


def _add_metrics_pages(
    app: faust.App, store: ClickHouseStore | None, registry: CollectorRegistry
) -> None:
    @app.page("/metrics")
    async def metrics_page(web: Any, request: Any) -> Any:
        # aiohttp wants the charset apart from the media type
        media_type = CONTENT_TYPE_LATEST.split("; charset=")[0]
        return web.bytes(generate_latest(registry), content_type=media_type)

    @app.page("/healthz")
    async def health_page(web: Any, request: Any) -> Any:
        """200 when ClickHouse answers (or this worker needs none); 503 with the reason."""
        if store is None:
            return web.json({"status": "ok", "clickhouse": "not used by this worker"})
        try:
            await asyncio.wait_for(store.run(store.query, "SELECT 1"), timeout=5.0)
        except Exception as exc:
            return web.json({"status": "unhealthy", "clickhouse": repr(exc)[:500]}, status=503)
        return web.json({"status": "ok", "clickhouse": "ok"})


def _add_clickhouse_pages(
    app: faust.App, store: ClickHouseStore, access: PageAccess | None
) -> None:
    dashboards = load_dashboards()  # read once; each request only runs the panels

    @app.page("/dashboards")
    async def dashboards_page(web: Any, request: Any) -> Any:
        """The Grafana dashboards' panels, run on the data this process owns (read-only)."""
        refused = refusal(access, request.headers, guarded=False)
        if refused is not None:
            return web.json({"error": refused[1]}, status=refused[0])

        def query(sql: str) -> QueryResult:
            return store.query(sql, readonly=True)

        html = await store.run_reader(
            render_page, query, database=store.database, dashboards=dashboards
        )
        return web.html(html)

    @app.page("/sql")
    class SqlView(faust.web.View):
        """Read-only SQL against the ClickHouse data this worker owns: one statement per
        request (``{"sql": "..."}``), on a fresh bounded session, off the sink's thread."""

        async def post(self, request: Any) -> Any:
            refused = refusal(access, request.headers, guarded=True)
            if refused is not None:
                return self.json({"error": refused[1]}, status=refused[0])
            try:
                sql = json.loads(await request.text())["sql"]
                if not isinstance(sql, str):
                    raise TypeError("sql is not a string")
            except (ValueError, KeyError, TypeError) as exc:
                return self.json({"error": f'send {{"sql": "..."}}: {exc}'}, status=400)
            try:
                result = await store.run_reader(store.query, sql, readonly=True)
            except Exception as exc:
                return self.json({"error": str(exc)[:2000]}, status=400)
            body = json.dumps({"columns": result.columns, "rows": result.rows}, default=str)
            return self.bytes(body.encode(), content_type="application/json")
