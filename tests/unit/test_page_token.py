"""The pages' token: given, or made once per machine in a 0600 file the CLI reads."""

from __future__ import annotations

import stat
from pathlib import Path

from fleetloop.page_token import page_token
from fleetloop.settings import ConnectionSettings


def _settings(path: Path, **given: str) -> ConnectionSettings:
    return ConnectionSettings(page_token_file=path, **given)  # type: ignore[arg-type]


def test_a_given_token_is_used_as_is_and_nothing_is_written(tmp_path: Path) -> None:
    path = tmp_path / "page-token"
    assert page_token(_settings(path, page_token="given"), create=True) == "given"
    assert not path.exists()


def test_the_first_worker_makes_it_and_everyone_after_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "var" / "page-token"
    assert page_token(_settings(path), create=False) is None  # the CLI makes none
    made = page_token(_settings(path), create=True)
    assert made and len(made) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert page_token(_settings(path), create=True) == made  # a second worker
    assert page_token(_settings(path), create=False) == made  # the CLI
