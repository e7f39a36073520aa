"""The faust worker: one ingest processor per ingested topic, the sink, the web surface.

Each processor is thin: take a batch of events, split it into valid events and
dead letters (pure), publish dead letters to ``<topic>.dlq``, write both to
ClickHouse, count, and only then ack the batch, so faust commits offsets only
for rows ClickHouse holds.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import faust
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from planning.issuing import IssuerWiring
from schemas.codec import encode
from schemas.commands import DeadLetter
from schemas.topics import INGESTED_TOPICS, TopicSpec
from sre.dashboards import load_dashboards, render_page
from sre.results import QueryResult
from streams.clickhouse_store import ClickHouseStore
from streams.control import add_control
from streams.demand import add_demand
from streams.fatal import fail_stop
from streams.health import add_health
from streams.ingest import RawMessage, split
from streams.lag import fetch_lag
from streams.outputs import ControllerMetrics, Outputs
from streams.page_access import PageAccess, refusal
from streams.rows import Coordinates
from streams.sink import ClickHouseSink, is_resent

log = logging.getLogger(__name__)


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
"""Each controller role's processors: ``add(app, wiring, outputs, registry, access)``
registers them (and their pages, behind ``access``) and returns the topics they read."""


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
        self.errors = Counter(
            "fleetloop_processing_errors_total",
            "Batches that failed in a processor",
            ["processor"],
            registry=registry,
        )
        self.lag = Gauge(
            "fleetloop_consumer_lag_messages",
            "Messages on the broker not yet committed by the worker's group, per source topic",
            ["topic"],
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
        topic_allow_declare=False,
    )
    metrics = IngestMetrics(registry)
    sources: list[TopicSpec] = []
    if store is not None:
        sink = ClickHouseSink(store, registry=registry)

        async def _moved(sender: Any, revoked: set[Any], **_: Any) -> None:
            # Another worker may write these partitions now: reload their marks if they return.
            sink.marks.forget((tp.topic, tp.partition) for tp in revoked)

        cast(Any, app.on_partitions_revoked).connect(_moved)
        for spec in INGESTED_TOPICS:
            _add_ingest(app, config, spec, sink, metrics, on_fatal)
        sources += INGESTED_TOPICS
    outputs = Outputs(
        app, ControllerMetrics(registry), topic_prefix=config.topic_prefix,
        roles=set(config.wirings),
    )  # fmt: skip
    for role, wiring in config.wirings.items():
        read = PROCESSORS[role](app, wiring, outputs, registry, config.page_access)
        sources += [s for s in read if s not in sources]
    _add_lag_timer(app, config, metrics, sources)
    _add_metrics_pages(app, store, registry)
    if store is not None:
        _add_clickhouse_pages(app, store, config.page_access)
    return app


def _add_ingest(
    app: faust.App,
    config: WorkerConfig,
    spec: TopicSpec,
    sink: ClickHouseSink,
    metrics: IngestMetrics,
    on_fatal: Callable[[str, BaseException], None],
) -> None:
    name = config.topic_prefix + spec.name
    source = app.topic(name, value_type=bytes, key_type=bytes, partitions=spec.partitions)
    dlq = app.topic(config.topic_prefix + spec.dlq_name, value_type=bytes, key_type=bytes)
    valid_count = metrics.events.labels(name, "valid")
    dead_count = metrics.events.labels(name, "dead_letter")

    async def handle(events: list[Any]) -> None:
        now = datetime.now(UTC)
        messages = [
            RawMessage(
                Coordinates(
                    e.message.topic, e.message.partition, e.message.offset,
                    resent=is_resent(e.message.headers),
                ),
                e.message.key,
                e.message.value,
            )
            for e in events
        ]  # fmt: skip
        result = split(messages, spec.value_type, now=now)
        fresh = await sink.unseen([*result.valid, *result.dead])  # drop what a replay re-read
        deliveries = []
        for letter, _at in fresh:
            if isinstance(letter, DeadLetter):
                key = (letter.source_key or "").encode()
                deliveries.append(await dlq.send(key=key, value=encode(letter)))
                metrics.dead_letters.labels(name, letter.error_kind).inc()
        await asyncio.gather(*deliveries)  # dead letters are durable before offsets move
        await sink.write_unseen(fresh, now=now)
        valid_count.inc(len(result.valid))
        dead_count.inc(len(result.dead))

    processor = f"ingest.{spec.name}"
    errors = metrics.errors.labels(processor)

    async def ingest(stream: Any) -> None:
        # noack_take, not take_events: take_events acks a batch in a finally block, so a
        # shutdown that cancels us mid-write would ack (and faust commit) rows never written.
        async for events in stream.noack_take(config.batch_max, within=config.batch_within_s):
            try:
                await handle(events)
            except Exception as exc:
                errors.inc()
                on_fatal(processor, exc)
                raise  # on_fatal ends the process; if it ever returns, never ack this batch
            for event in events:  # only now may faust commit these offsets
                await stream.ack(event)

    ingest.__name__ = ingest.__qualname__ = processor  # what faust logs
    app.agent(source, name=processor, concurrency=1)(ingest)


def _add_lag_timer(
    app: faust.App, config: WorkerConfig, metrics: IngestMetrics, sources: list[TopicSpec]
) -> None:
    topics = [config.topic_prefix + spec.name for spec in sources]

    async def consumer_lag() -> None:
        try:
            lag = await fetch_lag(config.bootstrap, config.app_id, topics)
        except Exception as exc:  # a metric must never stop the worker
            metrics.lag_errors.inc()
            log.warning("consumer lag not measured: %r", exc)
            return
        for topic, messages in lag.items():
            metrics.lag.labels(topic).set(messages)

    app.timer(interval=config.lag_interval_s, name="consumer_lag")(consumer_lag)


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
