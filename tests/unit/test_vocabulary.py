"""One word per concept, checked over the source (issue 15, item 7).

- optional work is "optional", never "opportunistic";
- a controller's time is an aware ``datetime`` (why: ``controllers/__init__.py``):
  no ``now`` or ``*_at`` of a controller is a float;
- no single-letter parameters outside lambdas (loop variables are not parameters);
- no docstring sends the reader to "the module docstring" instead of saying what
  its class or function does.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "schemas", "controllers", "models", "planning", "sre", "agents", "streams",
    "evaluations", "fleetloop", "bench", "tests",
)  # fmt: skip
TEXT = ("*.py", "*.sql", "*.md", "*.yaml", "*.yml", "*.json")


def _sources(*packages: str) -> Iterator[Path]:
    for package in packages:
        yield from sorted((ROOT / package).rglob("*.py"))


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    args = node.args
    extra = [a for a in (args.vararg, args.kwarg) if a is not None]
    return [*args.posonlyargs, *args.args, *args.kwonlyargs, *extra]


def test_optional_work_has_one_name() -> None:
    offenders = []
    for place in (*PACKAGES, "infra", "scenarios"):
        for pattern in TEXT:
            for path in (ROOT / place).rglob(pattern):
                if path == Path(__file__).resolve():
                    continue
                if "opportunistic" in path.read_text(errors="replace").lower():
                    offenders.append(str(path.relative_to(ROOT)))
    if "opportunistic" in (ROOT / "README.md").read_text().lower():
        offenders.append("README.md")
    assert offenders == []


def _float_times(tree: ast.AST) -> Iterator[str]:
    """Every parameter, field or attribute of a controller that holds an instant (``now``,
    ``*_at``) and is annotated with anything but a datetime."""

    def timed(name: str) -> bool:
        return name == "now" or name.endswith("_at")

    def bad(annotation: ast.expr | None) -> bool:
        return annotation is not None and "datetime" not in ast.unparse(annotation)

    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for arg in _parameters(node):
                if timed(arg.arg) and bad(arg.annotation):
                    yield f"{node.name}({arg.arg}: {ast.unparse(arg.annotation)})"  # type: ignore[arg-type]
        elif isinstance(node, ast.AnnAssign):
            target = node.target
            name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
            if timed(name) and bad(node.annotation):
                yield f"{name}: {ast.unparse(node.annotation)}"


def test_controllers_keep_time_as_datetimes() -> None:
    found = {
        str(path.relative_to(ROOT)): list(_float_times(ast.parse(path.read_text())))
        for path in _sources("controllers")
    }
    assert {k: v for k, v in found.items() if v} == {}


def test_the_time_check_catches_a_float_clock() -> None:
    source = "def step(self, *, now: float) -> None:\n    self.fresh_at: float = now\n"
    assert list(_float_times(ast.parse(source))) == ["step(now: float)", "fresh_at: float"]


def test_no_single_letter_parameters() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}({arg.arg})"
        for path in _sources(*PACKAGES)
        for node in _functions(ast.parse(path.read_text()))
        for arg in _parameters(node)
        if len(arg.arg) == 1 and arg.arg != "_"
    ]
    assert found == []


def test_docstrings_say_what_they_document() -> None:
    found = []
    for path in _sources(*PACKAGES):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node) or ""
                if "module docstring" in doc.lower():
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert found == []
