"""`fleetloop eval control`: the pool plant under three policies, on the shipped scenarios."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetloop.cli import main

SCENARIOS = Path(__file__).parents[2] / "scenarios" / "control"


@pytest.mark.parametrize("name", ["mix", "shifts", "holdout"])
def test_eval_control_reports_every_policy_on_the_same_scenario(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = SCENARIOS / f"{name}.yaml"
    assert main(["eval", "control", "--scenario", str(scenario), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("slo_attainment", "harvest_vs_oracle", "breaker_violations",
                "actions_per_300s_oscillation", "settling_periods_after_step"):  # fmt: skip
        for suffix in ("", "_static", "_hpa"):
            assert isinstance(out[key + suffix], int | float), key + suffix
    # what the production assembly holds on every scenario
    assert out["breaker_violations"] == 0
    assert out["slo_attainment"] >= 0.998
    assert 0 < out["harvest_vs_oracle"] <= 1
    for step in ("reaction_periods_after_step", "reaction_periods_after_step_down"):
        assert out[step] is not None and out[step] <= 2
    # and better than the two baselines on the same draws
    assert out["slo_attainment"] > out["slo_attainment_static"]
    assert out["harvest_vs_oracle"] > max(out["harvest_vs_oracle_static"],
                                          out["harvest_vs_oracle_hpa"])  # fmt: skip


OSCILLATION_OPEN = pytest.mark.xfail(
    strict=True,
    reason="the production ControlPlanner acts 2.2 (mix) and 3.0 (shifts) times per 300 s on "
    "a +-5% oscillation, where the target is <= 1: the rack planner caps a device at the "
    "oscillation's peaks and lifts it 300 s later, and the budget still moves with some "
    "peaks. SLO and harvest hold. Open: issue 19",
)


@pytest.mark.parametrize(
    "name",
    [pytest.param("mix", marks=OSCILLATION_OPEN), pytest.param("shifts", marks=OSCILLATION_OPEN),
     "holdout"],
)  # fmt: skip
def test_the_control_targets_hold_on_the_production_assembly(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", "control", "--scenario", str(SCENARIOS / f"{name}.yaml"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["slo_attainment"] >= 0.999
    assert 0.9 <= out["harvest_vs_oracle"] <= 1
    assert out["actions_per_300s_oscillation"] <= 1.0


def test_a_bad_control_scenario_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nduration_s: 60\nbaseline: [{at_s: 5, level: 0.3}]\nrogue: 1\n")
    with pytest.raises(SystemExit, match=r"rogue|start at 0"):
        main(["eval", "control", "--scenario", str(bad)])
