"""Common-mode attribution: a deviation many devices share belongs to what they share.

A device is judged against peers of its type (its thermal fit, its TPOT cohort,
its probes). When a node's cooling fails, every device on that node runs hot
against its type; when a rollout slows one accelerator type in a region, every
one of them is slow against the cohort it learned before. Judged one by one,
each would be isolated, and the fleet would lose a node's worth or a cohort's
worth of healthy chips to one shared cause.

So a device's soft signal over its threshold is first held against the groups
the device belongs to (its node, its rack, its cohorts: ``TYPE@region``,
``model@region`` and the serving stack where they meet, ``model/TYPE@region``),
each summarised by the median of its members' current readings of the same
signal (at least ``MIN_MEMBERS`` of them):

- a measured signal (a temperature residual, a TPOT excess) is *shared* with a
  group when the group's median has moved (at least half the signal's floor)
  and the device is less than its own threshold beyond that median: what is
  left is not the device's;
- slow probes are measured too, by the probe's gap to its type's peers (the
  streak of slow probes is what a device is judged on, the gap what a group's
  median is taken of);
- so are XID flaps, by their CUSUM statistic (a driver fault that throws XIDs
  on most of a node's or a type's devices is theirs, not each device's);
- a counted signal is shared when at least half the group's members are over
  too.

When several groups explain it, the broadest one does (a cohort before a rack,
a rack before a node): a cause shared by every node of a rack is the rack's.
Every node: a rack's level on a measured signal is its least-moved node's
median (where two nodes or more report), not the median of its devices, since
the rack's air reaches all of them; two of four nodes whose cooling failed
together put the devices' median over the floor while the other two ran cool.
When the rack's only reporting node is this one, the two medians are one
reading, and physics tells them apart: hot air adds the same degrees to every
device, while a node whose cooling fails (a higher thermal resistance) heats
each device in proportion to the power it sheds, a busy one more than an idle
one. So the node is named when its devices' residuals rise with the heating
their type's fit gives their power by at least ``HEAT_BOUND_SHARE`` of it (its
thermal resistance up by half or more), over a spread of heating of at least
the signal's floor; otherwise the rack is (its name drains nothing; the
node's would drain the node). Before this, the rack was always named: on the
fault family the node's name had drained eight healthy devices on 4 of 88
seeds where the rack's air was the cause, and the rack's name missed every
failed cooling on a one-node rack in seeds 1-600 (five, all found now).
A shared signal is not the device's evidence: the device stays healthy on it,
its verdict says which group explains it and why, and the group is watched.
A watched group is judged on its median like a device (over, then sustained;
and, like a device, not on what a broader group of its members has moved as
far: a rollout reaches one node of a type first, and that node is not its
cause) and gets verdicts of its own (``level`` node, rack or cohort) until it is
healthy again. A device that deviates from its node *and* its cohorts (the one
slow chip of a braked rack, the one hot chip of a hot node) is still judged
alone. A median needs a majority: two slow devices of an eight-device node
are two device faults, not a node's.

The groups are the detector's own view (the nodes of its partitions), so a
fleet-wide cohort is judged per partition: a majority there is a majority.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from models.evidence import refractory, streak
from models.health_state import Reading, counted, over_threshold
from schemas.verdicts import HealthStatus, Level

MIN_MEMBERS = 3
"""A group's median needs this many current readings (a pair is two devices, not a node)."""

SHARED_SHARE = 0.5
"""A counted signal is shared when at least this share of the group is over too."""

GROUPS_OF: dict[str, tuple[str, ...]] = {
    "thermal_resid_celsius": ("node", "rack"),
    "tpot_vs_peers_log": ("node", "stack", "type", "model"),
    "probe_slow": ("node", "type"),
    "xid_rise": ("node", "type"),
}
"""Which groups can explain each soft signal: a node's cooling or a rack's air heat its
devices; a host, a rollout on a type or a model slows them; ECC is a chip's own."""

HEATING = "heating_celsius"
"""What a device's temperature rises over an idle one's at its power, by its type's fit: the
measure a node's own cooling failure scales with."""

HEAT_BOUND_SHARE = 0.5
"""A node's residuals rising with its devices' heating by this share of it or more: its own
cooling (thermal resistance up by half or more), not the air it shares with its rack."""

MEASURED_BY = {"probe_slow": "probe_gap"}
"""A signal whose group median is taken of another, measured one (a streak has no median
worth taking; the gap it counts has)."""

LEVEL_OF = {
    "node": Level.NODE,
    "rack": Level.RACK,
    "stack": Level.COHORT,
    "type": Level.COHORT,
    "model": Level.COHORT,
}
BREADTH = {"node": 0, "rack": 1, "stack": 2, "model": 3, "type": 4}
"""The broader group wins when several explain a signal."""

MOVED_SHARE = 0.5
"""A group's median has moved when it is at least this share of the signal's floor."""


class GroupKey(NamedTuple):
    kind: str  # node, rack, type or model
    scope: str  # its id: a node id, a rack id, TYPE@region, model@region

    @property
    def level(self) -> Level:
        return LEVEL_OF[self.kind]


@dataclass(frozen=True, slots=True)
class GroupReading:
    """One signal over a group's members, at one instant."""

    median: float  # a rack's, on a measured signal: its least-moved node's (``_least_node``)
    over_share: float
    members: int


@dataclass(frozen=True, slots=True)
class Shared:
    """A device's signal explained by a group."""

    key: GroupKey
    reading: GroupReading

    def describe(self, signal: Reading) -> str:
        g = self.reading
        return (
            f"{signal.name} {signal.value:.3g} shared with {self.key.kind} {self.key.scope} "
            f"(median {g.median:.3g}, {g.over_share:.0%} of {g.members} over)"
        )


@dataclass(slots=True)
class GroupState:
    """What is kept of a watched group: its status, since when each signal is over."""

    status: HealthStatus = HealthStatus.HEALTHY
    emitted_s: float = -math.inf
    since: dict[str, float] = field(default_factory=dict)
    # a node named for its own cooling keeps the name while it is watched: drained, its
    # devices idle alike and no slope shows, yet the air about them is no cooler
    own_cooling: bool = False


@dataclass(frozen=True, slots=True)
class GroupJudgement:
    """A watched group's judgement, for the detector to make a verdict of."""

    key: GroupKey
    status: HealthStatus
    previous: HealthStatus
    readings: dict[str, GroupReading]
    over: dict[str, float]  # signal -> for how long it has been over
    members: int


ReadingOf = Callable[[str, str, float], Reading | None]
"""(device uuid, signal name, at) -> the device's current reading, or None when it has none."""


class CommonMode:
    """Group membership, group medians (cached for ``refresh_s`` of event time) and the
    watched groups' judgements."""

    def __init__(
        self,
        reading_of: ReadingOf,
        floors: dict[str, float],
        *,
        sustain_s: float,
        verdict_interval_s: float,
        refresh_s: float = 1.0,
    ) -> None:
        self.reading_of = reading_of
        self.floors = floors  # signal -> the least a group's median must reach to be over
        self.sustain_s = sustain_s
        self.verdict_interval_s = verdict_interval_s
        self.refresh_s = refresh_s
        self.members: dict[GroupKey, set[str]] = {}
        self.of_device: dict[str, dict[str, GroupKey]] = {}  # device -> kind -> its group
        self.watched: dict[GroupKey, GroupState] = {}
        self._cache: dict[tuple[GroupKey, str], GroupReading | None] = {}
        self._cached_at: dict[tuple[GroupKey, str], float] = {}

    # -- membership -----------------------------------------------------------------------

    def place(self, device_uuid: str, kind: str, scope: str) -> None:
        """``device_uuid`` belongs to group ``kind`` ``scope`` (a device's model moves it)."""
        groups = self.of_device.setdefault(device_uuid, {})
        old = groups.get(kind)
        if old is not None and old.scope == scope:
            return
        if old is not None:
            self._leave(device_uuid, old)
        key = GroupKey(kind, scope)
        groups[kind] = key
        self.members.setdefault(key, set()).add(device_uuid)

    def forget(self, devices: Iterable[str]) -> None:
        for device_uuid in devices:
            for key in self.of_device.pop(device_uuid, {}).values():
                self._leave(device_uuid, key)

    def _leave(self, device_uuid: str, key: GroupKey) -> None:
        members = self.members.get(key)
        if members is not None:
            members.discard(device_uuid)
            if not members:
                del self.members[key]
                self.watched.pop(key, None)

    # -- readings -------------------------------------------------------------------------

    def reading(self, key: GroupKey, name: str, at_s: float) -> GroupReading | None:
        """``name`` over ``key``'s members with a current reading; None under MIN_MEMBERS."""
        slot = (key, name)
        if slot in self._cache and at_s - self._cached_at[slot] < self.refresh_s:
            return self._cache[slot]
        values: list[float] = []
        by_node: dict[GroupKey | None, list[float]] = {}
        per_node = key.kind == "rack" and not counted(name)  # a rack's level: _least_node
        over = 0
        for device_uuid in self.members.get(key, ()):
            r = self.reading_of(device_uuid, name, at_s)
            if r is None:
                continue
            values.append(r.value)
            over += over_threshold(r)
            if per_node:
                by_node.setdefault(self.of_device[device_uuid].get("node"), []).append(r.value)
        result = None
        if len(values) >= MIN_MEMBERS:
            median = statistics.median(values)
            if per_node:
                median = min(median, _least_node(by_node))
            result = GroupReading(median, over / len(values), len(values))
        self._cache[slot], self._cached_at[slot] = result, at_s
        return result

    def group_over(self, name: str, reading: GroupReading) -> bool:
        if counted(name):
            return reading.over_share >= SHARED_SHARE
        return reading.median >= self.floors[name]

    def explain(self, device_uuid: str, signal: Reading, at_s: float) -> Shared | None:
        """The group that explains ``signal`` (over its threshold on ``device_uuid``), if one
        does: the broadest. The group is watched from then on."""
        best: Shared | None = None
        groups = self.of_device.get(device_uuid, {})
        kinds = GROUPS_OF.get(signal.name, ())
        measured = MEASURED_BY.get(signal.name)
        if measured is not None:  # judged on the measure the streak counts
            own = self.reading_of(device_uuid, measured, at_s)
            if own is None:
                return None
            signal = own
        node: Shared | None = None  # the device's node, where it explains the signal too
        for kind in kinds:
            key = groups.get(kind)
            if key is None:
                continue
            g = self.reading(key, signal.name, at_s)
            if g is None:
                continue
            if not self._shares(signal.name, g, signal.value, signal.threshold):
                continue  # the group has not moved, or the device is beyond it: its own
            shared = Shared(key, g)
            node = shared if kind == "node" else node
            if best is None or BREADTH[kind] > BREADTH[best.key.kind]:
                best = shared
        if (
            best is not None
            and node is not None
            and best.key.kind == "rack"
            and self._own_cooling(node.key, best.key, signal.name, at_s)
        ):
            best = node  # the rack's one reporting node, whose own cooling it is
        if best is not None:
            self.watched.setdefault(best.key, GroupState())
        return best

    def _shares(self, name: str, group: GroupReading, value: float, threshold: float) -> bool:
        """Whether ``group`` explains a reading of ``value`` (a device's, or a narrower
        group's median) over ``threshold``: as widely over, for a counted signal; for a
        measured one, the group's median has moved and the value is not ``threshold``
        beyond it."""
        if counted(name):
            return group.over_share >= SHARED_SHARE
        return group.median >= MOVED_SHARE * self.floors[name] and value - group.median < threshold

    def _broader(
        self,
        key: GroupKey,
        name: str,
        reading: GroupReading,
        kinds: tuple[str, ...],
        at_s: float,
    ) -> GroupKey | None:
        """A broader group of ``key``'s members that has moved on ``name`` as far as ``key``
        has (less than the signal's floor between their medians), or as widely for a counted
        signal; it is watched from then on. A group is judged as a device is: what it shares
        with a broader one is not its own (a rollout slows every node of a type, and the
        first node seen slow is not the cause)."""
        anyone = next(iter(self.members.get(key, ())), None)
        if anyone is None:
            return None
        groups = self.of_device.get(anyone, {})
        for kind in sorted(kinds, key=BREADTH.__getitem__, reverse=True):
            wider = groups.get(kind)
            if BREADTH[kind] <= BREADTH[key.kind] or wider is None:
                continue
            w = self.reading(wider, name, at_s)
            if w is None:
                continue
            if kind == "rack" and self._own_cooling(key, wider, name, at_s):
                continue  # the rack's one reporting node, whose own cooling it is
            if self._shares(name, w, reading.median, self.floors[name]):
                self.watched.setdefault(wider, GroupState())
                return wider
        return None

    def _own_cooling(self, node: GroupKey, rack: GroupKey, name: str, at_s: float) -> bool:
        """Whether ``rack``'s ``name``, read only on ``node``'s devices, is the node's own
        cooling: its devices' residuals rise with their heating by ``HEAT_BOUND_SHARE`` or
        more (a least-squares slope), over a spread of heating of at least the floor. Once
        so, the node is watched and keeps it until it is healthy again."""
        if node.kind != "node" or name != "thermal_resid_celsius":
            return False
        mine = self.members.get(node, set())
        for device_uuid in self.members.get(rack, ()):
            if device_uuid not in mine and self.reading_of(device_uuid, name, at_s) is not None:
                return False  # another node of the rack reports: the medians differ
        state = self.watched.get(node)
        if state is not None and state.own_cooling:
            return True
        heat: list[float] = []
        resid: list[float] = []
        for device_uuid in mine:
            r, h = (
                self.reading_of(device_uuid, name, at_s),
                self.reading_of(device_uuid, HEATING, at_s),
            )
            if r is not None and h is not None:
                heat.append(h.value)
                resid.append(r.value)
        if len(heat) < MIN_MEMBERS or max(heat) - min(heat) < self.floors[name]:
            return False  # too few devices, or too alike in power, for a slope to show
        if statistics.linear_regression(heat, resid).slope < HEAT_BOUND_SHARE:
            return False
        self.watched.setdefault(node, GroupState()).own_cooling = True
        return True

    def _a_nodes_own(self, rack: GroupKey, name: str, at_s: float) -> bool:
        """Whether ``rack``'s ``name`` is the own cooling of its one reporting node, named so
        (:meth:`_own_cooling`): the node's verdict says it, not the rack's as well."""
        if rack.kind != "rack" or name != "thermal_resid_celsius":
            return False
        on_rack = self.members.get(rack, set())
        return any(
            key.kind == "node"
            and state.own_cooling
            and self.members.get(key, set()) <= on_rack
            and self._own_cooling(key, rack, name, at_s)
            for key, state in self.watched.items()
        )

    # -- watched groups -------------------------------------------------------------------

    def judge(self, at_s: float) -> list[GroupJudgement]:
        """Each watched group's judgement when it changes (and every verdict interval while
        it is not healthy); a group healthy again is said so once and no longer watched."""
        out: list[GroupJudgement] = []
        for key, state in list(self.watched.items()):
            over_now: list[str] = []
            readings: dict[str, GroupReading] = {}
            members = 0
            for counting, kinds in GROUPS_OF.items():
                if key.kind not in kinds:
                    continue
                name = MEASURED_BY.get(counting, counting)
                g = self.reading(key, name, at_s)
                if g is None:
                    continue
                readings[name] = g
                members = max(members, g.members)
                if (
                    self.group_over(name, g)
                    and not self._broader(key, name, g, kinds, at_s)
                    and not self._a_nodes_own(key, name, at_s)
                ):
                    over_now.append(name)
            # judged as a device is (models.evidence): over, then sustained
            over = streak(state.since, over_now, at_s)
            if any(held >= self.sustain_s for held in over.values()):
                status = HealthStatus.DYING
            elif over:
                status = HealthStatus.SUSPECT
            else:
                status = HealthStatus.HEALTHY
            previous = state.status
            due = status is not HealthStatus.HEALTHY and not refractory(
                state.emitted_s, at_s, self.verdict_interval_s
            )
            if status is not previous or due:
                state.status, state.emitted_s = status, at_s
                out.append(GroupJudgement(key, status, previous, readings, over, members))
            if status is HealthStatus.HEALTHY:
                del self.watched[key]
        return out


def _least_node(by_node: dict[GroupKey | None, list[float]]) -> float:
    """A rack's level on a measured signal: its least-moved node's median, where two nodes
    or more report (``MIN_MEMBERS`` readings each); +inf otherwise. The rack's air reaches
    every node of it, so a rack has moved only as far as its coolest node has: two of four
    nodes whose cooling failed together put the rack's median of devices over the floor
    while the other two ran as cool as ever (fault family seeds 581, 599, 607 and 610: the
    rack was named, and a device of the hot nodes less hot than the rest was taken for the
    rack's)."""
    medians = [statistics.median(v) for k, v in by_node.items() if k and len(v) >= MIN_MEMBERS]
    return min(medians) if len(medians) >= 2 else math.inf
