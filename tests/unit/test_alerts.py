"""Prometheus config: alert rules parse, say what to do, and use only exported metrics."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "infra" / "prometheus"


def _exported() -> set[str]:
    names = set()
    for path in [*ROOT.glob("agents/**/*.py"), *ROOT.glob("streams/**/*.py")]:
        names |= set(re.findall(r'"(fleetloop_[a-z_]+)"', path.read_text()))
    return names


def test_every_alert_is_complete_and_uses_exported_metrics() -> None:
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    rules = [
        r for g in yaml.safe_load((PROM / "alerts.yml").read_text())["groups"] for r in g["rules"]
    ]
    assert len(rules) >= 8
    exported = _exported()
    for rule in rules:
        assert re.fullmatch(r"Fleetloop[A-Za-z]+", rule["alert"])
        assert rule["labels"]["severity"] in {"page", "ticket"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["runbook"], rule["alert"]
        for used in re.findall(r"fleetloop_[a-z_]+", rule["expr"]):
            base = re.sub(r"_(bucket|count|sum)$", "", used)
            assert base in exported, f"{rule['alert']} uses {used}, which nothing exports"
    jobs = {j["job_name"] for j in config["scrape_configs"]}
    assert any("fleetloop-.*" in r["expr"] for r in rules)  # the up{} rule covers every job
    assert all(j.startswith("fleetloop-") for j in jobs)
