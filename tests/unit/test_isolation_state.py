"""The isolation ladder's durable state: what a restart must not forget.

A ``Process`` stands for one life of ``health.isolate``: a ladder resumed from
the compacted topic (here a dict, compacted as the broker would: the newest
value per key, ``None`` deletes), its journal, and the outputs it publishes.
Each test restarts it where the issue's adversary did.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta

from controllers.guardrail import GuardrailConfig
from controllers.isolation import Rung
from planning.isolation import HealthWiring, decide
from planning.isolation_state import IsolationJournal, resume
from schemas.base import AcceleratorType
from schemas.codec import decode, encode
from schemas.commands import RouteAction, RouteCommand
from schemas.state import IsolationRecord
from schemas.verdicts import HARD_CONFIRMED, HealthStatus, Level, Signal, Verdict
from tests.factories import COMMAND_KEYS, START

POOL = "us-east-h100"
DEVICES = [f"node-{i // 8:05d}-gpu{i % 8}" for i in range(16)]  # 16 devices, 2 racks
WIRING = HealthWiring(signing_key=("k1", COMMAND_KEYS["k1"]))
CONFIRMED_DBE = (  # a hard fault the device reported of itself, in two samples
    Signal(name="ecc_dbe", value=1, threshold=1),
    Signal(name=HARD_CONFIRMED, value=2, threshold=2),
)


def _verdict(device: str, status: HealthStatus, at_s: float) -> Verdict:
    node = device.split("-gpu")[0]
    return Verdict(
        verdict_id=uuid.uuid4(), observed_at=_at(at_s), device_uuid=device, node_id=node,
        region="us-east", rack_id=f"rack-{node}", pool=POOL,
        accelerator_type=AcceleratorType.H100, status=status,
        previous_status=HealthStatus.HEALTHY, score=0.9, evidence="test",
        signals=CONFIRMED_DBE if status is HealthStatus.FAILED else (),
    )  # fmt: skip


def _at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


class Process:
    """One life of the isolation processor over a shared state topic."""

    def __init__(self, topic: dict[str, bytes], wiring: HealthWiring = WIRING) -> None:
        self.topic, self.wiring = topic, wiring
        records = [decode(v, IsolationRecord) for v in topic.values()]
        self.ladder, self.journal = resume(wiring, records)
        self.issued: list[tuple[str, RouteAction]] = []
        self.refused: list[tuple[str, str]] = []

    def feed(self, verdicts: Iterable[Verdict], now_s: float) -> None:
        now = _at(now_s)
        steps, touched = [], set()
        for v in verdicts:
            steps += self.ladder.verdict(v, now=now)
            touched.add(v.device_uuid)
        self._publish(steps, touched, now)

    def tick(self, now_s: float) -> None:
        self._publish(self.ladder.tick(_at(now_s)), set(), _at(now_s))

    def _publish(self, steps: list, touched: set[str], now: datetime) -> None:  # type: ignore[type-arg]
        out = [decide(s, now, self.wiring) for s in steps]
        for key, record in self.journal.changes(self.ladder, touched=touched, outputs=out, now=now):
            if record is None:
                del self.topic[key]
            else:
                self.topic[key] = encode(record)  # written before anything is sent
        for o in out:
            if o.command is not None:
                self.issued.append((o.decision.target, o.command.action))
            else:
                self.refused.append((o.decision.target, o.decision.reason))

    def isolated(self) -> set[str]:
        return set(self.ladder.guard.state.isolated)


def _fleet(status: dict[str, HealthStatus], at_s: float) -> list[Verdict]:
    return [_verdict(d, status.get(d, HealthStatus.HEALTHY), at_s) for d in DEVICES]


def test_a_restart_keeps_the_pool_cap_and_the_rungs() -> None:
    """The issue's probe: cap 1 in a 16-device pool; restarts once isolated 5 of 16."""
    topic: dict[str, bytes] = {}
    p = Process(topic)
    dying = {DEVICES[0]: HealthStatus.DYING}
    p.feed(_fleet({}, 0), 0)
    for t in range(1, 60, 5):
        p.feed(_fleet(dying, t), t)
    assert p.ladder.rung(DEVICES[0]) is Rung.DRAINED
    for n, sick in enumerate(DEVICES[1:6], start=1):  # one more device dying per life
        dying[sick] = HealthStatus.DYING
        p = Process(topic)  # SIGKILL and start again
        assert p.isolated() == {DEVICES[0]}
        assert p.ladder.rung(DEVICES[0]) is Rung.DRAINED  # never back to rung 0
        base = 60 * n
        p.feed([_verdict(d, dying.get(d, HealthStatus.HEALTHY), base) for d in DEVICES[:8]], base)
        for t in range(base + 1, base + 60, 5):
            p.feed(_fleet(dying, t), t)
        assert p.isolated() == {DEVICES[0]}, n  # cap 1, restart after restart
        assert (sick, "pool_cap") in p.refused
        assert not [i for i in p.issued if i[0] != DEVICES[0]]
        assert RouteAction.DEWEIGHT not in [a for d, a in p.issued]  # no rung 0 -> 1 again


def test_a_lockout_stays_until_a_person_lifts_it() -> None:
    wiring = HealthWiring(
        signing_key=WIRING.signing_key, guardrail=GuardrailConfig(lockout_ratio=0.125)
    )
    topic: dict[str, bytes] = {}
    p = Process(topic, wiring)
    failed = {d: HealthStatus.FAILED for d in DEVICES[:3]}
    p.feed(_fleet({}, 0), 0)
    p.feed(_fleet(failed, 1), 1)  # two hard faults reach 2/16: locked out
    assert p.ladder.guard.state.locked_out
    assert (DEVICES[2], "locked_out") in p.refused
    p = Process(topic, wiring)
    assert p.ladder.guard.state.locked_out  # a crash does not lift it
    p.feed(_fleet(failed, 40), 40)
    assert (DEVICES[2], "locked_out") in p.refused and not p.issued
    p.ladder.guard.reset()  # a person lifts it; the page writes it like any change
    p._publish([], set(), _at(41))
    p = Process(topic, wiring)
    assert not p.ladder.guard.state.locked_out
    p.feed(_fleet(failed, 80), 80)
    assert (DEVICES[2], RouteAction.QUARANTINE) in p.issued


def test_caps_use_the_fleet_counted_before_the_restart() -> None:
    """Just after a restart only the isolated devices are known; the lockout ratio and the
    caps still count the 16 seen before, not those few."""
    topic: dict[str, bytes] = {}
    p = Process(topic)
    p.feed(_fleet({}, 0), 0)
    p.feed(_fleet({DEVICES[0]: HealthStatus.FAILED}, 1), 1)
    p = Process(topic)
    p.feed([_verdict(DEVICES[9], HealthStatus.FAILED, 40)], 40)  # the first verdict after
    assert (DEVICES[9], RouteAction.QUARANTINE) in p.issued
    assert not p.ladder.guard.state.locked_out  # 2 of 16, not 2 of 2


def test_an_isolated_device_that_recovers_is_restored_across_a_restart() -> None:
    topic: dict[str, bytes] = {}
    p = Process(topic)
    p.feed(_fleet({}, 0), 0)
    for t in range(1, 40, 5):
        p.feed(_fleet({DEVICES[3]: HealthStatus.DYING}, t), t)
    assert p.ladder.rung(DEVICES[3]) is Rung.DRAINED
    p.feed(_fleet({}, 50), 50)  # healthy from 50 s: probation 120 s
    p = Process(topic)
    for t in range(60, 161, 10):
        p.feed(_fleet({}, t), t)
        p.tick(t)
    assert p.issued == []  # probation not over at 160 s
    p.tick(170)  # 120 s healthy, counted from before the restart
    assert p.issued == [(DEVICES[3], RouteAction.RESTORE)]
    assert p.ladder.rung(DEVICES[3]) is Rung.ACTIVE


def test_an_older_verdict_replayed_after_a_restart_changes_nothing() -> None:
    topic: dict[str, bytes] = {}
    p = Process(topic)
    p.feed(_fleet({DEVICES[1]: HealthStatus.DYING}, 10), 10)
    p.feed(_fleet({}, 20), 20)
    p = Process(topic)
    p.feed([_verdict(DEVICES[1], HealthStatus.DYING, 10)], 21)  # re-read from the log
    assert p.ladder.state(DEVICES[1]) is not None
    state = p.ladder.state(DEVICES[1])
    assert state is not None and state.verdict.status is HealthStatus.HEALTHY


def test_a_command_issued_just_before_a_crash_is_sent_again_until_it_expires() -> None:
    topic: dict[str, bytes] = {}
    p = Process(topic)
    p.feed(_fleet({DEVICES[5]: HealthStatus.FAILED}, 1), 1)  # state written; then SIGKILL
    p = Process(topic)
    [command] = p.journal.pending(_at(2))
    assert isinstance(command, RouteCommand) and command.action is RouteAction.QUARANTINE
    assert p.journal.pending(_at(1 + WIRING.command_ttl_s)) == []
    p.tick(1 + WIRING.command_ttl_s)  # expired: the record drops its command


def test_state_stays_as_small_as_the_isolated_set() -> None:
    topic: dict[str, bytes] = {}
    p = Process(topic)
    p.feed(_fleet({DEVICES[2]: HealthStatus.FAILED}, 1), 1)
    assert sorted(topic) == ["device/" + DEVICES[2], "guardrail"]
    journal = IsolationJournal()
    assert journal.pending(_at(0)) == []


def test_a_node_drained_as_one_unit_survives_a_restart_and_is_restored_once() -> None:
    topic: dict[str, bytes] = {}
    wiring = HealthWiring(
        signing_key=("k1", COMMAND_KEYS["k1"]),
        guardrail=GuardrailConfig(max_isolated_ratio=1.0, rack_max_isolated_ratio=1.0),
    )
    p = Process(topic, wiring)
    p.feed(_fleet({}, 0), 0)
    hot = _verdict("node-00001", HealthStatus.DYING, 5).model_copy(
        update={"level": Level.NODE, "scope": "node-00001", "pool": "*", "members": 8,
                "attribution": "thermal_resid_celsius shared by its devices"}
    )  # fmt: skip
    p.feed([hot], 5)
    assert p.issued == [("node-00001", RouteAction.DRAIN)]
    node_devices = set(DEVICES[8:])
    assert p.isolated() == node_devices
    p = Process(topic, wiring)  # SIGKILL and start again
    assert p.isolated() == node_devices  # the guardrail's own record: no node id in it
    assert p.ladder.state("node-00001") is not None
    p.feed(_fleet({}, 10), 10)  # its devices' verdicts teach the new ladder the node again
    cool = hot.model_copy(update={"status": HealthStatus.HEALTHY, "observed_at": _at(20)})
    p.feed([cool], 20)
    p.tick(20 + wiring.ladder.probation_s)
    assert p.issued == [("node-00001", RouteAction.RESTORE)]
    assert p.isolated() == set()


def test_a_lost_node_stays_beside_the_caps_across_a_restart() -> None:
    """A node lost as a whole is quarantined as one unit and, after a restart, still counts
    in no cap: a device fault elsewhere in the pool gets the cap (1 of 16) as before."""
    topic: dict[str, bytes] = {}
    p = Process(topic)  # default guardrail: pool cap 1 of 16
    p.feed(_fleet({}, 0), 0)
    silent = Signal(name="heartbeat_lost_s", value=15, threshold=10)
    lost = [
        _verdict(d, HealthStatus.FAILED, 70).model_copy(update={"signals": (silent,)})
        for d in DEVICES[8:]
    ]
    p.feed(lost, 70)
    assert sorted(p.issued) == sorted((d, RouteAction.QUARANTINE) for d in DEVICES[8:])
    p = Process(topic)  # SIGKILL and start again
    assert p.ladder.guard.state.lost == set(DEVICES[8:])
    p.feed([_verdict(DEVICES[0], HealthStatus.DYING, 80)], 80)
    assert p.issued == [(DEVICES[0], RouteAction.DEWEIGHT)]
