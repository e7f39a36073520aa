"""Settings: the one home of every option, one frozen class per deployable, validated
at start-up.

Every option is reachable by environment variable (``FLEETLOOP_<NAME>``, plus
the two well-known ones ``KAFKA_BOOTSTRAP`` and ``CLICKHOUSE_URL``) and by a
CLI flag (``--<name-with-dashes>``, see :mod:`fleetloop.cli.flags`). The stream
worker's controller settings are nested groups, one per role, whose fields and
defaults are the planners' own tuning classes (declared once, in
:mod:`planning`): ``FLEETLOOP_CONTROL__TPOT_GUARD__HIGH_RATIO=0.9`` or
``--control.tpot-guard.high-ratio 0.9``. Nothing else reads the environment.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, BeforeValidator, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from planning.demand import DemandTuning
from planning.isolation import HealthTuning
from planning.issuing import COMMAND_TTL_S
from planning.registry import ROLES
from planning.throttle import ControlTuning

REPO_ROOT = Path(__file__).resolve().parents[1]

OptionalPath = Annotated[Path | None, BeforeValidator(lambda v: None if v in ("", "none") else v)]
"""A path setting that ``''`` (or ``none``) turns off."""
INFRA_DIR = REPO_ROOT / "infra"


class _Base(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="FLEETLOOP_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
        populate_by_name=True,
    )


class BrokerSettings(_Base):
    """The local single-node KRaft broker (`fleetloop kafka ...`)."""

    broker_dir: Path = Field(Path("var/kafka"), description="broker data, config and logs")
    jar_dir: Path = Field(
        REPO_ROOT / ".cache" / "kafka", description="jar cache (resolved from Maven Central)"
    )
    port: int = Field(9092, ge=1, le=65535)
    controller_port: int = Field(9093, ge=1, le=65535)
    heap: str = Field("-Xms512m -Xmx1g", description="JVM heap flags")
    start_timeout_s: float = Field(90.0, gt=0)
    java: str = "java"
    mvn: str = "mvn"


class ConnectionSettings(_Base):
    """Where Kafka and ClickHouse are."""

    kafka_bootstrap: str = Field(
        "127.0.0.1:9092",
        validation_alias=AliasChoices("KAFKA_BOOTSTRAP", "FLEETLOOP_KAFKA_BOOTSTRAP"),
        description="Kafka bootstrap servers, host:port[,host:port]",
    )
    clickhouse_url: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("CLICKHOUSE_URL", "FLEETLOOP_CLICKHOUSE_URL"),
        description="ClickHouse server URL (http://user:pass@host:8123); embedded when unset",
    )
    clickhouse_dir: Path = Field(Path("var/clickhouse"), description="embedded chDB data dir")
    clickhouse_database: str = "fleetloop"

    @property
    def broker_given(self) -> bool:
        """Whether a broker was named (flag or environment), not the default taken."""
        return "kafka_bootstrap" in self.model_fields_set

    @property
    def clickhouse_server_url(self) -> str | None:
        """The server URL with its credentials (kept out of reprs and logs otherwise)."""
        return None if self.clickhouse_url is None else self.clickhouse_url.get_secret_value()

    topic_prefix: str = Field("", description="prepended to every topic name (isolation)")
    topic_timestamps: Literal["log_append", "create"] = Field(
        "log_append",
        description="telemetry topics this process creates: log_append stamps records with "
        "the broker's clock (liveness is judged on it, never on an agent's); create keeps "
        "the producer's (a simulator, whose clock is its world's)",
    )
    query_url: str = Field(
        "http://127.0.0.1:6066",
        description="HTTP address of the worker that owns the embedded ClickHouse data",
    )
    page_token: SecretStr | None = Field(
        None,
        description="bearer token for /sql and the worker pages that change something; "
        "unset: the worker keeps one in page_token_file",
    )
    page_token_file: Path = Field(
        Path("var/page-token"),
        description="the token when page_token is unset: made by the first worker (mode 0600), "
        "read by the CLI on the same machine",
    )

    @field_validator("page_token", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value


class PublisherSettings(ConnectionSettings):
    """What every telemetry producer needs: where to spool what the broker misses."""

    spool_dir: OptionalPath = Field(
        Path("var/spool"),
        description="disk spool for events the broker did not acknowledge ('' disables it)",
    )
    spool_max_bytes: int = Field(256 * 1024**2, gt=0, description="spool bound; oldest dropped")
    send_timeout_s: float = Field(10.0, gt=0, description="wait this long for an ack, then spool")


class AgentSettings(PublisherSettings):
    """The simulated node agent (`fleetloop agent`)."""

    nodes: int = Field(10, ge=1)
    devices_per_node: int = Field(8, ge=1, le=16)
    interval_s: float = Field(1.0, gt=0)
    ticks: int | None = Field(None, ge=1, description="stop after this many ticks")
    seed: int = 7
    metrics_port: int | None = Field(None, ge=0, le=65535, description="Prometheus port")
    metrics_bind: str = Field("127.0.0.1", description="address the metrics port binds")


class CommandKeySettings(_Base):
    """HMAC keys for commands, by key id, so keys can rotate: executors accept every
    listed key; issuers sign with ``command_key_id`` (the first key when unset)."""

    command_keys: SecretStr | None = Field(
        None, description="comma-separated key_id=secret pairs (FLEETLOOP_COMMAND_KEYS)"
    )
    command_key_id: str | None = Field(None, description="key id to sign with")

    def verification_keys(self) -> dict[str, bytes]:
        """Every configured key by id; a clear error when none is configured."""
        if self.command_keys is None:
            raise ValueError(
                "no command keys: set FLEETLOOP_COMMAND_KEYS=key_id=secret[,key_id=secret]"
            )
        keys: dict[str, bytes] = {}
        for part in self.command_keys.get_secret_value().split(","):
            kid, sep, secret = part.strip().partition("=")
            if not sep or not kid or len(secret) < 16:
                raise ValueError(
                    "FLEETLOOP_COMMAND_KEYS entries are key_id=secret with at least 16 characters"
                )
            keys[kid] = secret.encode()
        return keys

    def signing_key(self) -> tuple[str, bytes]:
        keys = self.verification_keys()
        kid = self.command_key_id or next(iter(keys))
        if kid not in keys:
            raise ValueError(f"command_key_id {kid!r} is not among the configured keys")
        return kid, keys[kid]


class LoopSettings(PublisherSettings, CommandKeySettings):
    """A closed loop on the node side: telemetry out, commands in (`sim`, `node`)."""

    web_port: int = Field(6070, ge=0, le=65535, description="metrics and health")
    web_bind: str = "127.0.0.1"
    group_id: str | None = Field(None, description="consumer group of the executors")


class SimSettings(LoopSettings):
    """The closed-loop fleet simulator with its executors (`fleetloop sim`)."""

    scenario: Path | None = Field(None, description="scenario file (YAML); a steady fleet if unset")
    topic_timestamps: Literal["log_append", "create"] = Field(
        "create", description="a simulator's records carry its own clock: the world's time"
    )
    nodes: int | None = Field(None, ge=1, description="override the scenario's node count")
    speed: float = Field(1.0, gt=0, le=1000, description="simulated seconds per wall second")
    seed: int | None = Field(None, description="override the scenario's seed")
    ticks: int | None = Field(None, ge=1, description="stop after this many steps")
    truth_file: OptionalPath = Field(
        Path("var/sim/truth.jsonl"), description="ground truth of injected faults (JSON lines)"
    )
    web_port: int = Field(6070, ge=0, le=65535, description="router table, metrics and health")
    group_id: str | None = Field(
        "fleetloop-sim-executors", description="consumer group of the executors"
    )
    spool_dir: OptionalPath = Field(Path("var/sim-spool"), description="disk spool ('' disables)")
    seen_file: OptionalPath = Field(
        Path("var/sim/seen-commands.json"),
        description="command ids already handled, kept across restarts ('' disables)",
    )


class DemoSettings(SimSettings):
    """The live demo (`fleetloop demo`): the simulator's settings, five times real time."""

    speed: float = Field(5.0, gt=0, le=1000, description="simulated seconds per wall second")


class NodeSettings(LoopSettings):
    """The agent and node executor of a real GPU host (`fleetloop node`), through NVML."""

    node_id: str = Field(default_factory=socket.gethostname, description="this host's node id")
    region: str = Field("unknown", description="where this host sits: region")
    pod_id: str = Field("unknown", description="pod")
    rack_id: str = Field("unknown", description="rack")
    pdu_id: str = Field("unknown", description="the PDU feeding the rack")
    interval_s: float = Field(1.0, gt=0, description="seconds between samples")
    ticks: int | None = Field(None, ge=1, description="stop after this many samples")
    web_port: int = Field(6071, ge=0, le=65535, description="metrics and health")
    group_id: str | None = Field(None, description="consumer group (default: one per node)")
    spool_dir: OptionalPath = Field(Path("var/node-spool"), description="disk spool ('' disables)")
    seen_file: OptionalPath = Field(
        Path("var/node-state/seen-commands.json"),
        description="command ids already handled, kept across restarts ('' disables)",
    )


class WorkerSettings(ConnectionSettings, CommandKeySettings):
    """The faust stream worker (`fleetloop worker`). With command keys its controllers
    sign and send commands; without, they are advisory (decisions only)."""

    app_id: str = "fleetloop"
    worker_dir: Path = Field(Path("var/worker"), description="faust data dir of this worker")
    web_port: int = Field(6066, ge=1, le=65535, description="metrics, health and /sql")
    web_bind: str = Field("127.0.0.1", description="address the web port binds")
    page_names: tuple[str, ...] = Field(
        (),
        description="names the pages answer to besides loopback, the bound address and this "
        "machine's name (a service name, a proxy's); any other Host is refused",
    )
    commit_interval_s: float = Field(2.8, gt=0, description="Kafka offset commit interval")
    batch_max: int = Field(
        10_000,
        ge=1,
        le=100_000,
        description="ingest: Kafka messages per fetch; a ClickHouse insert holds one fetch, "
        "or the fetches that waited while the last insert ran",
    )
    batch_within_s: float = Field(1.0, gt=0, description="ingest: flush at least this often")
    session_timeout_s: float = Field(10.0, gt=0)
    lag_interval_s: float = Field(15.0, gt=0, description="how often consumer lag is measured")
    gc_tune: bool = Field(True, description="freeze start-up objects, collect young ones less")
    processors: str = Field(
        ",".join(ROLES),
        description="what this worker runs, comma-separated: " + ", ".join(ROLES),
    )
    command_ttl_s: float = Field(
        COMMAND_TTL_S, gt=0, description="lifetime of the commands every controller issues"
    )
    health: HealthTuning = Field(
        default_factory=HealthTuning, description="health detection and isolation"
    )
    demand: DemandTuning = Field(
        default_factory=DemandTuning, description="demand forecasting and warming"
    )
    control: ControlTuning = Field(
        default_factory=ControlTuning, description="capacity, batch and power control"
    )

    @field_validator("processors")
    @classmethod
    def _known_roles(cls, value: str) -> str:
        roles = value.split(",")
        unknown = [r for r in roles if r not in ROLES]
        if unknown or not value or len(set(roles)) != len(roles):
            raise ValueError(f"processors are distinct names among {', '.join(ROLES)}: {value!r}")
        return value

    @property
    def roles(self) -> set[str]:
        return set(self.processors.split(","))
