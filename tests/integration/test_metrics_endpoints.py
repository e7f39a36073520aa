"""Every deployable's /metrics, scraped over HTTP while the closed loop runs: the families
the SREs alert on are there, in base units, with bounded labels."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.sim_proc import SimProcess, until
from tests.integration.worker_proc import WorkerProcess

UNIT_SUFFIXES = (
    "_total",
    "_seconds",
    "_bytes",
    "_watts",
    "_celsius",
    "_ratio",
    "_messages",
    "_created",
    "_bucket",
    "_count",
    "_sum",
)
COUNTS_OF = ("_devices",)  # gauges that count things: the thing is the unit
BOOLEANS = {"fleetloop_guardrail_locked_out"}  # 0 or 1
ID_LABELS = {"device_uuid", "node_id", "command_id", "event_id", "replica_id", "result_id"}


def _families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    out: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("fleetloop_"):
            out[family.name] = [(s.name, dict(s.labels), s.value) for s in family.samples]
    return out


def _check_conventions(families: dict[str, list[tuple[str, dict[str, str], float]]]) -> None:
    for name, samples in families.items():
        for sample_name, labels, value in samples:
            if sample_name in BOOLEANS:
                assert value in (0.0, 1.0), f"{sample_name} is a boolean, not {value}"
                continue
            assert sample_name.endswith(UNIT_SUFFIXES) or sample_name.endswith(
                ("_events", "_ticks", "_time_seconds", *COUNTS_OF)
            ), f"{sample_name}: no base unit"
            assert not ID_LABELS & set(labels), f"{name} labels by id: {labels}"
            assert all(re.fullmatch(r"[a-z_]+", k) for k in labels), labels


def test_worker_and_simulator_metrics(closed_loop: tuple[SimProcess, WorkerProcess]) -> None:
    sim, worker = closed_loop
    until(lambda: worker.metric("fleetloop_sink_rows_total") > 0, what="rows", proc=sim)
    until(
        lambda: "fleetloop_consumer_lag_messages{" in worker.get("/metrics").decode(),
        what="a lag measurement",
        proc=sim,
    )
    w = _families(worker.get("/metrics").decode())
    for name in (
        "fleetloop_ingest_events",
        "fleetloop_dead_letters",
        "fleetloop_processing_errors",
        "fleetloop_sink_rows",
        "fleetloop_consumer_lag_messages",
        "fleetloop_sink_insert_seconds",
        "fleetloop_verdicts",
        "fleetloop_decisions",
        "fleetloop_model_scoring_seconds",
        "fleetloop_isolated_devices",
        "fleetloop_guardrail_locked_out",
    ):
        assert name in w, f"worker lacks {name}"
    until(
        lambda: worker.metric("fleetloop_verdicts_total") > 0, what="verdicts", proc=sim
    )  # health runs in the same worker by default

    app_id = worker.args[worker.args.index("--app-id") + 1]

    def lag_groups() -> dict[str, set[str]]:  # measured one group after another: wait for all
        lag = _families(worker.get("/metrics").decode())["fleetloop_consumer_lag_messages"]
        out: dict[str, set[str]] = {}
        for _, labels, _ in lag:
            out.setdefault(labels["group"].removeprefix(app_id), set()).add(labels["topic"])
        return out

    # the ingest loop's group and the health detector's loop read the telemetry
    wanted = {".ingest", ".health.detect"}
    until(lambda: wanted <= set(lag_groups()), what="lag of every group", proc=sim)
    for group, topics in lag_groups().items():
        if group in wanted:
            assert any(t.endswith("telemetry.accelerator.v2") for t in topics), (group, topics)
    _check_conventions(w)

    with __import__("urllib.request").request.urlopen(sim.url + "/metrics", timeout=5) as r:
        s = _families(r.read().decode())
    for name in (
        "fleetloop_agent_events_published",
        "fleetloop_loop_ticks",
        "fleetloop_loop_behind_seconds",
        "fleetloop_executor_command_latency_seconds",
        "fleetloop_executor_commands",
        "fleetloop_executor_malformed",
    ):
        assert name in s, f"simulator lacks {name}"
    _check_conventions(s)
