"""The demand planner: steps of demand -> forecasts with bands -> warm and cool decisions,
and the signed warm commands they become."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

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


def test_serving_steps_from_split_partitions_plan_as_one_process_does() -> None:
    """The worker's repartition: three sources (partitions of node-keyed serving telemetry)
    each count their own replicas into ServingStep records; the planner that owns the
    model hears them interleaved, with copies (some late, after newer ones), and a source
    restarted mid-step re-reads and re-sends its last seconds. Its forecasts and warm
    decisions are those of one planner fed every sample in one process."""
    wiring = DemandWiring(step_s=60.0, replica_rps=10.0)
    whole, split = DemandPlanner(wiring), DemandPlanner(wiring)
    sources = {s: ServingSteps(60.0) for s in ("p0", "p1", "p2")}  # as the worker runs them
    history: dict[str, list[ServingMetrics]] = {s: [] for s in sources}
    replicas = 4
    one: list[tuple[Any, ...]] = []
    many: list[tuple[Any, ...]] = []
    copies = 0
    earlier: list[ServingStep] = []
    for t in range(0, 600):
        samples = _fleet_second(t, replicas)
        records = []
        for sample in samples:
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
        for record in records[::-1] + records[:2] + earlier:
            split.serving_step(record)
        copies += 2 + len(earlier)
        earlier = records or earlier
        demand = _demand("qwen-7b", t, _load(t))
        for planner, out in ((whole, one), (split, many)):
            forecasts, steps = planner.demand(demand)
            out += [(f.made_at, f.horizon_s, f.point_rps, f.high_rps) for f in forecasts]
            out += [(st.at, st.pool, st.decision.replicas, st.decision.reason) for st in steps]
        if t % 60 == 59 and any(isinstance(o[2], int) and o[2] > 0 for o in one[-6:]):
            replicas += 2  # the warm loaded: more replicas serve from the next step
    assert copies and one == many
    assert any(isinstance(o[2], int) and o[2] > 0 for o in one)  # it warmed
    assert any(isinstance(o[2], int) and o[2] < 0 for o in one)  # and cooled
    key = split.keys[("qwen-7b", "us-east")]
    assert key.capacity_rps == whole.keys[("qwen-7b", "us-east")].capacity_rps > 0
