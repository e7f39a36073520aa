"""Wiring for `fleetloop worker`: settings -> store, topics, faust app, run."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket

import faust

from fleetloop.page_token import page_token
from fleetloop.settings import WorkerSettings
from fleetloop.topics_admin import ensure_topics
from fleetloop.wiring import wirings
from streams.app import WorkerConfig, create_app
from streams.clickhouse_store import open_store
from streams.page_access import PageAccess

log = logging.getLogger(__name__)


def tune_gc() -> None:
    """Move start-up objects out of the collector's way and collect young objects less often.

    A batch of decoded events is tens of thousands of live objects; with the
    default thresholds every gen-2 collection walks them and everything faust
    allocated at start-up. Measured in bench.ingest_throughput.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def worker_config(settings: WorkerSettings) -> WorkerConfig:
    """What the faust app is built from: the process settings and each role's wiring."""
    return WorkerConfig(
        app_id=settings.app_id,
        bootstrap=settings.kafka_bootstrap,
        worker_dir=settings.worker_dir,
        web_port=settings.web_port,
        web_bind=settings.web_bind,
        commit_interval_s=settings.commit_interval_s,
        topic_prefix=settings.topic_prefix,
        batch_max=settings.batch_max,
        batch_within_s=settings.batch_within_s,
        session_timeout_s=settings.session_timeout_s,
        lag_interval_s=settings.lag_interval_s,
        wirings=wirings(settings),
        page_access=PageAccess.of(
            page_token(settings, create=True) or "",
            bind=settings.web_bind,
            names=(socket.gethostname(), *settings.page_names),
        ),
    )


def run_worker(settings: WorkerSettings, *, loglevel: str = "info") -> None:
    """Run one stream worker until SIGTERM/SIGINT."""
    store = None
    if "ingest" in settings.roles:
        store = open_store(
            url=settings.clickhouse_server_url,
            data_dir=settings.clickhouse_dir,
            database=settings.clickhouse_database,
        )
        store.apply_schema()
    asyncio.run(
        ensure_topics(
            settings.kafka_bootstrap,
            prefix=settings.topic_prefix,
            log_append_time=settings.topic_timestamps == "log_append",
        )
    )
    config = worker_config(settings)
    settings.worker_dir.mkdir(parents=True, exist_ok=True)
    app = create_app(config, store)
    if settings.gc_tune:
        tune_gc()
    quiet = logging.getLevelName(loglevel.upper()) >= logging.WARNING
    worker = faust.Worker(app, loglevel=loglevel, quiet=quiet)
    try:
        worker.execute_from_commandline()
    finally:
        if store is not None:
            store.close()
