"""The `fleetloop` command: thin wiring from flags and env vars to components."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
import typing
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from aiokafka.errors import KafkaError
from pydantic import SecretStr, ValidationError
from pydantic_settings import BaseSettings

from fleetloop.settings import (
    AgentSettings,
    BrokerSettings,
    ConnectionSettings,
    DemoSettings,
    NodeSettings,
    SimSettings,
    WorkerSettings,
)

S = TypeVar("S", bound=BaseSettings)


def _leaves(cls: type[BaseSettings]) -> Iterator[tuple[tuple[str, ...], Any, Any, str | None]]:
    """Every settings field as (path, type, default, description), nested groups walked
    down to their leaves (a group is a dataclass: a role's tuning, a controller's config)."""

    def walk(
        path: tuple[str, ...], hint: Any, default: Any, doc: str | None
    ) -> Iterator[tuple[tuple[str, ...], Any, Any, str | None]]:
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            hints = typing.get_type_hints(hint)
            for f in dataclasses.fields(hint):
                yield from walk((*path, f.name), hints[f.name], getattr(default, f.name), None)
        else:
            yield path, hint, default, doc

    for name, field in cls.model_fields.items():
        default = field.get_default(call_default_factory=True)
        yield from walk((name,), field.annotation, default, field.description)


def _add_settings_flags(parser: argparse.ArgumentParser, cls: type[BaseSettings]) -> None:
    """One ``--flag`` per settings field, nested ones dotted (``--control.period-s``);
    unset flags fall through to env and defaults."""
    for path, _hint, default, doc in _leaves(cls):
        flag = ".".join(p.replace("_", "-") for p in path)
        env = "FLEETLOOP_" + "__".join(path).upper()
        shown = default.get_secret_value() and "***" if isinstance(default, SecretStr) else default
        parser.add_argument(
            "--" + flag,
            dest="setting__" + "__".join(path),
            default=argparse.SUPPRESS,
            metavar=path[-1].upper(),
            help=f"{doc + '; ' if doc else ''}default {shown!r}; env {env}",
        )


def _flag_value(raw: str, hint: Any) -> Any:
    """A flag's text as its field wants it: mappings as ``a=1,b=2`` or JSON, sequences as
    ``1,2,3`` or JSON; everything else as given (pydantic converts it)."""
    origin = typing.get_origin(hint) or hint
    if isinstance(origin, type) and issubclass(origin, Mapping):
        if raw.lstrip().startswith("{"):
            return json.loads(raw)
        pairs = [item.split("=", 1) for item in raw.split(",") if item.strip()]
        if any(len(p) != 2 for p in pairs):
            raise SystemExit(f"fleetloop: {raw!r} is not key=value[,key=value]")
        return {k.strip(): v.strip() for k, v in pairs}
    if isinstance(origin, type) and issubclass(origin, tuple | list):
        return json.loads(raw) if raw.lstrip().startswith("[") else raw.split(",")
    return raw


def _settings(cls: type[S], args: argparse.Namespace) -> S:
    """``cls`` from the flags given, over the environment, over the defaults."""
    hints = {path: hint for path, hint, _, _ in _leaves(cls)}
    overrides: dict[str, Any] = {}
    for key, value in vars(args).items():
        path = tuple(key.removeprefix("setting__").split("__"))
        if not key.startswith("setting__") or path not in hints:
            continue
        group = overrides
        for part in path[:-1]:
            group = group.setdefault(part, {})
        group[path[-1]] = _flag_value(value, hints[path]) if isinstance(value, str) else value
    try:
        return cls(**overrides)
    except ValidationError as exc:
        raise SystemExit(f"fleetloop: bad settings for {cls.__name__}:\n{exc}") from None


def _cmd_kafka(args: argparse.Namespace) -> int:
    from fleetloop.kafka_broker import BrokerError, LocalKafkaBroker

    broker = LocalKafkaBroker(_settings(BrokerSettings, args))
    try:
        if args.action == "fetch":
            print(f"kafka {broker.version} jars in {broker.fetch()}")
        elif args.action == "up":
            print(broker.up().describe())
        elif args.action == "status":
            status = broker.status()
            print(status.describe())
            return 0 if status.reachable else 3
        elif args.action == "down":
            broker.down()
            print("kafka down")
        elif args.action == "logs":
            print(broker.log_tail(200))
    except BrokerError as exc:
        print(f"fleetloop kafka {args.action}: {exc}", file=sys.stderr)
        return 1
    return 0


def _cmd_topics(args: argparse.Namespace) -> int:
    from fleetloop.topics_admin import ensure_topics

    settings = _settings(ConnectionSettings, args)
    created = asyncio.run(ensure_topics(settings.kafka_bootstrap, prefix=settings.topic_prefix))
    print(f"created {len(created)} topics" + (": " + ", ".join(created) if created else ""))
    return 0


def _cmd_schemas(args: argparse.Namespace) -> int:
    from schemas.export import export_json_schemas

    for path in export_json_schemas(Path(args.directory)):
        print(path)
    return 0


def _cmd_agent(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry, start_http_server

    from agents.publisher import KafkaPublisher
    from agents.runner import run_agent
    from agents.simulated import SimulatedFleetAgent
    from agents.spool import DiskSpool

    settings = _settings(AgentSettings, args)
    registry = CollectorRegistry()
    if settings.metrics_port is not None:
        start_http_server(settings.metrics_port, addr=settings.metrics_bind, registry=registry)
    agent = SimulatedFleetAgent(
        nodes=settings.nodes,
        devices_per_node=settings.devices_per_node,
        seed=settings.seed,
        start=datetime.now(UTC),
        interval_s=settings.interval_s,
    )

    async def main() -> int:
        spool = (
            DiskSpool(settings.spool_dir, max_bytes=settings.spool_max_bytes)
            if settings.spool_dir is not None
            else None
        )
        async with KafkaPublisher(
            settings.kafka_bootstrap,
            topic_prefix=settings.topic_prefix,
            registry=registry,
            spool=spool,
            send_timeout_s=settings.send_timeout_s,
        ) as publisher:
            return await run_agent(
                agent,
                publisher,
                ticks=settings.ticks,
                interval_s=settings.interval_s,
                on_tick=lambda n, sent: logging.info("tick %d: %d events acknowledged", n, sent),
            )

    sent = asyncio.run(main())
    print(f"published {sent} events")
    return 0


def _cmd_sim(args: argparse.Namespace) -> int:
    from agents.sim.scenario import ScenarioError
    from fleetloop.sim import run_sim

    settings = _settings(SimSettings, args)
    try:
        settings.verification_keys()
        return run_sim(settings)
    except (ScenarioError, ValueError) as exc:
        print(f"fleetloop sim: {exc}", file=sys.stderr)
        return 1


def _cmd_node(args: argparse.Namespace) -> int:
    from fleetloop.node import run_node

    settings = _settings(NodeSettings, args)
    try:
        settings.verification_keys()
    except ValueError as exc:
        print(f"fleetloop node: {exc}", file=sys.stderr)
        return 1
    try:
        return run_node(settings)
    except Exception as exc:  # NVML missing or refusing: say so plainly
        if type(exc).__name__.startswith("NVMLError"):
            print(f"fleetloop node: NVML: {exc} (is the NVIDIA driver loaded?)", file=sys.stderr)
            return 1
        raise


def _cmd_worker(args: argparse.Namespace) -> int:
    from fleetloop.worker import run_worker

    run_worker(_settings(WorkerSettings, args), loglevel=args.loglevel)
    return 0


def _cmd_sql(args: argparse.Namespace) -> int:
    from fleetloop.sqlclient import QueryError, format_table, run_query

    try:
        result = run_query(_settings(ConnectionSettings, args), args.query)
    except QueryError as exc:
        print(f"fleetloop sql: {exc}", file=sys.stderr)
        return 1
    if args.format == "json":
        print(json.dumps({"columns": result.columns, "rows": result.rows}, default=str))
    else:
        print(format_table(result))
    return 0


def _cmd_ask(args: argparse.Namespace) -> int:
    from fleetloop.report import run_ask
    from fleetloop.sqlclient import QueryError
    from streams.questions import QuestionError

    try:
        return run_ask(_settings(ConnectionSettings, args), args.name, args.param, args.format)
    except (QuestionError, QueryError) as exc:
        print(f"fleetloop ask: {exc}", file=sys.stderr)
        return 1


def _cmd_report(args: argparse.Namespace) -> int:
    from fleetloop.report import run_report
    from fleetloop.sqlclient import QueryError

    try:
        return run_report(_settings(ConnectionSettings, args), Path(args.out), args.device)
    except QueryError as exc:
        print(f"fleetloop report: {exc}", file=sys.stderr)
        return 1


def _cmd_demo(args: argparse.Namespace) -> int:
    from fleetloop.demo import run_demo

    return run_demo(
        _settings(BrokerSettings, args),
        _settings(DemoSettings, args),
        keep_running=args.keep_running,
        resume=args.resume,
    )


def _cmd_eval_faults(args: argparse.Namespace) -> int:
    from fleetloop.eval_faults import EvalRun, format_score, run_eval_faults, run_in_process

    run = EvalRun(Path(args.scenario), speed=args.speed, nodes=args.nodes)
    if args.in_process:
        summary = run_in_process(run).summary()
    else:
        connection = ConnectionSettings()
        given = connection.kafka_bootstrap if connection.broker_given else None
        summary = run_eval_faults(_settings(BrokerSettings, args), run, bootstrap=given).summary()
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(format_score(run.scenario.name, summary))
    return 0


def _cmd_eval_nab(args: argparse.Namespace) -> int:
    from fleetloop.eval_nab import (
        format_nab,
        read_corpus,
        read_results,
        run_detector,
        score_corpus,
        write_results,
    )

    corpus, windows = read_corpus(Path(args.dir))
    if args.score_only:
        results = Path(args.score_only)
        detectors = args.detector or sorted(p.name for p in results.iterdir() if p.is_dir())
        out = {d: score_corpus(read_results(results, d, corpus), windows) for d in detectors}
        if args.json:
            print(json.dumps(out, sort_keys=True))
        else:
            print("\n\n".join(format_nab(f"NAB scores of {d}", r) for d, r in out.items()))
        return 0
    scored = run_detector(corpus)
    if args.out:
        write_results(scored, Path(args.out), "fleetloop")
    result = score_corpus(scored, windows)
    # the baseline, measured in the same run on the same files
    baseline = score_corpus(run_detector(corpus, "windowed_gaussian"), windows)
    result["baseline_windowed_gaussian"] = baseline["score_standard"]
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(format_nab(f"fleetloop's stream scorer on {args.dir}", result))
        print(f"windowed Gaussian baseline on the same files: {baseline['score_standard']}")
    return 0


def _cmd_eval_forecast(args: argparse.Namespace) -> int:
    from fleetloop.eval_forecast import format_forecast, run_eval_forecast

    result = run_eval_forecast(
        Path(args.trace),
        args.format,
        step_s=args.step_s,
        replica_rps=args.replica_rps,
        load_s=args.load_s,
        keepalive_s=args.keepalive_s,
    )
    print(json.dumps(result, sort_keys=True) if args.json else format_forecast(result))
    return 0


def _cmd_eval_control(args: argparse.Namespace) -> int:
    from fleetloop.control_scenario import ControlScenarioError, load_control_scenario
    from fleetloop.eval_control import format_control, run_eval_control

    try:
        scenario = load_control_scenario(Path(args.scenario))
    except ControlScenarioError as exc:
        raise SystemExit(f"fleetloop: {exc}") from None
    result = run_eval_control(scenario)
    print(json.dumps(result, sort_keys=True) if args.json else format_control(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetloop", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    kafka = sub.add_parser("kafka", help="local single-node Kafka broker")
    kafka.add_argument("action", choices=["fetch", "up", "status", "down", "logs"])
    _add_settings_flags(kafka, BrokerSettings)
    kafka.set_defaults(func=_cmd_kafka)

    topics = sub.add_parser("topics", help="create the registry's topics")
    topics.add_argument("action", choices=["create"])
    _add_settings_flags(topics, ConnectionSettings)
    topics.set_defaults(func=_cmd_topics)

    schemas = sub.add_parser("schemas", help="contract tools")
    schemas.add_argument("action", choices=["export"])
    schemas.add_argument("directory")
    schemas.set_defaults(func=_cmd_schemas)

    agent = sub.add_parser("agent", help="run the simulated node agents")
    _add_settings_flags(agent, AgentSettings)
    agent.set_defaults(func=_cmd_agent)

    sim = sub.add_parser(
        "sim", help="run the closed-loop fleet simulator with its executors against Kafka"
    )
    _add_settings_flags(sim, SimSettings)
    sim.set_defaults(func=_cmd_sim)

    node = sub.add_parser(
        "node", help="a real GPU host: NVML telemetry and the node executor (power, clocks)"
    )
    _add_settings_flags(node, NodeSettings)
    node.set_defaults(func=_cmd_node)

    worker = sub.add_parser("worker", help="run a stream worker")
    worker.add_argument("--loglevel", default="info")
    _add_settings_flags(worker, WorkerSettings)
    worker.set_defaults(func=_cmd_worker)

    sql = sub.add_parser("sql", help="query ClickHouse (embedded or server)")
    sql.add_argument("query")
    sql.add_argument("--format", choices=["table", "json"], default="table")
    _add_settings_flags(sql, ConnectionSettings)
    sql.set_defaults(func=_cmd_sql)

    ask = sub.add_parser("ask", help="answer one SRE question (no name: list them)")
    ask.add_argument("name", nargs="?")
    ask.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE")
    ask.add_argument("--format", choices=["table", "json"], default="table")
    _add_settings_flags(ask, ConnectionSettings)
    ask.set_defaults(func=_cmd_ask)

    report = sub.add_parser("report", help="every SRE question as tables, and an HTML report")
    report.add_argument("--out", default="var/report.html", help="where the HTML report goes")
    report.add_argument("--device", help="device for the timeline (default: last isolated)")
    _add_settings_flags(report, ConnectionSettings)
    report.set_defaults(func=_cmd_report)

    demo = sub.add_parser("demo", help="live demo on embedded defaults")
    demo.add_argument(
        "--keep-running",
        action="store_true",
        help="keep the worker serving until Ctrl-C and leave the broker up",
    )
    demo.add_argument(
        "--resume",
        action="store_true",
        help="keep var/ from an earlier run (broker data, ClickHouse, worker state); "
        "by default the demo starts clean",
    )
    _add_settings_flags(demo, DemoSettings)
    for name in ("broker_dir", "jar_dir", "port", "controller_port"):
        field = BrokerSettings.model_fields[name]
        demo.add_argument(
            "--" + name.replace("_", "-"),
            dest=f"setting__{name}",
            default=argparse.SUPPRESS,
            metavar=name.upper(),
            help=f"local broker: {field.description or f'(default: {field.default})'}",
        )
    demo.set_defaults(func=_cmd_demo)

    evaluate = sub.add_parser("eval", help="score the detectors and controllers")
    evals = evaluate.add_subparsers(dest="evaluation", required=True)
    faults = evals.add_parser(
        "faults", help="inject a scenario's faults into the full pipeline; score health"
    )
    faults.add_argument("--scenario", required=True, help="scenario file with duration_s")
    faults.add_argument("--speed", type=float, default=5.0, help="simulated s per wall s")
    faults.add_argument("--nodes", type=int, help="override the scenario's node count")
    faults.add_argument("--json", action="store_true", help="one JSON object on stdout")
    faults.add_argument(
        "--in-process",
        action="store_true",
        help="the same steps in one process on the simulated clock: no Kafka, no latency",
    )
    faults.set_defaults(func=_cmd_eval_faults)
    nab = evals.add_parser("nab", help="the online stream scorer on a NAB-layout corpus")
    nab.add_argument("dir", help="corpus: data/<category>/*.csv and labels/combined_windows.json")
    nab.add_argument("--json", action="store_true", help="one JSON object on stdout")
    nab.add_argument("--out", help="also write our scores in NAB's results layout here")
    nab.add_argument(
        "--score-only",
        metavar="RESULTS_DIR",
        help="score detector outputs in NAB's results layout instead of running ours",
    )
    nab.add_argument(
        "--detector", action="append", help="with --score-only: only this detector (repeatable)"
    )
    nab.set_defaults(func=_cmd_eval_nab)
    forecast = evals.add_parser(
        "forecast", help="a request trace through the forecaster and three warming policies"
    )
    forecast.add_argument("--trace", required=True, help="the trace file")
    forecast.add_argument("--format", required=True, choices=["azure-llm", "rate-csv"])
    forecast.add_argument("--json", action="store_true", help="one JSON object on stdout")
    forecast.add_argument("--step-s", type=float, default=60.0, help="forecast step")
    forecast.add_argument("--replica-rps", type=float, default=10.0, help="one replica serves")
    forecast.add_argument("--load-s", type=float, default=60.0, help="a replica loads in")
    forecast.add_argument(
        "--keepalive-s", type=float, default=600.0, help="the fixed keep-alive baseline"
    )
    forecast.set_defaults(func=_cmd_eval_forecast)
    control = evals.add_parser(
        "control", help="a pool through a control scenario: our controllers, static, HPA-style"
    )
    control.add_argument("--scenario", required=True, help="control scenario file (YAML)")
    control.add_argument("--json", action="store_true", help="one JSON object on stdout")
    control.set_defaults(func=_cmd_eval_control)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        result: Any = args.func(args)
    except KafkaError as exc:
        retry = " (retriable: is the broker up? `fleetloop kafka up`)" if exc.retriable else ""
        print(f"fleetloop {args.command}: Kafka error: {exc}{retry}", file=sys.stderr)
        return 2
    return int(result)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
