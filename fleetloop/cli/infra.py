"""`fleetloop kafka`, `topics` and `schemas`: the broker, its topics, the contracts."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from fleetloop.cli.flags import add_settings_flags, settings_from
from fleetloop.settings import BrokerSettings, ConnectionSettings


def _cmd_kafka(args: argparse.Namespace) -> int:
    from fleetloop.kafka_broker import BrokerError, LocalKafkaBroker

    broker = LocalKafkaBroker(settings_from(BrokerSettings, args))
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

    settings = settings_from(ConnectionSettings, args)
    created = asyncio.run(
        ensure_topics(
            settings.kafka_bootstrap,
            prefix=settings.topic_prefix,
            log_append_time=settings.topic_timestamps == "log_append",
        )
    )
    print(f"created {len(created)} topics" + (": " + ", ".join(created) if created else ""))
    return 0


def _cmd_schemas(args: argparse.Namespace) -> int:
    from schemas.export import export_json_schemas

    for path in export_json_schemas(Path(args.directory)):
        print(path)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    kafka = sub.add_parser("kafka", help="local single-node Kafka broker")
    kafka.add_argument("action", choices=["fetch", "up", "status", "down", "logs"])
    add_settings_flags(kafka, BrokerSettings)
    kafka.set_defaults(func=_cmd_kafka)

    topics = sub.add_parser("topics", help="create the registry's topics")
    topics.add_argument("action", choices=["create"])
    add_settings_flags(topics, ConnectionSettings)
    topics.set_defaults(func=_cmd_topics)

    schemas = sub.add_parser("schemas", help="contract tools")
    schemas.add_argument("action", choices=["export"])
    schemas.add_argument("directory")
    schemas.set_defaults(func=_cmd_schemas)
