"""`fleetloop eval faults|nab|forecast|control`, each on the production planners."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fleetloop.cli.flags import settings_from
from fleetloop.settings import REPO_ROOT, BrokerSettings, ConnectionSettings


def family_path(name: str) -> Path:
    """A family's file: a path, or the name of one in ``scenarios/families``."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml", ".json") or path.exists():
        return path
    return REPO_ROOT / "scenarios" / "families" / f"{name}.yaml"


def _cmd_eval_faults(args: argparse.Namespace) -> int:
    from agents.sim.scenario import ScenarioError

    if (args.family is None) == (args.scenario is None):
        raise SystemExit("eval faults: give --scenario FILE or --family NAME --seeds A-B")
    try:
        return _eval_faults(args)
    except ScenarioError as exc:
        raise SystemExit(f"fleetloop eval faults: {exc}") from None


def _eval_faults(args: argparse.Namespace) -> int:
    from agents.sim.family import parse_seeds
    from evaluations.faults import (
        EvalRun,
        format_family,
        format_score,
        run_eval_faults,
        run_family,
        run_in_process,
    )

    if args.family is not None:
        connection = ConnectionSettings()
        result = run_family(
            family_path(args.family),
            parse_seeds(args.seeds or "1-5"),
            live=not args.in_process,
            speed=args.speed,
            broker_settings=settings_from(BrokerSettings, args),
            bootstrap=connection.kafka_bootstrap if connection.broker_given else None,
        )
        print(json.dumps(result, sort_keys=True) if args.json else format_family(result))
        return 0
    run = EvalRun(Path(args.scenario), speed=args.speed, nodes=args.nodes)
    if args.in_process:
        summary = run_in_process(run).summary()
    else:
        connection = ConnectionSettings()
        given = connection.kafka_bootstrap if connection.broker_given else None
        summary = run_eval_faults(
            settings_from(BrokerSettings, args), run, bootstrap=given
        ).summary()
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(format_score(run.scenario.name, summary))
    return 0


def _cmd_eval_nab(args: argparse.Namespace) -> int:
    from evaluations.nab import (
        format_loco,
        format_nab,
        leave_one_category_out,
        loco_categories,
        read_corpus,
        read_results,
        run_detector,
        score_corpus,
        write_results,
    )

    try:
        corpus, windows = read_corpus(Path(args.dir))
        if args.loco:
            loco_categories(corpus)  # before any detector runs, not after them all
    except (OSError, ValueError) as exc:
        flag = " --loco" if args.loco else ""
        raise SystemExit(f"fleetloop eval nab{flag}: {exc}") from None
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
    if args.loco:
        result["leave_one_category_out"] = leave_one_category_out(corpus, windows)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(format_nab(f"fleetloop's stream scorer on {args.dir}", result))
        print(f"windowed Gaussian baseline on the same files: {baseline['score_standard']}")
        if args.loco:
            print("\n" + format_loco(result["leave_one_category_out"]))
    return 0


def _cmd_eval_forecast(args: argparse.Namespace) -> int:
    from evaluations.forecast import format_forecast, run_eval_forecast

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
    from agents.sim.family import parse_seeds
    from agents.sim.scenario import ScenarioError
    from evaluations import control_family
    from evaluations.control import format_control, run_eval_control
    from evaluations.control_scenario import ControlScenarioError, load_control_scenario

    if sum(x is not None for x in (args.family, args.scenario, args.routing)) != 1:
        raise SystemExit(
            "eval control: give --scenario FILE, --family NAME --seeds A-B, or --routing [PAIR]"
        )
    if args.routing is not None:
        return _eval_routing(args)
    try:
        if args.family is not None:
            path = Path(args.family)
            if path.suffix not in (".yaml", ".yml") and not path.exists():
                path = REPO_ROOT / "scenarios" / "control" / "families" / f"{args.family}.yaml"
            family = control_family.run_family(path, parse_seeds(args.seeds or "1-5"))
            text = control_family.format_family(family)
            print(json.dumps(family, sort_keys=True) if args.json else text)
            return 0
        result = run_eval_control(load_control_scenario(Path(args.scenario)))
    except (ControlScenarioError, ScenarioError) as exc:
        raise SystemExit(f"fleetloop: {exc}") from None
    print(json.dumps(result, sort_keys=True) if args.json else format_control(result))
    return 0


def _eval_routing(args: argparse.Namespace) -> int:
    """Power-aware routing across pools: the pool-capped grid, off and on."""
    from evaluations import pool_routing

    only = None if args.routing == "all" else args.routing
    try:
        print(pool_routing.report(only, seconds=args.seconds, as_json=args.json))
    except ValueError as exc:
        raise SystemExit(f"eval control --routing {exc}") from None
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    evaluate = sub.add_parser("eval", help="score the detectors and controllers")
    evals = evaluate.add_subparsers(dest="evaluation", required=True)
    faults = evals.add_parser(
        "faults", help="inject a scenario's faults into the full pipeline; score health"
    )
    faults.add_argument("--scenario", help="scenario file with duration_s")
    faults.add_argument(
        "--family", help="a scenario family (scenarios/families/NAME.yaml, or a file)"
    )
    faults.add_argument(
        "--seeds", help="the family's seeds to draw, e.g. 1-5 or 101-120,130 (default 1-5)"
    )
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
        "--loco",
        action="store_true",
        help="also validate leaving one category out (settings and threshold from the others)",
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
    control.add_argument("--scenario", help="control scenario file (YAML)")
    control.add_argument(
        "--family", help="a control family (scenarios/control/families/NAME.yaml, or a file)"
    )
    control.add_argument(
        "--seeds", help="the family's seeds to draw, e.g. 1-5 or 101-120 (default 1-5)"
    )
    control.add_argument(
        "--routing",
        nargs="?",
        const="all",
        metavar="PAIR",
        help="instead: routing across pools when a rack's feed is cut, on the pool-capped "
        "grid (48 variants, or one pairing such as A100/H100), off then on",
    )
    control.add_argument(
        "--seconds", type=float, default=480.0, help="with --routing: simulated s a variant"
    )
    control.add_argument("--json", action="store_true", help="one JSON object on stdout")
    control.set_defaults(func=_cmd_eval_control)
