"""Wiring for `fleetloop worker`: settings -> store, topics, faust app, run."""

from __future__ import annotations

import asyncio
import gc
import logging
import os

import faust

from fleetloop.settings import WorkerSettings
from fleetloop.topics_admin import ensure_topics
from planning.demand import DemandWiring
from planning.isolation import HealthWiring
from planning.throttle import ControlWiring
from streams.app import WorkerConfig, create_app
from streams.clickhouse_store import open_store

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


def _command_key(settings: WorkerSettings) -> tuple[str, bytes] | None:
    """The key controllers sign with; None makes them advisory."""
    return settings.signing_key() if settings.command_keys is not None else None


def _health_wiring(settings: WorkerSettings) -> HealthWiring | None:
    if "health" not in settings.roles:
        return None
    key = _command_key(settings)
    if key is None:
        log.warning("no FLEETLOOP_COMMAND_KEYS: the isolation controller is advisory")
    return HealthWiring(
        topic_prefix=settings.topic_prefix, signing_key=key, command_ttl_s=settings.command_ttl_s
    )


def _demand_wiring(settings: WorkerSettings) -> DemandWiring | None:
    if "demand" not in settings.roles:
        return None
    key = _command_key(settings)
    return DemandWiring(
        topic_prefix=settings.topic_prefix,
        signing_key=key,
        replica_rps=settings.replica_rps,
        load_s=settings.load_s,
        load_s_by_accelerator=settings.load_times_s,
    )


def control_wiring(settings: WorkerSettings) -> ControlWiring | None:
    if "control" not in settings.roles:
        return None
    key = _command_key(settings)
    return ControlWiring(
        topic_prefix=settings.topic_prefix,
        signing_key=key,
        command_ttl_s=settings.command_ttl_s,
        period_s=settings.control_period_s,
        tpot_slo_s=settings.tpot_slo_s,
        global_budget_devices=settings.global_budget_devices,
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
    asyncio.run(ensure_topics(settings.kafka_bootstrap, prefix=settings.topic_prefix))
    config = WorkerConfig(
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
        health=_health_wiring(settings),
        demand=_demand_wiring(settings),
        control=control_wiring(settings),
    )
    settings.worker_dir.mkdir(parents=True, exist_ok=True)
    app = create_app(config, store)
    if os.environ.get("FLEETLOOP_GC_TUNE", "1") == "1":
        tune_gc()
    quiet = logging.getLevelName(loglevel.upper()) >= logging.WARNING
    worker = faust.Worker(app, loglevel=loglevel, quiet=quiet)
    try:
        worker.execute_from_commandline()
    finally:
        if store is not None:
            store.close()
