"""The demand planner: steps of demand -> forecasts with bands -> warm and cool decisions,
and the signed warm commands they become."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

import pytest

from controllers.guardrail import Guardrail, GuardrailConfig, GuardReason
from controllers.warming import WarmReason
from planning.demand import DemandPlanner, DemandWiring, ServingSteps, decide_warm
from schemas.commands import WarmAction
from schemas.derived import ServingStep
from schemas.events import Demand, ServingMetrics
from schemas.signing import verify
from schemas.verdicts import DecisionOutcome
from tests.factories import COMMAND_KEYS, START


def _demand(model: str, at_s: float, requests: int) -> Demand:
    return Demand(event_id=uuid.uuid4(), observed_at=START + timedelta(seconds=at_s),
                  model=model, region="us-east", interval_s=1.0, requests=requests,
                  prompt_tokens=0, generated_tokens=0)  # fmt: skip


def _serving(model: str, at_s: float, replica: str, requests: int) -> ServingMetrics:
    return ServingMetrics(
        event_id=uuid.uuid4(), observed_at=START + timedelta(seconds=at_s),
        replica_id=replica, node_id="node-00000", model=model, pool="us-east-b200",
        region="us-east", accelerator_type="B200", interval_s=1.0, queue_depth=0,
        batch_size=4, tokens_per_s=100.0, requests=requests, errors=0,
    )  # fmt: skip


def test_a_model_wanted_and_served_nowhere_is_warmed_on_the_default_pool() -> None:
    planner = DemandPlanner(DemandWiring(step_s=60.0, replica_rps=10.0))
    out = []
    for s in range(0, 130):
        out.append(planner.demand(_demand("gemma-27b", s, 5)))
    forecasts = [f for fs, _ in out for f in fs]
    steps = [st for _, sts in out for st in sts]
    assert {f.horizon_s for f in forecasts} == {60.0, 300.0, 900.0}
    first = forecasts[0]
    assert first.observed_rps == 5.0 and first.low_rps <= first.point_rps <= first.high_rps
    assert first.target_at - first.made_at == timedelta(seconds=first.horizon_s)
    warm = steps[0]
    assert (warm.pool, warm.decision.reason) == ("us-east-h100", WarmReason.DEMAND_NOW)
    assert warm.decision.replicas == 1  # 5 rps at 10 rps per replica
    # the next step: that replica is loading, so nothing more is asked for
    assert len(steps) == 1


def test_capacity_is_learned_from_what_replicas_carried_and_the_pool_that_serves() -> None:
    planner = DemandPlanner(DemandWiring(step_s=60.0, replica_rps=1.0))
    steps = []
    for s in range(0, 125):
        for r in ("a", "b"):
            planner.serving(_serving("qwen-7b", s, r, 20))  # each replica carries 20 rps
        steps += planner.demand(_demand("qwen-7b", s, 40))[1]
    # 40 rps over replicas that carried 20 each: two are enough; no warm (with 1 rps per
    # replica, the setting, it would have asked for 40)
    assert all(st.decision.replicas <= 0 for st in steps)
    key = planner.keys[("qwen-7b", "us-east")]
    assert key.capacity_rps == pytest.approx(20.0, rel=0.05)  # step edges blur a second


def test_decisions_sign_warm_commands_or_stay_advisory() -> None:
    planner = DemandPlanner(DemandWiring())
    steps = []
    for s in range(0, 61):
        steps += planner.demand(_demand("gemma-27b", s, 30))[1]
    [step] = steps
    kid, key = next(iter(COMMAND_KEYS.items()))
    out = decide_warm(step, DemandWiring(signing_key=(kid, key)))
    decision, command = out.decision, out.command
    assert command is not None and verify(command, keys={kid: key})
    assert (command.action, command.model, command.replicas) == (WarmAction.WARM, "gemma-27b", 3)
    assert command.target.pool == "us-east-h100" and command.decision_id == decision.decision_id
    assert (decision.controller, decision.outcome) == ("warming", DecisionOutcome.ISSUED)
    assert command.issuer == decision.controller
    advisory = decide_warm(step, DemandWiring())
    assert advisory.command is None and advisory.decision.outcome is DecisionOutcome.ADVISORY


def test_a_stale_step_is_refused_by_the_guardrail_and_recorded() -> None:
    planner = DemandPlanner(DemandWiring())
    steps = []
    for s in range(0, 61):  # the processor's clock says ten minutes have passed since
        late = START + timedelta(seconds=s + 600)
        steps += planner.demand(_demand("gemma-27b", s, 30), now=late)[1]
    [step] = steps
    assert not step.guard.allowed
    kid, key = next(iter(COMMAND_KEYS.items()))
    out = decide_warm(step, DemandWiring(signing_key=(kid, key)))
    decision, command = out.decision, out.command
    assert command is None
    assert (decision.outcome, decision.reason) == (DecisionOutcome.REFUSED, "stale_telemetry")


def test_steps_without_demand_are_learned_as_zeros() -> None:
    planner = DemandPlanner(DemandWiring())
    for s in range(0, 60):
        planner.demand(_demand("gemma-27b", s, 30))
    forecasts, _ = planner.demand(_demand("gemma-27b", 600, 30))  # nine quiet minutes later
    made = sorted({f.made_at for f in forecasts})
    assert len(made) == 10  # the step with demand, then nine with none
    assert [f.observed_rps for f in forecasts if f.horizon_s == 60.0][1:] == [0.0] * 9


def test_each_accelerators_load_time_is_a_horizon_and_sets_its_warm_deadline() -> None:
    w = DemandWiring(step_s=60.0, load_s=60.0, load_s_by_accelerator={"mi300x": 420.0})
    assert w.load_s_for("eu-west-mi300x") == 420.0 and w.load_s_for("us-east-b200") == 60.0
    planner = DemandPlanner(w)
    assert planner.horizon_steps == (1, 5, 7, 15)  # 420 s = 7 one-minute steps
    steps = []
    for s in range(0, 61):
        planner.serving(
            _serving("qwen-7b", s, "a", 10).model_copy(update={"pool": "us-east-mi300x"})
        )
        steps += planner.demand(_demand("qwen-7b", s, 30))[1]
    [step] = steps
    assert step.pool == "us-east-mi300x" and step.decision.replicas > 0
    kid, key = next(iter(COMMAND_KEYS.items()))
    command = decide_warm(
        step, DemandWiring(signing_key=(kid, key), load_s_by_accelerator={"mi300x": 420.0})
    ).command
    assert command is not None and command.deadline_at == step.at + timedelta(seconds=420)
    with pytest.raises(ValueError, match="positive"):
        DemandWiring(load_s_by_accelerator={"h100": 0.0})


def _fleet_second(second: int, replicas: int) -> list[ServingMetrics]:
    """One second of a model's replicas, each on its own node, each carrying what the
    demand of that second spreads over them."""
    out = []
    for j in range(replicas):
        out.append(ServingMetrics(
            event_id=uuid.uuid4(), observed_at=START + timedelta(seconds=second),
            replica_id=f"r{j}", node_id=f"node-{j:05d}", model="qwen-7b", pool="us-east-b200",
            region="us-east", accelerator_type="B200", interval_s=1.0, queue_depth=0,
            batch_size=4, tokens_per_s=100.0, requests=8 + (second + j) % 5, errors=0,
        ))  # fmt: skip
    return out


def _load(second: int) -> int:
    return 40 if second < 240 else 160 if second < 420 else 20  # a surge, then a lull


Outcome = list[tuple[Any, ...]]
"""Per close: its forecasts, its warms (> 0) and cools (< 0), and the capacity it used."""


def _asked(close: tuple[Any, ...]) -> int:
    return sum(step[1] for step in close[1])


def _split_run(
    *, late: bool, close_wait_s: float = DemandWiring.close_wait_s
) -> tuple[DemandPlanner, DemandPlanner, Outcome, Outcome]:
    """One model's replicas over three sources (partitions of node-keyed serving telemetry),
    each counting its own into ServingStep records as the worker does; the planner that
    owns the model (``split``) hears them interleaved, with copies (some late, after newer
    ones), and a source restarted mid-step re-reads and re-sends its last seconds; with
    ``late``, each second's counts after that second's demand (the worker's two stages
    run apart, so a step's next demand can come before its last count). Beside it, a
    planner fed every sample in one process (``whole``); the fleet follows its warms."""
    wiring = DemandWiring(step_s=60.0, replica_rps=10.0, close_wait_s=close_wait_s)
    whole, split = DemandPlanner(wiring), DemandPlanner(wiring)
    sources = {s: ServingSteps(60.0) for s in ("p0", "p1", "p2")}  # as the worker runs them
    history: dict[str, list[ServingMetrics]] = {s: [] for s in sources}
    replicas = 4
    one: Outcome = []
    many: Outcome = []
    earlier: list[ServingStep] = []
    for t in range(0, 600):
        records = []
        for sample in _fleet_second(t, replicas):
            whole.serving(sample)
            source = f"p{int(sample.node_id[-5:]) % 3}"
            sources[source].add(sample, source)
            history[source].append(sample)
        if t == 330:  # p1 crashes: its successor re-reads from a commit five seconds back
            sources["p1"] = ServingSteps(60.0)
            for sample in history["p1"][-5 * 2 :]:
                sources["p1"].add(sample, "p1")
        for s in ("p2", "p0", "p1"):
            records += sources[s].flush()
        # any order, copies of some, and the records sent before these again after them (a
        # retry's copies that come late: older, smaller counts)
        heard = records[::-1] + records[:2] + earlier
        earlier = records or earlier
        for record in [] if late else heard:
            split.serving_step(record)
        demand = _demand("qwen-7b", t, _load(t))
        for planner, out in ((whole, one), (split, many)):
            forecasts, steps = planner.demand(demand)
            if forecasts:  # a close: what it forecast, asked for, and took a replica to carry
                out.append((
                    tuple((f.made_at, f.horizon_s, f.point_rps, f.high_rps) for f in forecasts),
                    tuple((st.pool, st.decision.replicas, st.decision.reason) for st in steps),
                    planner.keys[("qwen-7b", "us-east")].capacity_rps,
                ))  # fmt: skip
        for record in heard if late else []:
            split.serving_step(record)
        if t % 60 == 59 and one and _asked(one[-1]) > 0:
            replicas += 2  # the warm loaded: more replicas serve from the next step
    return whole, split, one, many


def test_serving_steps_from_split_partitions_plan_as_one_process_does() -> None:
    """The worker's repartition, its counts heard before each close: forecasts, warms,
    cools and capacity all those of one planner fed every sample in one process."""
    whole, split, one, many = _split_run(late=False)
    assert one == many
    assert any(_asked(close) > 0 for close in one)  # it warmed
    assert any(_asked(close) < 0 for close in one)  # and cooled
    key = split.keys[("qwen-7b", "us-east")]
    assert key.capacity_rps == whole.keys[("qwen-7b", "us-east")].capacity_rps > 0


def test_a_close_waits_for_every_source_that_served_so_counts_that_come_late_count() -> None:
    """Each second's counts come after that second's demand: a step's close waits until
    every source that served the key has reported a later step, so every close is the
    one-process planner's (a second later in processing, the same in event time)."""
    _, split, one, many = _split_run(late=True)
    assert len(one) == len(many) == 9
    assert many == one
    assert split.closed_short == 0


def test_without_the_wait_a_close_reads_counts_short_and_errs_towards_warming() -> None:
    """The same run closing at the first later demand (``close_wait_s`` 0): the step
    closing is read as far as its counts have come, at most a report interval short, so
    its capacity reads low (never high) and a warm may ask for more; a step later the
    step is whole, and from the second close on every decision is the one-process
    planner's."""
    _, _, one, many = _split_run(late=True, close_wait_s=0.0)
    assert len(one) == len(many) == 9
    assert many != one
    for alone, apart in zip(one, many, strict=True):
        assert apart[0] == alone[0]  # forecasts: the demand's alone
        # capacity: low, never high, and by at most a report interval's requests (a
        # twelfth of the step, and one more for where the interval falls)
        assert alone[2] * (1 - 2 / 12) <= apart[2] <= alone[2]
        assert _asked(apart) >= _asked(alone)  # more replicas asked for, never fewer
    assert many[1:] == one[1:]


def test_a_source_that_falls_silent_holds_a_close_back_only_close_wait_s() -> None:
    """Of two sources serving a model, one stops reporting mid-step (its partition's
    worker is gone or far behind): the step waits for it until the demand is
    ``close_wait_s`` past the step's end, then closes on what the other counted, and says
    so; the next step too (it may only be that far behind); the one after, which the
    silent one served neither in nor just before, closes at once."""
    wiring = DemandWiring(step_s=60.0, close_wait_s=10.0)
    planner = DemandPlanner(wiring)
    sources = {s: ServingSteps(60.0) for s in ("p0", "p1")}
    closes: list[tuple[int, int, dict[str, int]]] = []  # (second, step closed, replicas)
    for t in range(0, 250):
        for j, sample in enumerate(_fleet_second(t, 4)):
            source = f"p{j % 2}"
            if source == "p1" and t >= 90:
                continue  # p1 falls silent in the second step
            sources[source].add(sample, source)
        for steps in sources.values():
            for record in steps.flush():
                planner.serving_step(record)
        forecasts, _ = planner.demand(_demand("qwen-7b", t, 40))
        if forecasts:
            key = planner.keys[("qwen-7b", "us-east")]
            closes.append((t, key.closed[0] - int(START.timestamp()) // 60, key.closed[1]))
        if t == 125:
            assert planner.behind("qwen-7b", "us-east") == {"p1"}
    assert [(t, step) for t, step, _ in closes] == [(60, 0), (130, 1), (190, 2), (240, 3)]
    assert [sum(pools.values()) for _, _, pools in closes] == [4, 4, 2, 2]
    assert planner.closed_short == 2


def test_a_model_served_with_no_demand_keeps_the_steps_a_close_may_read_not_all() -> None:
    """No demand event closes its steps, so nothing else would drop what was served: kept,
    the three steps a close reads and those heard while one waits (10 s: one more)."""
    planner = DemandPlanner(DemandWiring(step_s=60.0, close_wait_s=10.0))
    for second in range(0, 3600, 10):
        planner.serving(_serving("phi-3", second, "a", 5))
    newest = int((START + timedelta(seconds=3590)).timestamp() // 60)
    held = sorted(planner.keys[("phi-3", "us-east")].served)
    assert held == [newest - 3, newest - 2, newest - 1, newest]


def test_a_key_handed_to_another_planner_is_planned_as_if_it_had_never_moved() -> None:
    """The planner of ``(model, region)`` changes every 97 s (a rebalance, a restart): the
    next one recalls what the last remembered (through JSON, as the state topic carries it)
    and forecasts, warms, cools and learns capacity as one planner that kept it all along.
    Seeded with a short season so the seasonal models are in play, and a guardrail that
    allows one cool a minute, so its count of them must move with the key too."""
    wiring = DemandWiring(step_s=10.0, replica_rps=10.0, season_s=120.0)

    def planner() -> DemandPlanner:
        guard = Guardrail(GuardrailConfig(max_actions=1, rate_window_s=60.0), devices={})
        return DemandPlanner(wiring, guard=guard)

    kept, moved = planner(), planner()
    source = ServingSteps(10.0)
    replicas, hand_overs = 4, 0
    one: Outcome = []
    many: Outcome = []
    key = ("qwen-7b", "us-east")
    for t in range(0, 900):
        for sample in _fleet_second(t, replicas):
            source.add(sample, "p0")
        for record in source.flush():
            kept.serving_step(record)
            moved.serving_step(record)
        if t % 97 == 96:
            memory = json.loads(json.dumps(moved.remember(*key)))
            moved = planner()
            moved.recall(*key, memory)
            hand_overs += 1
        demand = _demand("qwen-7b", t, _load(t % 600))
        for each, out in ((kept, one), (moved, many)):
            forecasts, steps = each.demand(demand)
            if forecasts:
                out.append((
                    tuple((f.made_at, f.horizon_s, f.point_rps, f.low_rps, f.high_rps, f.chosen)
                          for f in forecasts),
                    tuple((st.pool, st.decision.replicas, st.decision.reason, st.guard.reason)
                          for st in steps),
                    each.keys[key].capacity_rps,
                ))  # fmt: skip
        if t % 10 == 9 and one and _asked(one[-1]) > 0:
            replicas += 1
    assert hand_overs == 9 and len(one) > 80
    assert one == many
    assert any(_asked(close) > 0 for close in one) and any(_asked(close) < 0 for close in one)
    refused = [s for close in one for s in close[1] if s[3] is GuardReason.RATE_LIMITED]
    assert refused  # the guardrail's limit on cools bound
    assert {c for close in one for _, _, _, _, _, c in close[0]} - {"persistence"}
    assert moved.keys[key].forecaster.remember() == kept.keys[key].forecaster.remember()


def test_a_memory_the_planner_cannot_read_leaves_the_key_as_it_was() -> None:
    planner = DemandPlanner(DemandWiring(step_s=10.0))
    for t in range(0, 100):
        planner.demand(_demand("qwen-7b", t, 30))
    before = planner.remember("qwen-7b", "us-east")
    other = DemandPlanner(DemandWiring(step_s=10.0, horizons_s=(10.0, 20.0)))
    for t in range(0, 100):
        other.demand(_demand("qwen-7b", t, 30))
    with pytest.raises(ValueError):
        planner.recall("qwen-7b", "us-east", other.remember("qwen-7b", "us-east"))
    with pytest.raises(ValueError, match="not a demand key's memory"):
        planner.recall("qwen-7b", "us-east", {"forecaster": before["forecaster"]})
    assert planner.remember("qwen-7b", "us-east") == before
