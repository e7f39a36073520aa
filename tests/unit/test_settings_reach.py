"""Every worker setting reaches the object that uses it: changed one at a time (by flag,
as an operator would), each lands in the wiring its role runs, and the top-level ones
where they act (the first case: a command's lifetime, on every controller's commands)."""

from __future__ import annotations

import ast
import dataclasses
import math
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from agents.sim.scenario import load_scenario
from agents.sim.simulation import Simulation
from controllers.guardrail import Guardrail
from controllers.isolation import IsolationLadder
from fleetloop.cli import build_parser
from fleetloop.cli.flags import leaves, settings_from
from fleetloop.settings import WorkerSettings
from fleetloop.wiring import WIRINGS, role_wiring, wirings
from fleetloop.worker import worker_config
from planning.demand import DemandPlanner, decide_warm
from planning.isolation import decide
from planning.pools import ControlPlanner
from planning.registry import INGEST, ROLES
from schemas.commands import Command
from schemas.verdicts import HealthStatus
from tests.factories import COMMAND_KEYS, START
from tests.unit.test_control_loop import SCENARIOS
from tests.unit.test_demand_planner import _demand
from tests.unit.test_isolation import _verdict

KEYS = ",".join(f"{kid}={key.decode()}" for kid, key in COMMAND_KEYS.items())


def _candidates(default: Any) -> Iterator[str]:
    """Flag values unlike ``default``, to try until one validates."""
    if isinstance(default, bool):
        yield str(not default).lower()
    elif isinstance(default, int):
        yield from (str(default + 1), str(max(default - 1, 0)))
    elif isinstance(default, float):
        if math.isinf(default):
            yield "12.5"
        yield from (repr(v) for v in (default * 1.1, default * 0.9, default + 0.01) if v != default)
    elif isinstance(default, tuple):
        yield ",".join(repr(x * 2) for x in default)
    elif isinstance(default, dict):
        yield "h100=31,mi300x=47"
    elif isinstance(default, str):
        yield default + "x"


def _group_leaves() -> Iterator[tuple[tuple[str, ...], Any]]:
    for path, _hint, default, _doc in leaves(WorkerSettings):
        if path[0] in WIRINGS:
            yield path, default


LEAVES = list(_group_leaves())


@pytest.mark.parametrize(("path", "default"), LEAVES, ids=[".".join(p) for p, _ in LEAVES])
def test_each_controller_setting_reaches_its_wiring(path: tuple[str, ...], default: Any) -> None:
    flag = "--" + ".".join(p.replace("_", "-") for p in path)
    for value in _candidates(default):
        args = build_parser().parse_args(["worker", flag, value])
        try:
            settings = settings_from(WorkerSettings, args)
        except SystemExit:
            continue  # outside what its config accepts: try another
        break
    else:
        pytest.fail(f"no value for {flag} validates")
    wiring = role_wiring(settings, path[0])
    reached: Any = wiring
    for part in path[1:]:
        reached = getattr(reached, part)
    assert reached != default, f"{flag} {value} did not reach the {path[0]} wiring"


def test_every_role_has_a_settings_group_and_wiring() -> None:
    groups = {
        n for n, f in WorkerSettings.model_fields.items() if dataclasses.is_dataclass(f.annotation)
    }
    assert groups == set(WIRINGS) == set(ROLES) - {INGEST}


def commands_of_every_controller(by_role: Mapping[str, Any]) -> list[Command]:
    """One command from each role's planner, each built from its wiring in ``by_role``."""
    health, demand, control = by_role["health"], by_role["demand"], by_role["control"]
    commands: list[Command | None] = []
    guard = Guardrail(health.guardrail, devices={"n0-gpu0": ("us-east-h100", "rack-0")})
    ladder = IsolationLadder(health.ladder, guard)
    for rung in ladder.verdict(_verdict("n0-gpu0", HealthStatus.FAILED, 1), now=START):
        commands.append(decide(rung, START, health).command)
    planner = DemandPlanner(demand)
    for s in range(0, 61):
        for step in planner.demand(_demand("gemma-27b", s, 30))[1]:
            commands.append(decide_warm(step, demand).command)
    sim = Simulation(load_scenario(SCENARIOS / "pdu-overload.yaml"), start=START)
    control_planner = ControlPlanner(control)
    for n in range(120):
        for _, event in sim.tick(n):
            commands += [o.command for o in control_planner.feed(event)]
    return [c for c in commands if c is not None]


def test_the_command_lifetime_reaches_every_controllers_commands() -> None:
    settings = WorkerSettings(command_keys=KEYS, command_ttl_s=37.0)
    commands = commands_of_every_controller(wirings(settings))
    assert {type(c).__name__ for c in commands} == {
        "RouteCommand",
        "WarmCommand",
        "ThrottleCommand",
    }
    for c in commands:
        assert c.expires_at - c.issued_at == timedelta(seconds=37.0), c


def test_the_process_settings_reach_the_worker_config() -> None:
    args = build_parser().parse_args(
        ["worker", "--batch-max", "1234", "--batch-within-s", "0.7", "--commit-interval-s", "1.9",
         "--session-timeout-s", "12", "--lag-interval-s", "7", "--topic-prefix", "t.",
         "--app-id", "a", "--web-port", "7001", "--web-bind", "0.0.0.0",
         "--processors", "health,control"]
    )  # fmt: skip
    settings = settings_from(WorkerSettings, args)
    config = worker_config(settings)
    assert (config.batch_max, config.batch_within_s, config.commit_interval_s) == (1234, 0.7, 1.9)
    assert (config.session_timeout_s, config.lag_interval_s, config.topic_prefix) == (
        12.0,
        7.0,
        "t.",
    )
    assert (config.app_id, config.web_port, config.web_bind) == ("a", 7001, "0.0.0.0")
    assert set(config.wirings) == {"health", "control"}
    assert all(w.topic_prefix == "t." for w in config.wirings.values())


def test_nested_settings_come_from_the_environment_under_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLEETLOOP_CONTROL__TPOT_GUARD__HIGH_RATIO", "0.9")
    monkeypatch.setenv("FLEETLOOP_CONTROL__PERIOD_S", "5")
    monkeypatch.setenv("FLEETLOOP_GC_TUNE", "false")
    args = build_parser().parse_args(["worker", "--control.period-s", "4"])
    settings = settings_from(WorkerSettings, args)
    assert settings.control.tpot_guard.high_ratio == 0.9  # env, beside a flag in its group
    assert settings.control.period_s == 4.0  # the flag wins over the environment
    assert settings.gc_tune is False
    monkeypatch.setenv("FLEETLOOP_PROCESSORS", "ingest,plan")
    with pytest.raises(ValueError, match="processors"):
        WorkerSettings()


def test_nothing_reads_the_environment_but_the_settings() -> None:
    """``os.environ.get``, ``os.getenv`` or ``os.environ[...]`` outside the settings would
    be a setting no flag, no help and no test knows of (copying the environment for a
    child process is not a read)."""
    root = Path(__file__).parents[2]
    packages = ("agents", "bench", "controllers", "fleetloop", "models", "planning", "schemas",
                "streams")  # fmt: skip
    reads = []
    for path in sorted(p for pkg in packages for p in (root / pkg).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            text = ast.unparse(node) if isinstance(node, ast.Call | ast.Subscript) else ""
            if text.startswith(("os.environ.get(", "os.getenv(", "os.environ[")):
                reads.append(f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}: {text}")
    assert not reads, reads
