"""Score health verdicts and isolations against the simulator's ground truth.

Inputs are plain data: the truth file's rows (faults with their windows, and
consequences such as a breaker trip), the verdicts, the decisions, and when
each route command reached the broker.

- A **fault** is something a health detector should see: a device fault (ECC
  storm, grey slowdown, flapping XIDs), a node fault (thermal runaway, crash),
  or a PDU overload that tripped its breaker (its rack went dark). Demand
  spikes and cold models are not health faults and are left out.
- A **detection** is the first ``dying`` or ``failed`` verdict of a device
  after it was healthy (an episode). It is true when the device is a target
  of a fault, between the fault's start and ``grace_s`` after its end.
- **precision** = true detections / detections; **recall** = faults with at
  least one true detection / faults; **time to detect** = first true
  detection - fault start, per kind. A fault that begins on devices the
  detector already holds ``failed``, and holds so to its end (a node dark since
  its rack's breaker tripped, then drawn to crash), has nothing to show: it counts
  as found, is listed in ``found_already_failed`` and gives no time to detect. One
  that begins on devices held ``failed`` and outlasts their return is timed from the
  return, when it could first be seen (a slowdown that began on a node dark since its
  rack's breaker tripped), and listed in ``timed_from_return`` with the seconds held.
  A flap that threw no XID in its window left no trace in the telemetry: it is
  listed in ``no_trace`` and left out of recall (one XID is a trace, and counts).
- **false isolations**: isolating commands issued for a device no fault was
  touching then, per 1,000 device-days observed, each listed with its cause (the
  decision's reason and message: the signal, the level, the threshold).
- Conditions shared by many healthy devices (a rollout's slowdown, a power brake,
  hot inlet air, a demand surge) are not faults: isolating a device for one is a
  false isolation. A device such a condition destroys (lost to heat) is a fault
  from that instant.
- **hard-fault isolation latency**: from the triggering event's broker
  timestamp to the command's, for hard-fault quarantines.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from schemas.verdicts import ATTRIBUTE, Decision, DecisionOutcome, HealthStatus, Level, Verdict

HEALTH_FAULTS = {
    "ecc_storm",
    "grey_slowdown",
    "flapping_xid",
    "thermal_runaway",
    "node_crash",
    "pdu_overload",
}
FLAGGED = {HealthStatus.DYING, HealthStatus.FAILED}
GREY_TARGET_RATIO = 0.15
"""Grey slowdowns this strong or stronger are held to the time-to-detect target."""


@dataclass(frozen=True, slots=True)
class Fault:
    fault_id: str
    kind: str
    start: datetime
    end: datetime
    devices: frozenset[str]
    scopes: frozenset[str] = frozenset()  # the node or rack a group's verdict may name
    params: Mapping[str, float] = field(default_factory=dict)  # its strength, its lead
    # a flap's XIDs as its device threw them (None: not a flap): a flap of one XID, or
    # none, shows nothing a healthy device's occasional XID does not
    xids_thrown: int | None = None

    @property
    def evidence(self) -> str:
        """What the device showed of it, where the truth says ("" where it does not)."""
        if self.xids_thrown is None:
            return ""
        n, seconds = self.xids_thrown, (self.end - self.start).total_seconds()
        return f"{n} XID{'' if n == 1 else 's'} thrown in its {seconds:.0f} s"


@dataclass(frozen=True, slots=True)
class Condition:
    """A fault or a shared condition as the groups it may explain: a group verdict (common
    mode, :class:`~schemas.verdicts.Level`) is explained when one of these covers its scope
    while it is active."""

    kind: str
    start: datetime
    end: datetime
    scopes: frozenset[str]  # node and rack ids it covers
    names: frozenset[str] = frozenset()  # cohort names (a type, a model) it slows
    region: str | None = None  # the cohorts' region (None: every region)

    def covers(self, scope: str) -> bool:
        if scope in self.scopes:
            return True
        name, at, region = scope.partition("@")
        if not at:
            return False
        in_region = self.region is None or region == self.region
        if self.kind == "demand_spike":
            return in_region
        # a cohort is a type, a model, or the serving stack where they meet (model/TYPE)
        return bool(self.names & set(name.split("/"))) and in_region


@dataclass(slots=True)
class FaultScore:
    precision: float
    recall: float
    detections: int
    true_detections: int
    faults: int
    detected: int
    false_isolations: int
    device_days: float
    ttd_s: dict[str, list[float]] = field(default_factory=dict)
    tti_s: dict[str, list[float]] = field(default_factory=dict)  # fault start -> all isolated
    not_isolated: list[str] = field(default_factory=list)  # faults some device never left for
    missed: list[str] = field(default_factory=list)
    already_failed: list[str] = field(default_factory=list)  # began on devices held failed
    # began on devices held failed, timed from their return: fault id -> seconds held
    from_return: dict[str, float] = field(default_factory=dict)
    no_trace: list[str] = field(default_factory=list)  # flaps that threw no XID: not in recall
    missed_flaps: list[Fault] = field(default_factory=list)  # with the XIDs each threw
    false_detections: list[str] = field(default_factory=list)
    false_isolation_causes: list[str] = field(default_factory=list)
    group_detections: int = 0
    group_unexplained: list[str] = field(default_factory=list)
    grey_ttd_s: list[float | None] = field(default_factory=list)  # >= 15%; None: missed
    ecc_storms_before_dbe: tuple[int, int] = (0, 0)  # flagged before the fault, of all
    isolation_latency_s: list[float] = field(default_factory=list)
    verdict_latency_s: list[float] = field(default_factory=list)  # event -> verdict on broker
    actions: dict[str, int] = field(default_factory=dict)
    refusals: dict[str, int] = field(default_factory=dict)

    @property
    def false_isolations_per_1k_device_days(self) -> float:
        return 1000.0 * self.false_isolations / self.device_days if self.device_days else 0.0

    def summary(self) -> dict[str, Any]:
        every = sorted(t for ts in self.ttd_s.values() for t in ts)
        return {
            "precision": round(self.precision, 4),
            "recall": round(self.recall, 4),
            "false_isolations_per_1k_device_days": round(
                self.false_isolations_per_1k_device_days, 2
            ),
            "ttd_p50_s": _q(every, 0.5),
            "ttd_p95_s": _q(every, 0.95),
            "hard_fault_isolation_p99_s": _q(sorted(self.isolation_latency_s), 0.99),
            "hard_fault_isolation_p50_s": _q(sorted(self.isolation_latency_s), 0.5),
            "hard_fault_latencies_measured": len(self.isolation_latency_s),
            "hard_fault_verdict_p50_s": _q(sorted(self.verdict_latency_s), 0.5),
            "hard_fault_verdict_p99_s": _q(sorted(self.verdict_latency_s), 0.99),
            "faults": self.faults,
            "detected": self.detected,
            "detections": self.detections,
            "true_detections": self.true_detections,
            "false_isolations": self.false_isolations,
            "device_days": round(self.device_days, 3),
            "per_kind": {
                kind: {
                    "detected": len(ts),
                    "ttd_p50_s": _q(sorted(ts), 0.5),
                    "ttd_p95_s": _q(sorted(ts), 0.95),
                    "isolated": len(self.tti_s.get(kind, [])),
                    "time_to_isolate_p50_s": _q(sorted(self.tti_s.get(kind, [])), 0.5),
                    "time_to_isolate_p95_s": _q(sorted(self.tti_s.get(kind, [])), 0.95),
                }
                for kind, ts in sorted(self.ttd_s.items())
            },
            "not_isolated": self.not_isolated,
            "missed": self.missed,
            "found_already_failed": self.already_failed,
            "timed_from_return": self.from_return,
            "no_trace": self.no_trace,
            "missed_evidence": {f.fault_id: f.evidence for f in self.missed_flaps},
            "missed_flap_xids": {f.fault_id: f.xids_thrown for f in self.missed_flaps},
            "false_detections": self.false_detections,
            "false_isolation_causes": self.false_isolation_causes,
            "group_detections": self.group_detections,
            "grey_15pct_ttd_s": self.grey_ttd_s,
            "ecc_storms_flagged_before_dbe": list(self.ecc_storms_before_dbe),
            "group_detections_unexplained": self.group_unexplained,
            "actions": self.actions,
            "refusals": self.refusals,
        }


def _q(values: list[float], quantile: float) -> float | None:
    """Nearest-rank quantile of sorted ``values``; None when empty."""
    if not values:
        return None
    rank = max(0, math.ceil(quantile * len(values)) - 1)
    return round(values[rank], 3)


def faults_from_truth(
    rows: Iterable[Mapping[str, Any]], layout: Mapping[str, tuple[str, str]]
) -> list[Fault]:
    """Faults a health detector should see, with the devices each touched.

    ``layout`` maps each device to its (node, rack), as the verdicts named them.
    """
    rows = list(rows)
    tripped = {r["target"] for r in rows if r.get("what") == "breaker_trip"}
    xids: dict[str, list[datetime]] = defaultdict(list)  # device -> the XIDs it threw
    for r in rows:
        if r.get("what") == "xid":
            xids[r["target"]].append(datetime.fromisoformat(r["at"]))
    out = []
    faults = [r for r in rows if r.get("record") == "fault"]
    faulted = {r["device_uuid"] for r in faults if r["device_uuid"]}
    hot_nodes = {r["node_id"] for r in faults if r["node_id"] and not r["device_uuid"]}
    faulted |= {d for d, (node, _) in layout.items() if node in hot_nodes}
    for r in rows:  # a device a shared condition destroyed is a fault from then on
        if r.get("what") == "device_lost_overheat" and r["target"] not in faulted:
            at = datetime.fromisoformat(r["at"])
            end = at + timedelta(days=1)  # it stays lost until swapped: no end in view
            devices = frozenset({r["target"]})
            out.append(Fault(f"lost-{r['target']}", "overheat_loss", at, end, devices))
    for r in rows:
        if r.get("record") != "fault" or r["kind"] not in HEALTH_FAULTS:
            continue
        scopes: frozenset[str] = frozenset()
        if r["device_uuid"]:
            devices = frozenset({r["device_uuid"]})
        elif r["node_id"]:
            devices = frozenset(d for d, (node, _) in layout.items() if node == r["node_id"])
            scopes = frozenset({r["node_id"]})
        elif r["rack_id"] and r["rack_id"] in tripped:
            on_rack = {d: node for d, (node, rack) in layout.items() if rack == r["rack_id"]}
            devices = frozenset(on_rack)
            scopes = frozenset({r["rack_id"], *on_rack.values()})
        else:
            continue  # an overload that never tripped its breaker harmed no device
        start, end = datetime.fromisoformat(r["start_at"]), datetime.fromisoformat(r["end_at"])
        thrown = None
        if r["kind"] == "flapping_xid" and r["device_uuid"]:
            thrown = sum(1 for at in xids[r["device_uuid"]] if start <= at <= end)
        params = r.get("params") or {}
        out.append(Fault(r["fault_id"], r["kind"], start, end, devices, scopes, params, thrown))
    return out


def conditions_from_truth(
    rows: Iterable[Mapping[str, Any]], layout: Mapping[str, tuple[str, str]]
) -> list[Condition]:
    """Every fault and shared condition of the truth file as the groups it covers: a node
    fault its node (and its rack, where the node is the rack's only one: the two are the
    same devices), a rack's its rack and the rack's nodes, a rollout its cohorts (a type or
    a model, in a region or all), a demand surge its region's cohorts."""
    racks: dict[str, set[str]] = defaultdict(set)
    rack_of: dict[str, str] = {}
    for node, rack in layout.values():
        racks[rack].add(node)
        rack_of[node] = rack
    out = []
    for r in rows:
        if r.get("record") != "fault":
            continue
        scopes: set[str] = set()
        if r["node_id"] and not r["device_uuid"]:
            scopes.add(r["node_id"])
            home = rack_of.get(r["node_id"])
            if home is not None and racks[home] == {r["node_id"]}:
                scopes.add(home)
        if r["rack_id"]:
            scopes |= {r["rack_id"], *racks.get(r["rack_id"], ())}
        names = {n for n in (r.get("accelerator_type"), r.get("model")) if n}
        out.append(
            Condition(
                r["kind"],
                datetime.fromisoformat(r["start_at"]),
                datetime.fromisoformat(r["end_at"]),
                frozenset(scopes),
                frozenset(names),
                r.get("region"),
            )
        )
    return out


def score(
    faults: list[Fault],
    verdicts: list[Verdict],
    decisions: list[Decision],
    command_appended: Mapping[UUID, datetime],
    verdict_appended: Mapping[UUID, datetime] | None = None,
    *,
    observed_s: float,
    grace_s: float = 60.0,
    conditions: list[Condition] | None = None,
) -> FaultScore:
    """Verdicts and decisions scored against the injected faults: detections, their
    delays, false isolations. ``observed_s`` is how long the fleet ran. A group's verdict
    (common mode) is no device's detection: it detects the node or rack fault it covers,
    and is unexplained when no fault or condition (``conditions``) covers its group."""
    grace = timedelta(seconds=grace_s)
    verdicts = sorted(verdicts, key=lambda v: v.observed_at)
    groups = [v for v in verdicts if v.level is not Level.DEVICE]
    verdicts = [v for v in verdicts if v.level is Level.DEVICE]
    episodes = _episodes(verdicts)

    def touching(device: str, at: datetime) -> list[Fault]:
        return [f for f in faults if device in f.devices and f.start <= at <= f.end + grace]

    true_detections = 0
    first: dict[str, datetime] = {}
    false_detections = []
    for v in episodes:
        hits = touching(v.device_uuid, v.observed_at)
        if hits:
            true_detections += 1
            for f in hits:
                first.setdefault(f.fault_id, v.observed_at)
        else:
            false_detections.append(f"{v.device_uuid}@{v.observed_at:%H:%M:%S} {v.evidence[:80]}")
    group_unexplained = []
    group_episodes = _episodes(groups)
    for v in group_episodes:
        scope = v.scope or v.device_uuid
        for f in faults:  # a node or rack fault its group's verdict names
            if scope in f.scopes and f.start <= v.observed_at <= f.end + grace:
                first.setdefault(f.fault_id, v.observed_at)
        active = [c for c in conditions or [] if c.start <= v.observed_at <= c.end + grace]
        if not any(c.covers(scope) for c in active):
            group_unexplained.append(
                f"{v.level.value} {scope}@{v.observed_at:%H:%M:%S} {v.attribution[:100]}"
            )
    ttd: dict[str, list[float]] = defaultdict(list)
    missed = []
    missed_flaps: list[Fault] = []
    grey_ttd: list[float | None] = []  # slowdowns of 15% or more: seconds, or None if missed
    storms = [0, 0]  # ECC storms flagged before their double-bit fault, ECC storms
    returned = _returned(verdicts)
    already_failed: list[str] = []
    from_return: dict[str, float] = {}
    no_trace: list[str] = []
    for f in faults:
        found = first.get(f.fault_id)
        # each device's return: the fault's start if it was in service then; None if the
        # detector held it failed past the end of the verdicts
        back = [returned(d, f.start) for d in f.devices]
        seen_from = f.start  # the first instant a device of it was not held failed
        if found is not None and f.devices:
            seen_from = min((b for b in back if b is not None), default=f.start)
            if seen_from > f.start:
                from_return[f.fault_id] = round((seen_from - f.start).total_seconds(), 3)
        taken = None if found is None else max(0.0, (found - seen_from).total_seconds())
        if taken is not None:
            ttd[f.kind].append(taken)
        elif f.devices and all(b is None or b > f.end for b in back):
            # held failed from its start to its end: a device that came back inside the
            # fault had the fault to show, and is judged
            already_failed.append(f.fault_id)
        elif f.xids_thrown == 0:
            no_trace.append(f.fault_id)
        else:
            missed.append(f.fault_id)
            if f.xids_thrown is not None:
                missed_flaps.append(f)
        if f.kind == "grey_slowdown" and f.params.get("slowdown_ratio", 0.0) >= GREY_TARGET_RATIO:
            grey_ttd.append(taken)
        if f.kind == "ecc_storm" and "lead_s" in f.params:
            storms[1] += 1
            storms[0] += taken is not None and taken < f.params["lead_s"]
    false_isolations = 0
    causes: list[str] = []
    node_devices: dict[str, set[str]] = defaultdict(set)
    for v in verdicts:
        node_devices[v.node_id].add(v.device_uuid)
    latency = []
    verdict_latency = []
    actions: dict[str, int] = defaultdict(int)
    refusals: dict[str, int] = defaultdict(int)
    for d in decisions:
        if d.outcome is DecisionOutcome.REFUSED:
            refusals[d.reason] += 1
            continue
        actions[d.action] += 1
        if d.action in ("restore", ATTRIBUTE):
            continue  # neither isolates a device
        node = node_devices.get(d.target)  # a node drained as one unit: each of its devices
        hit = (
            touching(d.target, d.decided_at)
            if node is None
            else any(touching(m, d.decided_at) for m in node)
            or any(d.target in f.scopes and f.start <= d.decided_at <= f.end + grace
                   for f in faults)
        )  # fmt: skip
        if not hit:
            false_isolations += 1 if node is None else len(node)
            unit = "" if node is None else f" [node: {len(node)} devices]"
            causes.append(
                f"{d.target}@{d.decided_at:%H:%M:%S} {d.action}{unit} ({d.reason}): "
                f"{d.message[:160]}"
            )
        appended = command_appended.get(d.command_id) if d.command_id else None
        if d.reason == "hard_fault" and appended and d.cause_appended_at:
            latency.append((appended - d.cause_appended_at).total_seconds())
            judged = (verdict_appended or {}).get(d.verdict_id) if d.verdict_id else None
            if judged is not None:
                verdict_latency.append((judged - d.cause_appended_at).total_seconds())
    tti, not_isolated = _time_to_isolate(faults, decisions, node_devices, grace)
    devices = {v.device_uuid for v in verdicts}  # the device verdicts only
    traced = [f for f in faults if f.fault_id not in no_trace]
    return FaultScore(
        precision=true_detections / len(episodes) if episodes else 1.0,
        recall=(len(traced) - len(missed)) / len(traced) if traced else 1.0,
        detections=len(episodes),
        true_detections=true_detections,
        faults=len(faults),
        detected=len(traced) - len(missed),
        false_isolations=false_isolations,
        device_days=len(devices) * observed_s / 86400.0,
        ttd_s=dict(ttd),
        tti_s=tti,
        not_isolated=not_isolated,
        missed=missed,
        already_failed=already_failed,
        from_return=from_return,
        no_trace=no_trace,
        missed_flaps=missed_flaps,
        false_detections=false_detections,
        false_isolation_causes=causes,
        group_detections=len(group_episodes),
        grey_ttd_s=grey_ttd,
        ecc_storms_before_dbe=(storms[0], storms[1]),
        group_unexplained=group_unexplained,
        isolation_latency_s=latency,
        verdict_latency_s=verdict_latency,
        actions=dict(actions),
        refusals=dict(refusals),
    )


def aggregate(per_seed: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Seeds' summaries together: the mean and the worst seed of each headline figure
    (worst: the lowest precision and recall, the most false isolations, the slowest
    detection), and per kind the worst seed's time to detect at p95."""
    if not per_seed:
        return {}
    runs = list(per_seed.values())

    def mean(key: str) -> float:
        return round(sum(float(r[key]) for r in runs) / len(runs), 4)

    def worst(key: str, *, low: bool) -> tuple[float, int] | tuple[None, None]:
        values = [(float(r[key]), seed) for seed, r in per_seed.items() if r[key] is not None]
        if not values:
            return (None, None)
        return min(values) if low else max(values)

    out: dict[str, Any] = {"seeds": len(runs)}
    for key, low in (("precision", True), ("recall", True),
                     ("false_isolations_per_1k_device_days", False)):  # fmt: skip
        value, seed = worst(key, low=low)
        out[f"{key}_mean"] = mean(key)
        out[f"{key}_worst"] = value
        out[f"{key}_worst_seed"] = seed
    out["false_isolations_total"] = sum(int(r["false_isolations"]) for r in runs)
    out["device_days_total"] = round(sum(float(r["device_days"]) for r in runs), 3)
    total = out["device_days_total"]
    out["false_isolations_per_1k_device_days_pooled"] = (
        round(1000.0 * out["false_isolations_total"] / total, 2) if total else 0.0
    )
    out["faults_total"] = sum(int(r["faults"]) for r in runs)
    out["missed_total"] = sum(len(r["missed"]) for r in runs)
    out["found_already_failed_total"] = sum(len(r.get("found_already_failed", [])) for r in runs)
    out["timed_from_return_total"] = sum(len(r.get("timed_from_return", {})) for r in runs)
    out["no_trace_total"] = sum(len(r.get("no_trace", [])) for r in runs)
    # the flaps missed, by how many XIDs each threw in its fault (one XID is no flap)
    thrown = Counter(n for r in runs for n in r.get("missed_flap_xids", {}).values())
    out["missed_flaps_by_xids_thrown"] = {str(n): thrown[n] for n in sorted(thrown)}
    grey = [t for r in runs for t in r.get("grey_15pct_ttd_s", [])]
    found = sorted(t for t in grey if t is not None)
    out["grey_15pct_faults"] = len(grey)
    out["grey_15pct_missed"] = len(grey) - len(found)
    # a missed slowdown counts as never detected: the p95 is over every one of them
    pooled = found + [math.inf] * (len(grey) - len(found))
    p95 = _q(pooled, 0.95) if pooled else None
    out["grey_15pct_ttd_p95_s"] = None if p95 is None or math.isinf(p95) else p95
    out["grey_15pct_within_30s"] = sum(1 for t in found if t <= 30.0)
    storms = [r.get("ecc_storms_flagged_before_dbe", [0, 0]) for r in runs]
    out["ecc_storms_flagged_before_dbe"] = [sum(s[0] for s in storms), sum(s[1] for s in storms)]
    kinds = sorted({k for r in runs for k in r["per_kind"]})
    out["ttd_p95_s_worst_by_kind"] = {
        k: max(
            (r["per_kind"][k]["ttd_p95_s"] for r in runs
             if k in r["per_kind"] and r["per_kind"][k]["ttd_p95_s"] is not None),
            default=None,
        )
        for k in kinds
    }  # fmt: skip
    out["time_to_isolate_p95_s_worst_by_kind"] = {
        k: max(
            (r["per_kind"][k].get("time_to_isolate_p95_s") for r in runs
             if k in r["per_kind"] and r["per_kind"][k].get("time_to_isolate_p95_s") is not None),
            default=None,
        )
        for k in kinds
    }  # fmt: skip
    out["not_isolated_total"] = sum(len(r.get("not_isolated", [])) for r in runs)
    return out


def _returned(verdicts: list[Verdict]) -> Callable[[str, datetime], datetime | None]:
    """When each device could be seen again after ``start`` (``verdicts`` in time order):
    ``start`` itself if the detector did not hold it ``failed`` then (its latest verdict
    at ``start`` said otherwise, or there was none), else its first verdict after
    ``start`` that was not ``failed``, or None if none came."""
    history: dict[str, list[tuple[datetime, bool]]] = defaultdict(list)
    for v in verdicts:
        history[v.device_uuid].append((v.observed_at, v.status is HealthStatus.FAILED))

    def returned(device: str, start: datetime) -> datetime | None:
        steps = history.get(device, [])
        i = bisect_right(steps, (start, True))
        if i == 0 or not steps[i - 1][1]:
            return start
        return next((at for at, failed in steps[i:] if not failed), None)

    return returned


def _time_to_isolate(
    faults: list[Fault],
    decisions: list[Decision],
    node_devices: Mapping[str, set[str]],
    grace: timedelta,
) -> tuple[dict[str, list[float]], list[str]]:
    """Per kind, seconds from each fault's start until every device it harms was out of
    full service (an allowed isolating step for the device, or for its node as one unit,
    during the fault; a device already out when the fault began counts as out at once);
    and the faults some device of which never was (held back by the guardrail, or not
    judged worth a step: a cohort's, a fault that ended first)."""
    steps: dict[str, list[tuple[datetime, bool]]] = defaultdict(list)  # device -> (at, out)
    for d in sorted(decisions, key=lambda d: d.decided_at):
        if d.outcome is DecisionOutcome.REFUSED or d.action == ATTRIBUTE:
            continue
        for device in node_devices.get(d.target) or (d.target,):
            steps[device].append((d.decided_at, d.action != "restore"))
    tti: dict[str, list[float]] = defaultdict(list)
    missing = []
    for f in faults:
        out_at = []
        for device in f.devices:
            before = [out for at, out in steps.get(device, ()) if at < f.start]
            during = [
                at for at, out in steps.get(device, ()) if out and f.start <= at <= f.end + grace
            ]
            if before and before[-1]:
                out_at.append(f.start)  # out of service already
            elif during:
                out_at.append(during[0])
            else:
                break
        else:
            if out_at:
                tti[f.kind].append(round((max(out_at) - f.start).total_seconds(), 3))
                continue
        missing.append(f"{f.fault_id} ({f.kind})")
    return dict(tti), missing


def _episodes(verdicts: list[Verdict]) -> list[Verdict]:
    """The first flagged verdict of each subject after it was healthy, in time order."""
    episodes: list[Verdict] = []
    flagged: set[str] = set()
    for v in verdicts:
        if v.status in FLAGGED and v.device_uuid not in flagged:
            flagged.add(v.device_uuid)
            episodes.append(v)
        elif v.status is HealthStatus.HEALTHY:
            flagged.discard(v.device_uuid)
    return episodes
