"""`fleetloop eval control`: the pool plant under three policies, on the shipped scenarios."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluations.control import OracleLedger, run_policy
from evaluations.control_family import (
    _aggregate,
    draw_control_scenario,
    format_family,
    load_control_family,
)
from fleetloop.cli import main

SCENARIOS = Path(__file__).parents[2] / "scenarios" / "control"


@pytest.mark.parametrize("name", ["mix", "shifts", "holdout"])
def test_eval_control_reports_every_policy_on_the_same_scenario(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = SCENARIOS / f"{name}.yaml"
    assert main(["eval", "control", "--scenario", str(scenario), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # a step is scored for every policy or for none (none: it came while an event was on,
    # as holdout's step up does, inside a breaker event); each scenario scores one at least
    settling = [k for k in ("settling_periods_after_step", "settling_periods_after_step_down")
                if k in out]  # fmt: skip
    assert settling
    for key in ("slo_attainment", "harvest_vs_oracle", "breaker_violations",
                "actions_per_300s_oscillation", *settling):  # fmt: skip
        for suffix in ("", "_static", "_hpa"):
            assert isinstance(out[key + suffix], int | float), key + suffix
    # what the production assembly holds on every scenario
    assert out["breaker_violations"] == 0
    assert out["slo_attainment"] >= 0.998
    assert 0 < out["harvest_vs_oracle"] <= 1
    for step in ("reaction_periods_after_step", "reaction_periods_after_step_down"):
        if step in out:
            assert out[step] is not None and out[step] <= 2
    # and better than the two baselines on the same draws
    assert out["slo_attainment"] > out["slo_attainment_static"]
    assert out["harvest_vs_oracle"] > max(out["harvest_vs_oracle_static"],
                                          out["harvest_vs_oracle_hpa"])  # fmt: skip


@pytest.mark.parametrize("name", ["mix", "shifts", "holdout"])
def test_the_slo_and_harvest_targets_hold_on_the_production_assembly(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", "control", "--scenario", str(SCENARIOS / f"{name}.yaml"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["slo_attainment"] >= 0.999 and out["slo_attainment_oracle"] == 1.0
    assert 0.9 <= out["harvest_vs_oracle"] <= 1
    assert out["breaker_violations"] == 0
    # a slowdown: optional work and the batch cap cut within one period (the feedforward
    # and the token speed), and no breach outlasting it by more than two periods past the
    # oracle's own
    assert out["slowdown_budget_cut_periods"] <= 1 and out["slowdown_batch_cut_periods"] <= 1
    assert out["breach_after_slowdown_periods"] <= out["breach_after_slowdown_periods_oracle"] + 2


OSCILLATION_OPEN = pytest.mark.xfail(
    strict=True,
    reason="the production planner acts 1.25 times per 300 s in shifts' +-5% oscillation "
    "segments, where the target is <= 1: the budget follows the level the segment starts "
    "at, and then some of the oscillation's peaks. Open: issue 19",
)


@pytest.mark.parametrize(
    "name",
    [
        "mix",
        pytest.param("shifts", marks=OSCILLATION_OPEN),
        pytest.param("holdout", marks=pytest.mark.xfail(
            strict=True,
            reason="1.2 actions per 300 s in holdout's +-5% oscillation since the racks' "
            "power target rose to 0.95 of their limits (1.0 at 0.92): with more power to "
            "spend, optional work runs its pool nearer the SLO, and the capacity PID "
            "tracks one more of the oscillation's peaks. Open: issue 19",
        )),
    ],
)  # fmt: skip
def test_a_5pct_oscillation_takes_at_most_one_action_per_300s(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", "control", "--scenario", str(SCENARIOS / f"{name}.yaml"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["actions_per_300s_oscillation"] <= 1.0


def test_a_family_draws_the_same_scenario_for_a_seed_and_sums_up_the_held_out_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    family = load_control_family(SCENARIOS / "families" / "pool-mix.yaml")
    assert draw_control_scenario(family, 7) == draw_control_scenario(family, 7)
    assert draw_control_scenario(family, 7) != draw_control_scenario(family, 8)
    kinds = {s.kind for seed in range(1, 30) for s in draw_control_scenario(family, seed).baseline}
    assert kinds == {"steady", "step", "ramp", "oscillate", "trace"}  # real series among them
    assert main(["eval", "control", "--family", "pool-mix", "--seeds", "5-6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["per_seed"]) == {"5", "6"}
    held = out["aggregate_held_out"]
    assert held["seeds"] == 1  # seed 5 is a tuning seed
    seed6 = out["per_seed"]["6"]
    assert held["slo_attainment"]["mean"] == pytest.approx(seed6["slo_attainment"], abs=1e-4)
    assert 0 <= seed6["slo_attainment_oracle"] <= 1
    # the oracle held to the router's own mark carries no more than the one at the SLO: it
    # attains no more periods, and what ours harvests is no smaller a share of its room
    assert seed6["slo_attainment_oracle_at_mark"] <= seed6["slo_attainment_oracle"]
    assert seed6["harvest_vs_oracle_at_mark"] >= seed6["harvest_vs_oracle"]
    assert seed6["slo_shortfall_vs_oracle_at_mark"] == pytest.approx(
        max(0.0, seed6["slo_attainment_oracle_at_mark"] - seed6["slo_attainment"]), abs=1e-5
    )
    assert held["slo_shortfall_vs_oracle_at_mark"]["mean"] == pytest.approx(
        seed6["slo_shortfall_vs_oracle_at_mark"], abs=1e-4
    )
    pooled = held["actions_per_300s_oscillation_pooled"]
    assert (pooled["actions"], pooled["seconds"]) == (
        seed6["oscillation_actions"],
        seed6["oscillation_seconds"],
    )


def test_a_family_pools_its_oscillations_as_well_as_averaging_their_rates() -> None:
    """Three actions in a 79-s oscillation are 11.4 per 300 s, one in 900 s is 0.33: the
    mean of the two rates (5.9) says more about the short window than the controllers. A
    scenario with no oscillation has no rate (it had counted as 0, a calm one: on seeds 6-25
    five of them pulled the mean from 1.69 to 1.26)."""
    short = {"actions_per_300s_oscillation": 11.392, "oscillation_actions": 3,
             "oscillation_seconds": 79}  # fmt: skip
    long = {"actions_per_300s_oscillation": 0.333, "oscillation_actions": 1,
            "oscillation_seconds": 900}  # fmt: skip
    calm = {"oscillation_actions": 0, "oscillation_seconds": 0}  # none to judge: no rate
    agg = _aggregate([short, long, calm])
    assert agg["actions_per_300s_oscillation"]["mean"] == pytest.approx(5.8625)
    pooled = agg["actions_per_300s_oscillation_pooled"]
    assert pooled == {"actions": 4, "seconds": 979, "per_300s": pytest.approx(1.2257, abs=1e-4)}
    assert "actions_per_300s_oscillation_pooled_hpa" not in agg  # no such seconds: no figure


def test_a_report_with_no_held_out_seed_says_so() -> None:
    result = {"family": "x", "seeds": [1, 2], "tune_seeds": [1, 2], "per_seed": {},
              "aggregate_held_out": _aggregate([])}  # fmt: skip
    assert format_family(result).endswith(
        "held-out seeds: none (every seed drawn is one the family tunes on)"
    )


def test_a_bad_control_family_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\npool: {devices: [8, 16], rogue: 1}\n")
    with pytest.raises(SystemExit, match="rogue"):
        main(["eval", "control", "--family", str(bad), "--seeds", "1"])
    with pytest.raises(SystemExit, match="--scenario FILE, --family NAME"):
        main(["eval", "control"])
    with pytest.raises(SystemExit, match="--routing"):
        main(["eval", "control", "--family", "pool-mix", "--routing"])


def test_a_bad_control_scenario_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nduration_s: 60\nbaseline: [{at_s: 5, level: 0.3}]\nrogue: 1\n")
    with pytest.raises(SystemExit, match=r"rogue|start at 0"):
        main(["eval", "control", "--scenario", str(bad)])


def test_an_oscillation_is_not_charged_with_what_answers_an_event_inside_it() -> None:
    from evaluations.control import SETTLE_AFTER_EVENT_S, _disturbed
    from evaluations.control_scenario import ControlEvent, ControlScenario, Segment

    scn = ControlScenario(
        name="x", duration_s=1000, baseline=[Segment(at_s=0, level=0.3)],
        events=[ControlEvent(at_s=100, kind="breaker", duration_s=200)],
    )  # fmt: skip
    assert not _disturbed(scn, 99)
    assert _disturbed(scn, 100) and _disturbed(scn, 300 + SETTLE_AFTER_EVENT_S - 1)
    assert not _disturbed(scn, 300 + SETTLE_AFTER_EVENT_S)


def test_capped_devices_keep_the_slo_only_with_power_aware_routing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # mix: a rack loses a feed for ten minutes, and its devices are capped; a router that
    # balances by load alone leaves their requests a slower token than the pool's SLO
    scenario = str(SCENARIOS / "mix.yaml")
    assert main(["eval", "control", "--scenario", scenario, "--json"]) == 0
    routed = json.loads(capsys.readouterr().out)
    monkeypatch.setenv("FLEETLOOP_CONTROL__POWER_ROUTING__ENABLED", "false")
    assert main(["eval", "control", "--scenario", scenario, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert routed["slo_attainment"] >= 0.999 and plain["slo_attainment"] < routed["slo_attainment"]
    assert plain["breaker_violations"] == routed["breaker_violations"] == 0
    # what the capped devices' own requests see: over the SLO for some of the seconds they
    # were capped without it, none with it
    assert plain["held_device_seconds"] > 600 and routed["held_device_seconds"] > 600
    assert plain["held_device_over_slo_ratio"] > 0.002  # 0.48% (0.7% at the 0.92 target)
    assert routed["held_device_over_slo_ratio"] == 0.0
    # recorded as decisions with reasons: weighted down while capped, back once lifted
    said = routed["decisions"]
    assert said.get("power_routing/device_capped", 0) > 0
    assert said.get("power_routing/caps_lifted", 0) > 0
    assert routed["replicas_weighted_at_end"] == 0
    assert not any(k.startswith("power_routing/") for k in plain["decisions"])


def test_a_crowded_pool_gives_its_capped_replicas_every_share_they_can_carry() -> None:
    """Tuning seed 45 of pool-mix: two racks lose a feed at 3,668 s for 490 s, with the
    pool at its batch ceiling. Their capped replicas ran 14% under their peers' TPOT and
    their weights stalled a few percent short (a damped rise under half the tolerance is
    not sent): the queue grew through the whole event, 51 periods out of the SLO while
    the oracle kept them all. With mandatory work waiting a held replica's rise is taken
    like a fall."""
    family = load_control_family(SCENARIOS / "families" / "pool-mix.yaml")
    scn = draw_control_scenario(family, 45)
    breaker = [e for e in scn.events if e.kind == "breaker"]
    assert breaker and all(4000 < e.at_s + e.duration_s < 4300 for e in breaker)
    scn = scn.model_copy(update={"duration_s": 4300.0})
    tally = run_policy(scn, "ours")
    during = [(end, ok, attainable) for end, ok, attainable, _ in tally.record
              if breaker[0].at_s + 30 <= end <= 4300]  # fmt: skip
    assert all(attainable for _, _, attainable in during)
    missed = [end for end, ok, _ in during if not ok]
    assert len(missed) <= 2, missed
    assert tally.trips == 0


def test_the_oracle_owes_what_it_deferred_before_it_counts_room_for_optional_work() -> None:
    ledger = OracleLedger()
    # room for 0.6: 0.5 of baseline and 0.05 of batch leave 0.05 for optional work
    assert ledger.second(0.6, 0.5, 0.05) == pytest.approx(0.05)
    # a slowdown: it carries 0.4 of 0.5, and defers the batch work
    for _ in range(10):
        assert ledger.second(0.4, 0.5, 0.05) == 0.0
    assert ledger.backlog == pytest.approx(1.0) and ledger.batch_owed == pytest.approx(0.5)
    # back to 0.6: the baseline that waited drains first, then the batch work owed; only
    # then is there room for optional work again
    # (10 s at 0.1 a second for the baseline, 20 s at 0.05 net for the batch work)
    room = [ledger.second(0.6, 0.5, 0.05) for _ in range(60)]
    assert room[:29] == [0.0] * 29 and room[-1] == pytest.approx(0.05)
    assert sum(room) == pytest.approx(60 * 0.05 - 1.0 - 0.5)


def test_a_slowdown_of_one_second_is_scored_not_a_crash() -> None:
    """A slowdown as short as the scenario format allows (a second) has a response like
    any other; scoring it once failed on an empty max()."""
    from evaluations.control import Tally, _slowdown_response
    from evaluations.control_scenario import ControlEvent, ControlScenario, Segment

    scn = ControlScenario(
        name="x", duration_s=300, baseline=[Segment(at_s=0, level=0.3)],
        events=[ControlEvent(at_s=100, kind="slowdown", duration_s=1, ratio=1.05)],
    )  # fmt: skip
    tally = Tally(
        budgets=[(float(t), 0.3) for t in range(10, 301, 10)],
        record=[(float(t), True, True, 256) for t in range(10, 301, 10)],
        changes=[(0.0, 0.3, 256)],
    )
    out = _slowdown_response(scn, tally)
    # never cut and the SLO held throughout: no need; the cap (256) was over what a 5%
    # slowdown allows at this SLO, and it was never cut
    assert out["slowdown_budget_cut_periods"] == 0
    assert out["breach_after_slowdown_periods"] == 0


def test_slowdowns_that_overlap_are_scored_as_the_one_slowdown_the_pool_runs_at() -> None:
    """A 40% slowdown from 100 s to 400 s, and a 20% one from 200 s to 500 s: the second
    slows nothing as it begins (the pool already runs at the first), so there is nothing
    to cut for it, and the pool is slowed until 500 s, not 400 s."""
    from evaluations.control import Tally, _slowdown_response
    from evaluations.control_scenario import ControlEvent, ControlScenario, Segment

    scn = ControlScenario(
        name="x", duration_s=1000, baseline=[Segment(at_s=0, level=0.3)],
        events=[ControlEvent(at_s=100, kind="slowdown", duration_s=300, ratio=1.4),
                ControlEvent(at_s=200, kind="slowdown", duration_s=300, ratio=1.2)],
    )  # fmt: skip
    # optional work cut at the first close after the first began, and held there; the
    # baseline out of its SLO until 520 s (the oracle's until 510 s)
    tally = Tally(
        budgets=[(float(t), 0.3 if t < 110 else 0.1) for t in range(10, 1001, 10)],
        record=[(float(t), not 100 < t <= 520, not 100 < t <= 510, 256)
                for t in range(10, 1001, 10)],
        changes=[(0.0, 0.3, 256), (110.0, 0.1, 256)],
    )  # fmt: skip
    out = _slowdown_response(scn, tally)
    # the second's cut is no "never": it needed none (before, never cut for it at all)
    assert out["slowdown_budget_cut_periods"] == 1
    # out of the SLO for two periods after the pool's slowdown ended at 500 s (counted from
    # 400 s, while the second still slowed it, it read 12), the oracle for one
    assert out["breach_after_slowdown_periods"] == 2
    assert out["breach_after_slowdown_periods_oracle"] == 1


def test_a_slowdown_s_cut_is_timed_to_the_second_not_to_the_period_s_edges() -> None:
    """A slowdown that began 1.5 s before a period's end: a cut 3 s after it began (within
    the next period, at the report that showed it) is within one period; the same cut at
    the close after that, 11.5 s on, is two. Counted in period edges, both read two."""
    from evaluations.control import Tally, _slowdown_response
    from evaluations.control_scenario import ControlEvent, ControlScenario, Segment

    scn = ControlScenario(
        name="x", duration_s=300, baseline=[Segment(at_s=0, level=0.3)],
        events=[ControlEvent(at_s=98.5, kind="slowdown", duration_s=60, ratio=1.4)],
    )  # fmt: skip

    def periods(cut_at: float) -> tuple[int, int]:
        tally = Tally(
            budgets=[(float(t), 0.3 if t < cut_at else 0.1) for t in range(0, 300, 10)],
            record=[(float(t), True, True, 256) for t in range(10, 301, 10)],
            changes=[(0.0, 0.3, 256), (cut_at, 0.1, 161)],
        )
        out = _slowdown_response(scn, tally)
        return out["slowdown_budget_cut_periods"], out["slowdown_batch_cut_periods"]

    assert periods(101.0) == (1, 1)
    assert periods(110.0) == (2, 2)


def test_periods_short_of_the_oracle_are_told_apart_by_what_put_them_out() -> None:
    """A queue the oracle could not keep either is still draining when the oracle's has
    (it serves at exactly the SLO's token time): that period is the drain's, not the
    controller's queue. Periods the oracle could not hold, and periods within the SLO,
    are no shortfall at all."""
    from evaluations.control import Tally, _shortfall_by_cause

    periods = [  # (within the SLO, attainable by the oracle, what put it out)
        (True, True, ""), (False, False, "wait"), (False, True, "wait"), (False, True, "both"),
        (True, True, ""), (False, True, "tpot"), (False, True, "wait"), (False, True, "both"),
        (False, False, "tpot"), (True, True, ""),
    ]  # fmt: skip
    tally = Tally(
        record=[(10.0 * (i + 1), ok, att, 256) for i, (ok, att, _) in enumerate(periods)],
        out_causes=[cause for *_, cause in periods],
    )
    causes = _shortfall_by_cause(tally)
    assert causes == {"tpot": 1, "wait": 1, "both": 1, "drain": 2}
    agg = _aggregate([{"shortfall_periods_by_cause": causes}] * 2 + [{}])
    assert agg["shortfall_periods_by_cause"] == {"tpot": 2, "wait": 2, "both": 2, "drain": 4}


def test_a_step_taken_inside_an_event_is_not_scored_as_a_step_response() -> None:
    from evaluations.control import Tally, _step_response
    from evaluations.control_scenario import ControlEvent, ControlScenario, Segment

    def scenario(slowdown_at_s: float) -> ControlScenario:
        return ControlScenario(
            name="x", duration_s=1000,
            baseline=[Segment(at_s=0, level=0.3), Segment(at_s=500, kind="step", level=0.45)],
            events=[ControlEvent(at_s=slowdown_at_s, kind="slowdown", duration_s=300)],
        )  # fmt: skip

    # the budget held at 0 through a slowdown the step falls inside, then rising after it
    tally = Tally(budgets=[(t, 0.3 if t < 450 else 0.0 if t < 750 else 0.2)
                           for t in range(10, 1001, 10)])  # fmt: skip
    assert _step_response(scenario(slowdown_at_s=450), tally) == {}
    # the same slowdown after the step only ends its window: the step is scored up to it
    scored = _step_response(scenario(slowdown_at_s=700), tally)
    assert scored["reaction_periods_after_step"] is None  # never changed before the event
