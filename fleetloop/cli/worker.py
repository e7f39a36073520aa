"""`fleetloop worker`: one stream worker, its roles and controller settings."""

from __future__ import annotations

import argparse

from fleetloop.cli.flags import add_settings_flags, settings_from
from fleetloop.settings import WorkerSettings


def _cmd_worker(args: argparse.Namespace) -> int:
    from fleetloop.worker import run_worker

    run_worker(settings_from(WorkerSettings, args), loglevel=args.loglevel)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    worker = sub.add_parser("worker", help="run a stream worker")
    worker.add_argument("--loglevel", default="info")
    add_settings_flags(worker, WorkerSettings)
    worker.set_defaults(func=_cmd_worker)
