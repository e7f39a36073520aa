"""The layering rules of ARCHITECTURE.md, enforced two ways.

import-linter checks the contracts in pyproject.toml over the real import
graph; the AST scan below is a second, dependency-free guard that also catches
imports hidden inside functions.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = {
    "faust",
    "mode",
    "aiokafka",
    "aiohttp",
    "pynvml",
    "river",
    "prometheus_client",
    "clickhouse_connect",
    "chdb",
}
OURS_BELOW_CLI = {"planning", "sre", "agents", "streams", "evaluations", "fleetloop"}
RULES = {
    "schemas": FRAMEWORKS | OURS_BELOW_CLI | {"controllers", "models"},
    "controllers": FRAMEWORKS | OURS_BELOW_CLI | {"models"},
    "models": (FRAMEWORKS - {"river"}) | OURS_BELOW_CLI,
    "planning": FRAMEWORKS | OURS_BELOW_CLI - {"planning"},
    "sre": FRAMEWORKS | OURS_BELOW_CLI - {"sre"} | {"controllers", "models"},
    "agents": {"planning", "sre", "streams", "evaluations", "fleetloop"},
    "streams": {"agents", "evaluations", "fleetloop"},
    "evaluations": {"streams", "sre"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(RULES))
def test_package_imports_nothing_forbidden(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & RULES[package])
        for path in (ROOT / package).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_only_the_cli_runs_evaluations_and_evaluations_never_run_the_cli() -> None:
    cli = ROOT / "fleetloop" / "cli"
    wiring = [p for p in (ROOT / "fleetloop").rglob("*.py") if cli not in p.parents]
    offenders = {
        str(p.relative_to(ROOT)): sorted(
            m for m in _imported_modules(p) if m.split(".")[0] == "evaluations"
        )
        for p in wiring
    }
    offenders |= {
        str(p.relative_to(ROOT)): sorted(
            m for m in _imported_modules(p) if m.startswith("fleetloop.cli")
        )
        for p in (ROOT / "evaluations").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_import_linter_contracts_hold() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "import-linter is a test dependency; install the [test] extra"
    proc = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "broken" not in proc.stdout.lower() or "0 broken" in proc.stdout.lower()
