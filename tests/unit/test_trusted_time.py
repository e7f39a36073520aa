"""Time the loop can trust: liveness on the broker's clock, agents' clocks bounded.

A simulated fleet of six nodes, two per partition, runs through the production
detector and ladder (built from the health settings). Each sample reaches the
broker at its true time (its log-append timestamp) while an agent's own clock
may be skewed, forged or its partition delayed; no healthy device may be
isolated. A control run judges the same skew on the agents' clocks, as the
detector did before, and shows the harm the broker's clock prevents.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from agents.sim.scenario import FaultKind, FaultSpec, FleetSpec, Scenario, TargetSpec
from agents.sim.simulation import Simulation
from controllers.guardrail import Guardrail, GuardrailConfig
from controllers.isolation import IsolationLadder, LadderConfig, confirmed
from models.health import HealthDetector
from planning import isolation
from planning.isolation import HealthTuning
from schemas.base import AcceleratorType
from schemas.events import (
    AcceleratorTelemetry,
    NodeHealth,
    ProbeKind,
    ProbeResult,
    ServingMetrics,
)
from schemas.verdicts import HARD_CONFIRMED, HealthStatus, Signal, Verdict

START = datetime(2026, 3, 1, tzinfo=UTC)
JUDGED = (AcceleratorTelemetry, NodeHealth, ServingMetrics)
Event = AcceleratorTelemetry | NodeHealth | ServingMetrics


def _node(event: Event) -> int:
    return int(event.node_id.split("-")[1])


def _run(
    *,
    clock: Callable[[Event, int], datetime] = lambda event, step: event.observed_at,
    held: Callable[[Event, int], bool] = lambda event, step: False,
    broker_time: bool = True,
    seconds: int = 150,
    faults: tuple[FaultSpec, ...] = (),
) -> tuple[list[Verdict], list[str], HealthDetector]:
    """Verdicts, and devices the ladder isolated, with each sample dated by ``clock`` (the
    agent's clock) and appended at its true time; ``held`` samples reach the detector only
    once the hold ends (a partition's consumer lagging)."""
    scenario = Scenario(
        name="time", duration_s=seconds, fleet=FleetSpec(nodes=6, seed=11), faults=faults
    )
    sim = Simulation(scenario, start=START)
    tuning = HealthTuning()
    detector, ladder = isolation.detector(tuning), isolation.ladder(tuning)
    verdicts: list[Verdict] = []
    isolated: list[str] = []
    backlog: list[tuple[Event, datetime, tuple[str, int]]] = []
    for n in range(seconds):
        events = [e for _, e in sim.tick(n) if isinstance(e, JUDGED)]
        out: list[Verdict] = []
        arrived: list[tuple[Event, datetime, tuple[str, int]]] = []
        for e in events:
            topic = "health" if isinstance(e, NodeHealth) else "telemetry"
            source = (topic, _node(e) % 3)  # two nodes per partition of each topic
            dated = e.model_copy(update={"observed_at": clock(e, n)})
            item = (dated, e.observed_at, source)
            (backlog if held(e, n) else arrived).append(item)
        if backlog and not any(held(e, n) for e in events):
            arrived, backlog = [*backlog, *arrived], []  # the lag ends: all of it at once
        for dated, true_at, source in arrived:
            appended = true_at if broker_time else None
            out += detector.observe(dated, appended_at=appended, source=source, received_s=n)
        out += detector.tick(sim.now if broker_time else max(e.observed_at for e, *_ in arrived))
        verdicts += out
        for v in out:
            steps = ladder.verdict(v, now=sim.now)
            isolated += [s.device_uuid for s in steps if s.allowed]
        isolated += [s.device_uuid for s in ladder.tick(sim.now) if s.allowed]
    return verdicts, isolated, detector


def _failed(verdicts: list[Verdict]) -> set[str]:
    return {v.device_uuid for v in verdicts if v.status is HealthStatus.FAILED}


def test_a_node_six_seconds_fast_makes_no_one_look_lost() -> None:
    def fast(event: Event, step: int) -> datetime:
        return event.observed_at + timedelta(seconds=6) if _node(event) == 0 else event.observed_at

    verdicts, isolated, detector = _run(clock=fast)
    assert _failed(verdicts) == set() and isolated == []
    assert detector.future_dated > 0  # its samples were judged at the bound, and counted
    # control: the same fast clock judged on agents' clocks makes its partition-mate lost
    verdicts, isolated, _ = _run(clock=fast, broker_time=False)
    assert any(v.node_id == "node-00003" for v in verdicts if v.status is HealthStatus.FAILED)


def test_a_node_sixty_seconds_slow_is_not_lost() -> None:
    def slow(event: Event, step: int) -> datetime:
        return event.observed_at - timedelta(seconds=60) if _node(event) == 1 else event.observed_at

    verdicts, isolated, _ = _run(clock=slow)
    assert _failed(verdicts) == set() and isolated == []


def test_one_event_dated_an_hour_ahead_moves_no_clock() -> None:
    def forged(event: Event, step: int) -> datetime:
        if step == 40 and _node(event) == 2 and isinstance(event, NodeHealth):
            return event.observed_at + timedelta(hours=1)
        return event.observed_at

    verdicts, isolated, detector = _run(clock=forged)
    assert _failed(verdicts) == set() and isolated == []
    assert detector.future_dated == 1
    newest = max(detector.watermarks.values())
    assert newest <= (START + timedelta(seconds=151)).timestamp()  # broker time, not +1 h
    verdicts, _, _ = _run(clock=forged, broker_time=False)  # control: agents' clocks
    assert _failed(verdicts)


def test_a_partition_delayed_twenty_seconds_isolates_no_one() -> None:
    def lagging(event: Event, step: int) -> bool:
        return 60 <= step < 80 and _node(event) % 3 == 1

    verdicts, isolated, _ = _run(held=lagging)
    assert _failed(verdicts) == set() and isolated == []


def test_a_crashed_node_is_still_found_on_broker_time() -> None:
    crash = FaultSpec(
        kind=FaultKind.NODE_CRASH, target=TargetSpec(node=4), start_s=40, duration_s=60
    )
    verdicts, _, _ = _run(faults=(crash,))
    assert {d for d in _failed(verdicts)} and all(
        v.node_id == "node-00004" for v in verdicts if v.status is HealthStatus.FAILED
    )


def _verdict(device: str, status: HealthStatus, signals: tuple[Signal, ...]) -> Verdict:
    import uuid

    return Verdict(
        verdict_id=uuid.uuid4(), observed_at=START, device_uuid=device, node_id="node-00000",
        region="us-east", rack_id="rack-0000", pool="us-east-h100",
        accelerator_type=AcceleratorType.H100, status=status,
        previous_status=HealthStatus.HEALTHY, score=1.0, signals=signals,
    )  # fmt: skip


def test_only_confirmed_evidence_of_a_devices_own_skips_the_caps() -> None:
    devices = {f"d{i}": ("us-east-h100", "rack-0000") for i in range(20)}
    ladder = IsolationLadder(LadderConfig(), Guardrail(GuardrailConfig(), devices=devices))
    ladder.guard.observe(START)
    silent = (Signal(name="device_silent_s", value=9.0, threshold=5.0),)  # off the bus alone
    one = (
        Signal(name="ecc_dbe", value=1, threshold=1),
        Signal(name=HARD_CONFIRMED, value=1, threshold=2),
    )
    two = (
        Signal(name="ecc_dbe", value=1, threshold=1),
        Signal(name=HARD_CONFIRMED, value=2, threshold=2),
    )
    allowed = {}
    for device, signals in [
        ("d0", silent),
        ("d1", silent),
        ("d2", silent),
        ("d3", one),
        ("d4", two),
        ("d5", two),
    ]:
        [step] = ladder.verdict(_verdict(device, HealthStatus.FAILED, signals), now=START)
        allowed[device] = (step.allowed, step.reason)
    cap = ladder.guard.cap(20)  # 2 of a 20-device pool
    assert [d for d in ("d0", "d1", "d2") if allowed[d][0]] == ["d0", "d1"][:cap]
    assert allowed["d2"] == (False, "pool_cap")  # silent alone: pays the cap
    assert allowed["d3"] == (False, "pool_cap")  # so does one unconfirmed sample
    assert allowed["d4"][0] and allowed["d5"][0]  # confirmed: no healthy capacity to lose


def test_a_double_bit_error_is_confirmed_by_its_second_sample() -> None:
    detector = HealthDetector()
    sim = Simulation(Scenario(fleet=FleetSpec(nodes=1, seed=3)), start=START)
    verdicts: list[Verdict] = []
    for n in range(3):
        for _, e in sim.tick(n):
            if isinstance(e, AcceleratorTelemetry) and e.device_uuid.endswith("gpu0") and n:
                e = e.model_copy(update={"ecc_dbe_volatile_total": 1})
            if isinstance(e, JUDGED):
                verdicts += detector.observe(e, appended_at=e.observed_at)
    failed = [v for v in verdicts if v.status is HealthStatus.FAILED]
    confirms = [next(s.value for s in v.signals if s.name == HARD_CONFIRMED) for v in failed]
    assert confirms == [1, 2]


def test_one_forged_sample_never_confirms_itself() -> None:
    """A fatal XID latches for minutes and a failed probe stands until the next probe: the
    samples after them must not count as a second word."""
    detector = HealthDetector()
    sim = Simulation(Scenario(fleet=FleetSpec(nodes=1, seed=3)), start=START)
    verdicts: list[Verdict] = []
    for step in range(15):
        for _, event in sim.tick(step):
            ours = isinstance(event, AcceleratorTelemetry) and event.device_uuid.endswith("gpu0")
            if step == 1 and ours:
                event = event.model_copy(update={"xid_last": 79})  # fallen off the bus
            if step == 1 and isinstance(event, NodeHealth):
                failed = ProbeResult(
                    probe=ProbeKind.GEMM, device_uuid="node-00000-gpu1", passed=False,
                    duration_s=0.0,
                )  # fmt: skip
                event = event.model_copy(update={"probes": (failed,)})
            if isinstance(event, JUDGED):
                verdicts += detector.observe(event, appended_at=event.observed_at)
    failed_verdicts = [v for v in verdicts if v.status is HealthStatus.FAILED]
    assert {v.device_uuid for v in failed_verdicts} == {"node-00000-gpu0", "node-00000-gpu1"}
    assert not any(confirmed(v) for v in failed_verdicts)


def test_a_refused_quarantine_is_not_asked_again_on_a_latch_alone() -> None:
    """A fatal XID seen once stays latched for minutes; held back by the cap, its quarantine
    waits for the device to report it again (or go silent), never lands minutes later."""
    devices = {f"d{i}": ("us-east-h100", "rack-0000") for i in range(10)}
    ladder = IsolationLadder(
        LadderConfig(retry_s=30), Guardrail(GuardrailConfig(), devices=devices)
    )
    ladder.guard.observe(START)
    silent = (Signal(name="device_silent_s", value=9.0, threshold=5.0),)  # off the bus alone
    assert ladder.verdict(_verdict("d0", HealthStatus.FAILED, silent), now=START)[0].allowed
    xid = Signal(name="xid_79", value=79, threshold=0)

    def failed(seen: int, at_s: float, *extra: Signal) -> Verdict:
        signals = (xid, Signal(name=HARD_CONFIRMED, value=seen, threshold=2), *extra)
        v = _verdict("d1", HealthStatus.FAILED, signals)
        return v.model_copy(update={"observed_at": START + timedelta(seconds=at_s)})

    def at(seconds: float) -> datetime:
        return START + timedelta(seconds=seconds)

    [first] = ladder.verdict(failed(1, 1), now=at(1))
    assert (first.allowed, first.reason) == (False, "pool_cap")
    ladder.verdict(_verdict("d0", HealthStatus.HEALTHY, ()), now=at(2))  # the cap frees later
    ladder.guard.state.isolated.discard("d0")
    assert ladder.verdict(failed(0, 40), now=at(40)) == []  # latched only: not asked again
    assert ladder.tick(at(80)) == []
    [again] = ladder.verdict(failed(1, 90), now=at(90))  # it reports the XID again
    assert again.allowed
    late = IsolationLadder(LadderConfig(retry_s=30), Guardrail(GuardrailConfig(), devices=devices))
    late.guard.observe(START)
    late.verdict(_verdict("d0", HealthStatus.FAILED, silent), now=START)
    late.verdict(failed(1, 1), now=at(1))
    late.guard.state.isolated.discard("d0")
    [lost] = late.verdict(failed(0, 40, *silent), now=at(40))  # latched, but silent now too
    assert lost.allowed


def test_a_crash_read_late_on_the_heartbeat_topic_is_dated_by_its_silence() -> None:
    """The heartbeat topic's consumer lags the telemetry's: a crashed node's last heartbeats
    are read after its telemetry partition moved on. The silence they reveal is dated
    when it began (last sample + timeout), never by the older heartbeat it was read on,
    and it is the verdict's cause: an evaluation counts the crash found, not a healthy
    node isolated before it."""
    crash = FaultSpec(
        kind=FaultKind.NODE_CRASH, target=TargetSpec(node=4), start_s=40, duration_s=60
    )

    def lagging(event: Event, step: int) -> bool:
        return 30 <= step < 50 and isinstance(event, NodeHealth) and _node(event) % 3 == 1

    verdicts, _, detector = _run(held=lagging, faults=(crash,))
    failed = [v for v in verdicts if v.status is HealthStatus.FAILED]
    assert failed and {v.node_id for v in failed} == {"node-00004"}
    timeout = detector.config.heartbeat_timeout_s
    began = START + timedelta(seconds=40)
    last_word = began - timedelta(seconds=1)  # its last step's samples and heartbeat
    for v in failed:
        assert v.observed_at >= began, (v.observed_at, v.evidence)
    first = [v for v in failed if v.cause_appended_at is not None]
    assert first and all(v.cause_event_id is None for v in first)
    assert {v.cause_appended_at for v in first} == {last_word + timedelta(seconds=timeout)}
