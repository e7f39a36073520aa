"""docker-compose.yml cannot run here (no Docker engine), so check its structure."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings

from fleetloop.cli import build_parser
from fleetloop.settings import ConnectionSettings, SimSettings, WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
OURS = {"topics": ConnectionSettings, "worker": WorkerSettings, "sim": SimSettings}


def _env_names(cls: type[BaseSettings]) -> set[str]:
    names = set()
    for name, field in cls.model_fields.items():
        names.add("FLEETLOOP_" + name.upper())
        alias = field.validation_alias
        if alias is not None:
            names.update(str(choice) for choice in getattr(alias, "choices", [alias]))
    return names


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_image_is_pinned(name: str) -> None:
    image = SERVICES[name].get("image", "")
    assert re.fullmatch(r"[\w./-]+:v?\d+(\.\d+)+[\w.-]*", image), f"{name}: {image!r} not pinned"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_long_running_service_is_health_checked(name: str) -> None:
    service = SERVICES[name]
    if service.get("labels", {}).get("io.fleetloop.role") == "job":
        assert service.get("restart") == "no"
        return
    check = service.get("healthcheck", {})
    assert check.get("test"), f"{name} has no healthcheck"


@pytest.mark.parametrize("name", sorted(OURS))
def test_our_services_use_settings_the_code_reads(name: str) -> None:
    service = SERVICES[name]
    env = service["environment"]
    unknown = set(env) - _env_names(OURS[name])
    assert unknown == set(), f"{name} sets variables no settings class reads: {unknown}"
    assert env["KAFKA_BOOTSTRAP"] == "kafka:9092"
    assert env["CLICKHOUSE_URL"].startswith("http://")
    build_parser().parse_args([*service["command"]])  # a real subcommand


def test_dependencies_exist_and_prometheus_scrapes_our_ports() -> None:
    for name, service in SERVICES.items():
        for dep in service.get("depends_on", {}):
            assert dep in SERVICES, f"{name} depends on unknown {dep}"
    prom = yaml.safe_load((ROOT / "infra/prometheus/prometheus.yml").read_text())
    targets = {
        t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]
    }
    assert f"worker:{SERVICES['worker']['environment']['FLEETLOOP_WEB_PORT']}" in targets
    assert f"sim:{SERVICES['sim']['environment']['FLEETLOOP_WEB_PORT']}" in targets
    for setting in ("FLEETLOOP_WEB_BIND",):
        values = [
            s["environment"].get(setting)
            for s in SERVICES.values()
            if isinstance(s.get("environment"), dict)
        ]
        assert "0.0.0.0" in values, f"{setting} must open the port to Prometheus"


def test_the_image_copies_every_python_package() -> None:
    # a package the wheel includes but the image never copied fails only at run time
    root = Path(__file__).resolve().parents[2]
    include = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
    dockerfile = (root / "Dockerfile").read_text()
    for pattern in include:
        package = pattern.rstrip("*")
        assert f"COPY {package} ./{package}" in dockerfile, package


@pytest.mark.parametrize("name", ["worker", "health", "sim"])
def test_our_ports_are_published_on_loopback_unless_asked(name: str) -> None:
    for port in SERVICES[name]["ports"]:
        assert str(port).startswith("${FLEETLOOP_PUBLISH:-127.0.0.1}:"), port


@pytest.mark.parametrize("name", ["worker", "health"])
def test_guarded_pages_need_a_token_the_operator_sets(name: str) -> None:
    token = SERVICES[name]["environment"]["FLEETLOOP_PAGE_TOKEN"]
    assert token.startswith("${FLEETLOOP_PAGE_TOKEN:?"), "a default token is no token"
