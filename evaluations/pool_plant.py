"""A serving pool as a fluid model, one-second steps, for evaluating the control loop.

Load is in units of the pool's saturation at full clocks (``x = lambda * g *
t0 / 128`` summed over the pool: 1 means the batch grows without bound). A
device carrying load ``x_i`` at clock ratio ``c_i`` with slowdown ``k`` is busy
``e_i = x_i * k / c_i``; its batch is ``128 e_i / (1 - e_i)`` and

    tpot_p95 = t0 * k / c_i * (1 + spread) / (1 - e_i)

(Little's law with ``tpot = t0 (1 + batch / 128)``, as in :mod:`agents.sim.fleet`).
The pool's TPOT is the device TPOT that 95% of its load is served within.

The router is least-loaded within its weights: each device's share of the
pool's load is its routing weight (1 unless a route command set it) times the
clock it runs at (equal outstanding work per device converges to that), the
clock smoothed as a router's load counts are. So a device whose cap lowers its
clock takes less work, yet its tokens still take ``1 / c`` as long: only a
lower weight keeps its TPOT with its peers'. The router admits work
while every device's batch is under the batch-size target (the TPOT guard's
lever) and, with ``priority``, while the token time each measures on its
running batch stays under ``admit_ratio`` of the SLO; the rest waits in a
queue. A device draws ``idle + dyn * x_i * c_i`` watts, held under its cap by
lowering its clock (the firmware's job). A rack whose breaker trips goes dark,
hosts and devices, until its feed is back.

Three classes of work arrive each second: baseline (the scenario's profile
with noise), batch (deferrable) and optional (the capacity budget, a share of
what the router admits now). With ``priority`` the router serves baseline first, then batch, then
optional, and its :class:`~controllers.shedding.LoadShedder` degrades or drops
queued lower-value work by the queue's delay; without, all share one FIFO
queue and nothing is shed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from controllers.shedding import Admission, LoadShedder, ShedConfig, WorkClass

SLOT_SHARE = 128.0
OPTIONAL_TIMEOUT_S = 30.0  # optional work that waited this long is abandoned
ROUTER_SMOOTHING = 0.3  # per second: how fast the router's view of a device's speed moves


def slots(batch: int) -> float:
    """The busy share at which the batch reaches ``batch`` sequences."""
    return batch / (SLOT_SHARE + batch)


@dataclass(frozen=True, slots=True)
class PoolShape:
    devices: int
    racks: int
    tpot_base_s: float
    spread_ratio: float
    tpot_slo_s: float
    wait_slo_s: float  # baseline queueing delay allowed (TTFT minus prefill)
    idle_watts: float
    max_watts: float
    min_watts: float
    host_watts_per_rack: float
    low_clock_ratio: float = 0.7
    admit_ratio: float = 0.97


@dataclass(slots=True)
class Second:
    """What one second looked like."""

    baseline_tpot_s: float
    baseline_wait_s: float
    optional_served: float
    optional_offered: float
    batch_served: float
    rack_watts: list[float]
    queue_delay_s: float
    load_ratio: float  # in service and waiting, over what the router admits
    baseline_ratio: float  # the same, baseline and batch work only
    x_served: float


@dataclass(slots=True)
class PoolPlant:
    shape: PoolShape
    priority: bool
    seed: int
    max_batch: int = 256
    caps: list[float] = field(default_factory=list)  # per device
    low_clock: list[bool] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)  # per device: the router's weight
    tripped: set[int] = field(default_factory=set)  # racks whose breaker tripped: dark
    batch_target: int = 256
    slowdown: float = 1.0
    queues: dict[WorkClass, float] = field(default_factory=dict)
    optional_age_s: float = 0.0
    device_watts: list[float] = field(default_factory=list)
    device_tpot_s: list[float] = field(default_factory=list)  # last second's, per device
    device_batch: list[float] = field(default_factory=list)
    routed_clocks: list[float] = field(default_factory=list)  # what the router balances by
    rng: random.Random = field(init=False)
    shedder: LoadShedder = field(init=False)
    # (a device's watts, slowdown, at the router's mark) -> the most load it carries
    _oracle_cache: dict[tuple[float, float, bool], float] = field(init=False)
    _per_rack: list[int] = field(init=False)  # devices on each rack

    def __post_init__(self) -> None:
        n = self.shape.devices
        self.caps = self.caps or [self.shape.max_watts] * n
        self.low_clock = self.low_clock or [False] * n
        self.weights = self.weights or [1.0] * n
        self.routed_clocks = [1.0] * n
        self.device_watts = [self.shape.idle_watts] * n
        self.device_tpot_s = [self.shape.tpot_base_s] * n
        self.device_batch = [0.0] * n
        self.queues = {c: 0.0 for c in WorkClass}
        self.batch_target = self.max_batch
        self.rng = random.Random(self.seed)
        self.shedder = LoadShedder(ShedConfig())
        self._oracle_cache = {}
        self._per_rack = [0] * self.shape.racks
        for i in range(n):
            self._per_rack[self.rack_of(i)] += 1

    def rack_of(self, device: int) -> int:
        return device * self.shape.racks // self.shape.devices

    def shares(self) -> list[float]:
        """Each device's share of the pool's load (they sum to the device count): its
        weight times the clock the router saw it run at."""
        raw = [
            0.0 if self.rack_of(i) in self.tripped else w * c
            for i, (w, c) in enumerate(zip(self.weights, self.routed_clocks, strict=True))
        ]
        total = sum(raw)
        if total <= 0:  # every rack dark
            return [0.0] * len(raw)
        return [len(raw) * r / total for r in raw]

    def admission_cap(self) -> float:
        """Load (nominal units) the router admits: where the first device reaches the batch
        target or, with ``priority``, its token time ``admit_ratio`` of the SLO."""
        s = self.shape
        cap = math.inf
        for i, share in enumerate(self.shares()):
            if share <= 0:
                continue
            clock = self.routed_clocks[i]  # the token time it has measured lately
            busy = slots(self.batch_target)
            if self.priority:
                t0 = s.tpot_base_s * self.slowdown / clock * (1 + s.spread_ratio)
                busy = min(busy, max(0.0, 1.0 - t0 / (s.admit_ratio * s.tpot_slo_s)))
            cap = min(cap, busy * clock / self.slowdown / share)
        return 0.0 if math.isinf(cap) else cap

    def step(self, *, baseline: float, batch: float, optional_share: float) -> Second:
        s = self.shape
        cap = self.admission_cap()
        optional = optional_share * cap
        q = self.queues
        arrivals = {WorkClass.BASELINE: baseline, WorkClass.BATCH: batch,
                    WorkClass.OPTIONAL: optional}  # fmt: skip
        for cls, x in arrivals.items():
            q[cls] += x
        served = dict.fromkeys(WorkClass, 0.0)
        left = cap
        if self.priority:
            for cls in (WorkClass.BASELINE, WorkClass.BATCH, WorkClass.OPTIONAL):
                served[cls] = min(q[cls], left)
                left -= served[cls]
        else:
            total = sum(q.values())
            share = min(1.0, cap / total) if total > 0 else 0.0
            for cls in WorkClass:
                served[cls] = q[cls] * share
        for cls in WorkClass:
            q[cls] -= served[cls]
        delay = sum(q.values()) / cap if cap > 0 else math.inf
        load_ratio = (sum(served.values()) + sum(q.values())) / cap if cap > 0 else math.inf
        mandatory = (WorkClass.BASELINE, WorkClass.BATCH, WorkClass.BACKGROUND)
        baseline_ratio = sum(served[c] + q[c] for c in mandatory) / cap if cap > 0 else math.inf
        ahead = q[WorkClass.BASELINE] if self.priority else sum(q.values())
        baseline_wait = ahead / max(cap, 1e-9)
        optional_served = served[WorkClass.OPTIONAL]
        if self.priority:
            for cls in (WorkClass.OPTIONAL, WorkClass.BATCH):
                verdict = self.shedder.admit(cls, queue_delay_s=delay)
                if cls is WorkClass.OPTIONAL and verdict is Admission.DEGRADE:
                    q[cls] *= 0.5  # queued optional requests lose their extras
                elif cls is WorkClass.OPTIONAL and verdict is Admission.DROP:
                    q[cls] = 0.0
                # batch is deferred, never dropped: it waits at the back of the queue
        self.optional_age_s = self.optional_age_s + 1 if q[WorkClass.OPTIONAL] > 0 else 0
        if self.optional_age_s >= OPTIONAL_TIMEOUT_S:
            q[WorkClass.OPTIONAL], self.optional_age_s = 0.0, 0.0
        x = sum(served.values())
        tpot = self._power_and_tpot(x)
        racks = [0.0 if r in self.tripped else s.host_watts_per_rack for r in range(s.racks)]
        for i, w in enumerate(self.device_watts):
            racks[self.rack_of(i)] += w
        return Second(tpot, baseline_wait, optional_served, optional, served[WorkClass.BATCH],
                      racks, delay, load_ratio, baseline_ratio, x)  # fmt: skip

    def trip(self, rack: int) -> None:
        """The rack's breaker tripped: its hosts and devices are dark until it is reset."""
        self.tripped.add(rack)

    def reset(self, rack: int) -> None:
        """The rack's feed is back and its breaker reset: its devices serve again."""
        self.tripped.discard(rack)

    def settle(self, load: float) -> None:
        """Start as a pool that has been carrying load ``load`` (not one switched on cold)."""
        for _ in range(30):  # long enough for the router's view of the clocks to settle
            self._power_and_tpot(load)

    def _device_clock(self, index: int, load: float) -> float:
        """The clock device ``index``'s cap and mode allow at ``load`` (the firmware's
        choice)."""
        s = self.shape
        dyn = s.max_watts - s.idle_watts
        ceiling = s.low_clock_ratio if self.low_clock[index] else 1.0
        if load <= 0 or s.idle_watts + dyn * load * ceiling <= self.caps[index]:
            return ceiling
        return min(ceiling, max(0.2, (self.caps[index] - s.idle_watts) / (dyn * load)))

    def _power_and_tpot(self, load: float) -> float:
        """Each device carries its share; its clock is what its cap and mode allow. The
        pool's TPOT: the device TPOT that 95% of the load is served within."""
        s = self.shape
        dyn = s.max_watts - s.idle_watts
        shares = self.shares()
        for i, share in enumerate(shares):
            if self.rack_of(i) in self.tripped:
                self.device_watts[i] = self.device_tpot_s[i] = self.device_batch[i] = 0.0
                continue
            x_i = max(0.0, load) * share
            c = self._device_clock(i, x_i)
            self.device_watts[i] = s.idle_watts + dyn * x_i * c
            busy = min(0.999, x_i * self.slowdown / c)
            self.device_tpot_s[i] = (
                s.tpot_base_s * self.slowdown / c * (1 + s.spread_ratio) / (1.0 - busy)
            )
            self.device_batch[i] = SLOT_SHARE * busy / (1.0 - busy)
            # a least-loaded router's view of a device's speed moves with its counts, not
            # at once (and a device's clock under a cap moves with the load it is given)
            self.routed_clocks[i] += ROUTER_SMOOTHING * (c - self.routed_clocks[i])
        return _quantile_by(self.device_tpot_s, shares, 0.95)

    def oracle_load(self, limits_watts: list[float], *, at_mark: bool = False) -> float:
        """The most load this second could carry with TPOT in its SLO and every rack under
        its limit, at the best clock and share for each rack, knowing the slowdown: a
        baseline over it breaches whatever a controller does (batch work could wait).
        ``at_mark``: with TPOT within the router's own admission mark (``admit_ratio`` of
        the SLO) instead, the most this plant's router admits whatever the levers do."""
        s = self.shape
        total = sum(
            n * self._rack_oracle((lim - s.host_watts_per_rack) / n, at_mark)
            for lim, n in zip(limits_watts, self._per_rack, strict=True)
            if n
        )
        return total / s.devices

    def _rack_oracle(self, device_watts: float, at_mark: bool) -> float:
        """The most load one device can carry within the SLO (or the router's mark) on
        ``device_watts``."""
        key = (device_watts, self.slowdown, at_mark)
        best = self._oracle_cache.get(key)
        if best is None:
            best = self._oracle_cache[key] = self._best_load(device_watts, at_mark)
        return best

    def _best_load(self, device_watts: float, at_mark: bool) -> float:
        s = self.shape
        dyn = s.max_watts - s.idle_watts
        slo_s = s.tpot_slo_s * (s.admit_ratio if at_mark else 1.0)
        t0 = s.tpot_base_s * self.slowdown * (1 + s.spread_ratio) / slo_s
        power_room = (device_watts - s.idle_watts) / dyn
        best = 0.0
        for step in range(20, 101):
            c = step / 100.0
            x = min(
                (c - t0) / self.slowdown,
                slots(self.max_batch) * c / self.slowdown,
                power_room / c if power_room > 0 else 0.0,
            )
            # a clock the levers can hold: full, low-clock mode's ceiling, or one a cap
            # within the driver's range forces (a device under its floor runs faster)
            forced = (s.min_watts - s.idle_watts) / (dyn * x) if x > 0 else math.inf
            if c < min(s.low_clock_ratio, forced):
                continue
            best = max(best, x)
        return best

    def noisy(self, level: float, noise_ratio: float) -> float:
        return max(0.0, level * (1.0 + self.rng.gauss(0.0, noise_ratio)))


def _quantile_by(values: list[float], weights: list[float], share: float) -> float:
    """The smallest value that ``share`` of the weight is at or under."""
    total = sum(weights)
    seen = 0.0
    for value, weight in sorted(zip(values, weights, strict=True)):
        seen += weight
        if seen >= share * total:
            return value
    return max(values)
