from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleetloop.cli import build_parser, main
from fleetloop.cli.flags import settings_from
from fleetloop.settings import WorkerSettings


def test_flags_override_env_and_env_overrides_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "broker-a:9092")
    monkeypatch.setenv("FLEETLOOP_BATCH_MAX", "123")
    args = build_parser().parse_args(["worker", "--web-port", "7000"])
    settings = settings_from(WorkerSettings, args)
    assert settings.kafka_bootstrap == "broker-a:9092"
    assert settings.batch_max == 123 and settings.web_port == 7000
    args = build_parser().parse_args(["worker", "--kafka-bootstrap", "broker-b:9092"])
    assert settings_from(WorkerSettings, args).kafka_bootstrap == "broker-b:9092"


def test_bad_settings_exit_with_a_clear_message() -> None:
    args = build_parser().parse_args(["worker", "--web-port", "not-a-port"])
    with pytest.raises(SystemExit, match="web_port"):
        settings_from(WorkerSettings, args)


def test_load_times_per_accelerator_are_a_flag() -> None:
    flag = "--demand.load-s-by-accelerator"
    args = build_parser().parse_args(["worker", flag, "h100=30,mi300x=45.5"])
    settings = settings_from(WorkerSettings, args)
    assert settings.demand.load_s_by_accelerator == {"h100": 30.0, "mi300x": 45.5}
    assert WorkerSettings().demand.load_s_by_accelerator == {}
    args = build_parser().parse_args(["worker", flag, "h100:30"])
    with pytest.raises(SystemExit, match="key=value"):
        settings_from(WorkerSettings, args)
    args = build_parser().parse_args(["worker", flag, "h100=-1"])
    with pytest.raises(SystemExit, match="positive"):
        settings_from(WorkerSettings, args)


def test_evaluation_inputs_that_cannot_be_read_exit_with_the_file_and_why(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "nothing.yaml"
    for argv, says in (
        (["eval", "faults", "--scenario", str(missing), "--in-process"], "nothing.yaml"),
        (["eval", "faults", "--family", str(missing), "--in-process"], "nothing.yaml"),
        (["eval", "control", "--scenario", str(missing)], "nothing.yaml"),
    ):
        with pytest.raises(SystemExit, match=says):
            main(argv)


def test_schemas_export_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schemas", "export", str(tmp_path)]) == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert "WarmCommand.v1.schema.json" in files and len(files) >= 10
    assert json.loads((tmp_path / "RouteCommand.v1.schema.json").read_text())["type"] == "object"


def test_sql_opens_the_embedded_store_when_no_owner_answers(tmp_path: Path) -> None:
    # A fresh process: chDB allows one data directory per process.
    args = ["--clickhouse-dir", str(tmp_path / "ch"), "--query-url", "http://127.0.0.1:9"]
    run = [sys.executable, "-m", "fleetloop", "sql", "--format", "json", *args]
    out = subprocess.run(
        [*run, "SELECT 41 + 1 AS answer"], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"columns": ["answer"], "rows": [[42]]}
    # the database is the default: tables need no qualifying name
    plain = subprocess.run(
        [*run, "SELECT count() AS n FROM accelerator_telemetry"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout) == {"columns": ["n"], "rows": [[0]]}
    bad = subprocess.run(
        [*run, "SELEC nonsense"], capture_output=True, text=True, timeout=120, check=False
    )
    assert bad.returncode != 0
    assert "Syntax error" in bad.stderr or "SYNTAX_ERROR" in bad.stderr


def test_unreachable_kafka_is_a_clear_error_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["topics", "create", "--kafka-bootstrap", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "Kafka error" in err and "Traceback" not in err and "fleetloop kafka up" in err


def test_clickhouse_credentials_stay_out_of_reprs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLICKHOUSE_URL", "http://fleet:hunter2@ch:8123")
    settings = WorkerSettings()
    assert "hunter2" not in repr(settings) and "hunter2" not in str(settings)
    assert settings.clickhouse_server_url == "http://fleet:hunter2@ch:8123"


def test_sim_without_keys_or_with_a_bad_scenario_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("FLEETLOOP_COMMAND_KEYS", raising=False)
    assert main(["sim"]) == 1
    assert "set FLEETLOOP_COMMAND_KEYS" in capsys.readouterr().err
    monkeypatch.setenv("FLEETLOOP_COMMAND_KEYS", "k1=short")
    assert main(["sim"]) == 1
    assert "at least 16 characters" in capsys.readouterr().err
    monkeypatch.setenv("FLEETLOOP_COMMAND_KEYS", "k1=a-long-enough-secret,k2=another-long-secret")
    bad = tmp_path / "bad.yaml"
    bad.write_text("faults: [{kind: ecc_storm, start_s: 1, duration_s: 5}]")
    assert main(["sim", "--scenario", str(bad)]) == 1
    assert "give target.node and .device" in capsys.readouterr().err


def test_command_keys_rotate_by_key_id(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetloop.settings import SimSettings

    monkeypatch.setenv("FLEETLOOP_COMMAND_KEYS", "old=0123456789abcdef,new=fedcba9876543210")
    monkeypatch.setenv("FLEETLOOP_COMMAND_KEY_ID", "new")
    settings = SimSettings()
    assert set(settings.verification_keys()) == {"old", "new"}
    assert settings.signing_key() == ("new", b"fedcba9876543210")
    assert "fedcba" not in repr(settings)  # secrets stay out of reprs and logs
