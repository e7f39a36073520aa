"""Every evaluation runs what production runs: no evaluation module builds a production
controller, model or planner by hand, or a wiring, tuning or config of its own; each gets
its planners from worker settings through :mod:`fleetloop.wiring` (or the planning
package's own builders fed that wiring)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
EVALUATIONS = sorted((ROOT / "evaluations").glob("*.py"))
HARNESSES = {"control.py", "faults.py", "forecast.py", "nab.py"}
# The pool plant stands in for the serving engine, not a controller under test: its
# admission is the engine's value-aware shedder with the defaults the simulator's
# engine runs (agents.sim.state), so it may build that one by hand.
ENGINE = {"pool_plant.py": {"LoadShedder(...)", "ShedConfig(...)"}}
PRODUCTION = {
    "CapacityController", "TpotGuard", "PowerController", "GlobalBudget", "IsolationLadder",
    "Guardrail", "HealthDetector", "WarmingPolicy", "DemandForecaster", "RackPlanner",
}  # fmt: skip
PLANNERS = {"ControlPlanner", "RegionalControl", "DemandPlanner"}  # from a settings wiring


def _called(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def hand_assembly(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = _called(node)
        if name in PRODUCTION or name.endswith(("Wiring", "Tuning", "Config")):
            found.append(f"{node.lineno}: {name}(...)")
        elif name in PLANNERS:
            arg = node.args[0] if node.args else None
            if not (isinstance(arg, ast.Call) and _called(arg).endswith("_wiring")):
                found.append(f"{node.lineno}: {name} without a wiring from settings")
    return found


def test_no_evaluation_builds_a_controller_by_hand() -> None:
    assert {p.name for p in EVALUATIONS} >= HARNESSES
    found = {
        p.name: [
            line
            for line in hand_assembly(p.read_text())
            if line.split(": ", 1)[1] not in ENGINE.get(p.name, set())
        ]
        for p in EVALUATIONS
    }
    assert not any(found.values()), found


def test_the_check_catches_a_hand_assembly() -> None:
    assert hand_assembly("g = TpotGuard(TpotGuardConfig(high_ratio=1.0))")
    assert hand_assembly("p = ControlPlanner(ControlWiring(period_s=10.0))")
    assert hand_assembly("p = planning.pools.ControlPlanner(w)")
    assert not hand_assembly("p = ControlPlanner(control_wiring(settings))")
