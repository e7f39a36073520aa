"""The `fleetloop` command: thin wiring from flags and env vars to components.

One module per command group, each with a ``register(sub)`` that adds its
commands: :mod:`.infra` (kafka, topics, schemas), :mod:`.fleet` (agent, sim,
node), :mod:`.worker`, :mod:`.query` (sql, ask, report), :mod:`.demo` and
:mod:`.evaluate` (eval ...). Settings become flags in :mod:`.flags`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from aiokafka.errors import KafkaError

from fleetloop.cli import demo, evaluate, fleet, infra, query, worker

GROUPS = (infra, fleet, worker, query, demo, evaluate)
DESCRIPTION = "The fleetloop command: thin wiring from flags and env vars to components."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetloop", description=DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.register(sub)
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
