"""The broker a benchmark runs against: ``KAFKA_BOOTSTRAP``'s, or a local one for the run."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fleetloop.kafka_broker import LocalKafkaBroker, free_port
from fleetloop.settings import REPO_ROOT, BrokerSettings, ConnectionSettings


@contextmanager
def bench_broker(home: Path) -> Iterator[str]:
    """Yield a bootstrap address; a broker started here is stopped on the way out."""
    connection = ConnectionSettings()
    if connection.broker_given:
        yield connection.kafka_bootstrap
        return
    broker = LocalKafkaBroker(
        BrokerSettings(
            broker_dir=home / "kafka",
            jar_dir=REPO_ROOT / ".cache" / "kafka",
            port=free_port(),
            controller_port=free_port(),
        )
    )
    broker.up()
    try:
        yield broker.bootstrap
    finally:
        broker.down()
