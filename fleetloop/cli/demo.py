"""`fleetloop demo`: the closed loop live on embedded defaults."""

from __future__ import annotations

import argparse

from fleetloop.cli.flags import add_settings_flags, settings_from
from fleetloop.settings import BrokerSettings, DemoSettings


def _cmd_demo(args: argparse.Namespace) -> int:
    from fleetloop.demo import run_demo

    return run_demo(
        settings_from(BrokerSettings, args),
        settings_from(DemoSettings, args),
        keep_running=args.keep_running,
        resume=args.resume,
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    add_settings_flags(demo, DemoSettings)
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
