"""`fleetloop eval faults`: the whole pipeline against a scenario's injected faults.

``--in-process`` runs the same pure steps (detector, ladder, guardrail, the
executors acting on the simulated fleet) in one process on the simulated
clock instead: deterministic and quick, but without Kafka there is no
event-to-isolation latency to measure.


Starts the local broker (unless ``KAFKA_BOOTSTRAP`` names one), a stream
worker (ingest, health detection, the isolation ladder signing real commands)
and the simulated fleet with its executors, each in its own process, on topics
of their own (``eval-<run>.``). When the scenario has run, it reads every
verdict, decision and route command back from Kafka, with the broker's
timestamps, and scores them against the simulator's ground truth
(:mod:`evaluations.fault_scoring`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from agents.sim.control import SimControl
from agents.sim.family import draw_scenario, load_family
from agents.sim.noise import partition_of
from agents.sim.scenario import Scenario, load_scenario
from agents.sim.simulation import Simulation
from controllers.isolation import LadderDecision
from evaluations.fault_scoring import (
    FaultScore,
    aggregate,
    conditions_from_truth,
    faults_from_truth,
    score,
)
from fleetloop.kafka_broker import LocalKafkaBroker, free_port
from fleetloop.procs import get_json, spawn, stop_all, wait_for
from fleetloop.settings import BrokerSettings, WorkerSettings
from fleetloop.sim import build_dispatcher
from fleetloop.topics_admin import ensure_topics, read_topic
from fleetloop.wiring import health_wiring
from planning import isolation
from planning.isolation import attribute, decide
from schemas.codec import decode
from schemas.commands import RouteCommand
from schemas.events import AcceleratorTelemetry, NodeHealth, ServingMetrics
from schemas.topics import DECISIONS, ROUTE_COMMANDS, VERDICTS
from schemas.verdicts import Decision, Level, Verdict


@dataclass(frozen=True, slots=True)
class EvalRun:
    scenario: Path
    speed: float = 5.0
    nodes: int | None = None
    home: Path = Path("var/eval")


def write_scenario(scenario: Scenario, path: Path) -> Path:
    """``scenario`` as a scenario file (what the live run's simulator reads)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = scenario.model_dump(mode="json", exclude_none=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _say(message: str) -> None:
    print(f"[eval] {message}", file=sys.stderr, flush=True)


def run_eval_faults(
    broker_settings: BrokerSettings, run: EvalRun, *, bootstrap: str | None = None
) -> FaultScore:
    """Run the scenario through the pipeline and score it, on the broker at ``bootstrap``
    or, without one, a local broker started for the run."""
    scenario = load_scenario(run.scenario)
    if scenario.duration_s is None:
        raise ValueError(f"{run.scenario}: an evaluation needs a scenario with duration_s")
    run_id = uuid.uuid4().hex[:8]
    home = run.home / run_id
    prefix = f"eval-{run_id}."
    env = dict(os.environ)
    env.setdefault("FLEETLOOP_COMMAND_KEYS", f"eval={secrets.token_urlsafe(24)}")
    broker: LocalKafkaBroker | None = None
    if not bootstrap:
        broker = LocalKafkaBroker(broker_settings)
        _say(broker.up().describe())
        bootstrap = broker.bootstrap
    env["KAFKA_BOOTSTRAP"] = bootstrap
    procs = {}
    try:
        asyncio.run(ensure_topics(bootstrap, prefix=prefix))
        # two workers, as deployed: one owns ClickHouse, one judges health and isolates
        for role in ("ingest", "health"):
            url = f"http://127.0.0.1:{(port := free_port())}"
            procs[role] = spawn(
                role,
                ["worker", "--processors", role, "--web-port", str(port),
                 "--app-id", f"eval-{run_id}-{role}", "--topic-prefix", prefix,
                 "--clickhouse-dir", str(home / "clickhouse"),
                 "--worker-dir", str(home / f"faust-{role}"), "--batch-within-s", "0.5"],
                env,
                log_dir=home,
            )  # fmt: skip
            wait_for(partial(get_json, url + "/healthz"), procs, f"the {role} worker", 120)
        sim_port = free_port()
        procs["sim"] = spawn(
            "sim",
            ["sim", "--scenario", str(run.scenario), "--speed", str(run.speed),
             "--web-port", str(sim_port), "--topic-prefix", prefix,
             "--truth-file", str(home / "truth.jsonl"), "--spool-dir", "",
             "--seen-file", str(home / "seen-commands.json"),
             "--group-id", f"eval-{run_id}-executors",
             *(["--nodes", str(run.nodes)] if run.nodes else [])],
            env,
            log_dir=home,
        )  # fmt: skip
        budget_s = scenario.duration_s / run.speed + 120
        _say(
            f"{run.scenario.name}: {scenario.duration_s:g}s simulated at x{run.speed:g} "
            f"(about {scenario.duration_s / run.speed:.0f}s); logs in {home}"
        )
        started = time.monotonic()
        while procs["sim"].poll() is None:
            if time.monotonic() - started > budget_s:
                raise RuntimeError(f"the simulator ran past {budget_s:.0f}s (see {home}/sim.log)")
            for role in ("ingest", "health"):
                if procs[role].poll() is not None:
                    raise RuntimeError(f"the {role} worker exited (see {home}/{role}.log)")
            time.sleep(1.0)
        if procs["sim"].returncode != 0:
            raise RuntimeError(f"the simulator failed (see {home}/sim.log)")
        time.sleep(5.0)  # the last verdicts and decisions on their way
        messages = {
            spec.name: asyncio.run(read_topic(bootstrap, prefix + spec.name))
            for spec in (VERDICTS, DECISIONS, ROUTE_COMMANDS)
        }
    finally:
        stop_all(procs)
        if broker is not None:
            broker.down()
    verdicts = [decode(raw, Verdict) for raw, _ in messages[VERDICTS.name]]
    decisions = [decode(raw, Decision) for raw, _ in messages[DECISIONS.name]]
    # Telemetry records carry the simulator's clock, the world's (``speed`` times the
    # wall's): the broker time the detector judges on. Commands and verdicts carry the
    # workers' wall clock. So a cause-to-command latency is taken on the world's clock, to
    # the decision's instant (the ladder's event clock), and given back in wall seconds;
    # the verdict's own latency has no clock in common with its cause here and is left out.
    sent = {decode(raw, RouteCommand).command_id for raw, _ in messages[ROUTE_COMMANDS.name]}
    appended = {
        d.command_id: d.cause_appended_at + (d.decided_at - d.cause_appended_at) / run.speed
        for d in decisions
        if d.command_id in sent and d.cause_appended_at is not None
    }
    with (home / "decisions.jsonl").open("w") as f:  # for a closer look after the run
        for d in decisions:
            f.write(d.model_dump_json() + "\n")
    truth = [json.loads(line) for line in (home / "truth.jsonl").read_text().splitlines()]
    return _score(truth, verdicts, decisions, appended, observed_s=scenario.duration_s)


def _score(
    truth: list[dict[str, Any]],
    verdicts: list[Verdict],
    decisions: list[Decision],
    appended: dict[uuid.UUID, datetime],
    *,
    observed_s: float,
) -> FaultScore:
    """The run scored against its truth file, the devices placed as their verdicts said."""
    layout = {v.device_uuid: (v.node_id, v.rack_id) for v in verdicts if v.level is Level.DEVICE}
    return score(
        faults_from_truth(truth, layout), verdicts, decisions, appended,
        observed_s=observed_s, conditions=conditions_from_truth(truth, layout),
    )  # fmt: skip


def run_in_process(run: EvalRun, *, seed: int | None = None) -> FaultScore:
    """The closed loop without Kafka: every step's events through the detector, each
    verdict through the ladder, each allowed step signed and handled by the executors."""
    return run_scenario_in_process(load_scenario(run.scenario), nodes=run.nodes, seed=seed)


def run_scenario_in_process(
    scenario: Scenario, *, nodes: int | None = None, seed: int | None = None
) -> FaultScore:
    """:func:`run_in_process` on a scenario already loaded (or drawn from a family)."""
    if scenario.duration_s is None:
        raise ValueError(f"{scenario.name}: an evaluation needs a scenario with duration_s")
    sim = Simulation(scenario, start=datetime(2026, 1, 1, tzinfo=UTC), nodes=nodes, seed=seed)
    key = ("eval", secrets.token_urlsafe(24).encode())
    logging.getLogger("agents.executors").setLevel(logging.WARNING)  # a line per command
    dispatcher = build_dispatcher(SimControl(sim.fleet), {key[0]: key[1]}, CollectorRegistry())
    # the health role as a worker builds it, from the same settings
    settings = WorkerSettings(command_keys=f"{key[0]}={key[1].decode()}")
    wiring = health_wiring(settings)
    detector, ladder = isolation.detector(wiring), isolation.ladder(wiring)
    verdicts: list[Verdict] = []
    decisions: list[Decision] = []

    def act(steps: list[LadderDecision]) -> None:
        for step in steps:
            out = decide(step, sim.now, wiring)
            decisions.append(out.decision)
            if out.command is not None:
                dispatcher.handle(out.command, now=sim.now, received_at=sim.now)

    judged = (AcceleratorTelemetry, NodeHealth, ServingMetrics)
    # as the worker reads it: stamped by the broker when it arrives (the agent's clock may
    # be off); where a partition lags, from its node's partition (what lags, lags together)
    noise = scenario.noise
    lag = noise.delayed_partitions > 0
    for n in range(sim.ticks or 0):
        out: list[Verdict] = []
        for _spec, event in sim.tick(n):
            if isinstance(event, judged):
                source = partition_of(event.node_id, noise.partitions) if lag else None
                out += detector.observe(event, appended_at=sim.now, source=source)
        out += detector.tick(sim.now)
        verdicts += out
        for v in out:
            if (attributed := attribute(v, sim.now)) is not None:
                decisions.append(attributed.decision)
            act(ladder.verdict(v, now=sim.now))
        act(ladder.tick(sim.now))
    truth = json.loads(json.dumps(sim.faults.truth(sim.fleet.start)))
    return _score(truth, verdicts, decisions, {}, observed_s=scenario.duration_s)


def run_family(
    family_path: Path,
    seeds: list[int],
    *,
    live: bool = False,
    speed: float = 5.0,
    home: Path = Path("var/eval"),
    broker_settings: BrokerSettings | None = None,
    bootstrap: str | None = None,
) -> dict[str, Any]:
    """Each seed's scenario of the family, run (in process, or ``live`` through the
    pipeline) and scored; the per-seed summaries and their aggregate (mean, worst)."""
    family = load_family(family_path)
    per_seed: dict[int, dict[str, Any]] = {}
    for seed in seeds:
        scenario = draw_scenario(family, seed)
        started = time.monotonic()
        if live:
            path = write_scenario(scenario, home / "families" / f"{family.name}-{seed}.yaml")
            run = EvalRun(path, speed=speed, home=home)
            result = run_eval_faults(broker_settings or BrokerSettings(), run, bootstrap=bootstrap)
        else:
            result = run_scenario_in_process(scenario)
        per_seed[seed] = summary = result.summary()
        _say(
            f"{scenario.name}: precision {summary['precision']}, recall {summary['recall']}, "
            f"{summary['false_isolations']} false isolations "
            f"({time.monotonic() - started:.0f}s)"
        )
    tuned = family.tune_seeds
    held_out = [s for s in seeds if tuned is None or not tuned[0] <= s <= tuned[1]]
    return {
        "family": family.name,
        "tune_seeds": list(tuned) if tuned else None,
        "seeds": seeds,
        "aggregate": aggregate(per_seed),
        "aggregate_held_out": aggregate({s: per_seed[s] for s in held_out}),
        "per_seed": {str(s): v for s, v in per_seed.items()},
    }


def format_family(result: dict[str, Any]) -> str:
    """A family's evaluation as a plain-text report: one line per seed, then the
    aggregates."""
    lines = [f"fault detection on the {result['family']} family, seeds {result['seeds']}", ""]
    head = f"{'seed':>6}{'precision':>11}{'recall':>8}{'false iso':>10}{'per 1k dd':>11}"
    lines.append(head + f"{'ttd p95 s':>11}  missed / false isolations / groups (unexplained)")
    for seed, s in result["per_seed"].items():
        lines.append(
            f"{seed:>6}{s['precision']:>11}{s['recall']:>8}{s['false_isolations']:>10}"
            f"{s['false_isolations_per_1k_device_days']:>11}{s['ttd_p95_s']!s:>11}  "
            f"{len(s['missed'])} / {len(s['false_isolation_causes'])} / "
            f"{s['group_detections']} ({len(s['group_detections_unexplained'])})"
        )
    for label in ("aggregate", "aggregate_held_out"):
        agg = result[label]
        if not agg:
            continue
        lines += ["", f"{label} over {agg['seeds']} seeds"]
        width = max(len(k) for k in agg) + 2  # the longest key still leaves a gap
        for key, value in agg.items():
            if key != "seeds":
                lines.append(f"  {key:<{width}}{value}")
    causes = [
        f"seed {seed}: {c}" for seed, s in result["per_seed"].items()
        for c in s["false_isolation_causes"]
    ]  # fmt: skip
    lines += ["", f"false isolations ({len(causes)}):", *causes[:40]]
    if len(causes) > 40:
        lines.append(f"... and {len(causes) - 40} more")
    return "\n".join(lines)


def format_score(name: str, summary: dict[str, Any]) -> str:
    """The score as a plain-text report."""
    lines = [f"fault detection on {name}", ""]
    lines.append(
        f"{'kind':<18}{'detected':>9}{'ttd p50 s':>11}{'ttd p95 s':>11}"
        f"{'isolated':>10}{'tti p50 s':>11}{'tti p95 s':>11}"
    )
    for kind, k in summary["per_kind"].items():
        lines.append(
            f"{kind:<18}{k['detected']:>9}{k['ttd_p50_s']!s:>11}{k['ttd_p95_s']!s:>11}"
            f"{k['isolated']:>10}{k['time_to_isolate_p50_s']!s:>11}"
            f"{k['time_to_isolate_p95_s']!s:>11}"
        )
    lines.append("")
    for key in (
        "precision", "recall", "faults", "detected", "detections", "true_detections",
        "false_isolations", "device_days", "false_isolations_per_1k_device_days",
        "ttd_p50_s", "ttd_p95_s", "hard_fault_latencies_measured", "hard_fault_verdict_p50_s",
        "hard_fault_verdict_p99_s", "hard_fault_isolation_p50_s", "hard_fault_isolation_p99_s",
        "group_detections",
    ):  # fmt: skip
        lines.append(f"{key:<38}{summary[key]}")
    lines.append(f"{'actions':<38}{summary['actions']}")
    lines.append(f"{'guardrail refusals':<38}{summary['refusals']}")
    shows = summary.get("missed_evidence", {})
    lines += [f"missed: {item}" + (f" ({shows[item]})" if item in shows else "")
              for item in summary["missed"]]  # fmt: skip
    lines += [f"not isolated: {item}" for item in summary["not_isolated"]]
    lines += [f"false isolation: {item}" for item in summary["false_isolation_causes"]]
    lines += [f"unexplained group: {item}" for item in summary["group_detections_unexplained"]]
    shown = summary["false_detections"][:20]
    lines += [f"false detection: {item}" for item in shown]
    if len(summary["false_detections"]) > len(shown):
        lines.append(f"... and {len(summary['false_detections']) - len(shown)} more")
    return "\n".join(lines)
