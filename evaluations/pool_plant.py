"""A serving pool as a fluid model, one-second steps, for evaluating the control loop.

Load is in units of the pool's saturation at full clocks (``x = lambda * g *
t0 / 128`` summed over the pool: 1 means the batch grows without bound). With
clock ratio ``c`` and slowdown ``k`` a load ``x`` keeps the devices busy
``x_eff = x * k / c``; the batch is ``128 x_eff / (1 - x_eff)`` and

    tpot_p95 = t0 * k / c * (1 + spread) / (1 - x_eff)

(Little's law with ``tpot = t0 (1 + batch / 128)``, as in :mod:`agents.sim.fleet`).
The router admits work while the batch is under the batch-size target (the
TPOT guard's lever) and, with ``priority``, while the token time it measures
on the running batch (milliseconds of evidence) stays under ``admit_ratio``
of the SLO; the rest waits in a queue. A device draws ``idle + dyn * x_eff * c`` watts, held
under its cap by lowering its clock (the firmware's job).

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
    batch_target: int = 256
    slowdown: float = 1.0
    queues: dict[WorkClass, float] = field(default_factory=dict)
    optional_age_s: float = 0.0
    clocks: list[float] = field(default_factory=list)
    device_watts: list[float] = field(default_factory=list)
    x_last: float = 0.0
    rng: random.Random = field(init=False)
    shedder: LoadShedder = field(init=False)

    def __post_init__(self) -> None:
        n = self.shape.devices
        self.caps = self.caps or [self.shape.max_watts] * n
        self.low_clock = self.low_clock or [False] * n
        self.clocks = [1.0] * n
        self.device_watts = [self.shape.idle_watts] * n
        self.queues = {c: 0.0 for c in WorkClass}
        self.batch_target = self.max_batch
        self.rng = random.Random(self.seed)
        self.shedder = LoadShedder(ShedConfig())

    def rack_of(self, device: int) -> int:
        return device * self.shape.racks // self.shape.devices

    @property
    def batch_in_use(self) -> int:
        """Sequences per device in the last second's batch (Little's law)."""
        clock = sum(self.clocks) / len(self.clocks)
        x_eff = min(0.999, self.x_last * self.slowdown / clock)
        return round(SLOT_SHARE * x_eff / (1.0 - x_eff))

    def admission_cap(self, clock: float) -> float:
        """Load (nominal units) the router admits at mean clock ``clock``."""
        busy = slots(self.batch_target)
        if self.priority:
            s = self.shape
            t0 = s.tpot_base_s * self.slowdown / clock * (1 + s.spread_ratio)
            busy = min(busy, max(0.0, 1.0 - t0 / (s.admit_ratio * s.tpot_slo_s)))
        return busy * clock / self.slowdown

    def step(self, *, baseline: float, batch: float, optional_share: float) -> Second:
        s = self.shape
        cap = self.admission_cap(self._clock_for(self.x_last))
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
        racks = [s.host_watts_per_rack] * s.racks
        for i, w in enumerate(self.device_watts):
            racks[self.rack_of(i)] += w
        return Second(tpot, baseline_wait, optional_served, optional, served[WorkClass.BATCH],
                      racks, delay, load_ratio, baseline_ratio, x)  # fmt: skip

    def settle(self, load: float) -> None:
        """Start as a pool that has been carrying load ``load`` (not one switched on cold)."""
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

    def _clock_for(self, load: float) -> float:
        """The mean clock at load ``load``: what the router reads from its devices' limits."""
        return (
            sum(self._device_clock(i, load) for i in range(self.shape.devices)) / self.shape.devices
        )

    def _power_and_tpot(self, load: float) -> float:
        """Each device carries an equal share; its clock is what its cap and mode allow."""
        s = self.shape
        dyn = s.max_watts - s.idle_watts
        self.x_last = load
        for i in range(s.devices):
            self.clocks[i] = self._device_clock(i, load)
            self.device_watts[i] = s.idle_watts + dyn * max(0.0, load) * self.clocks[i]
        clock = sum(self.clocks) / len(self.clocks)
        x_eff = min(0.999, load * self.slowdown / clock)
        return s.tpot_base_s * self.slowdown / clock * (1 + s.spread_ratio) / (1.0 - x_eff)

    def oracle_load(self, limits_watts: list[float]) -> float:
        """The most load this second could carry with TPOT in its SLO and every rack under
        its limit, at the best clock for it, knowing the slowdown: a baseline over it
        breaches whatever a controller does (batch work could wait)."""
        s = self.shape
        dyn = s.max_watts - s.idle_watts
        t0 = s.tpot_base_s * self.slowdown * (1 + s.spread_ratio) / s.tpot_slo_s
        # every device carries the same share, so the rack with the least power per device
        # (its limit less its hosts, over the devices in it) binds
        per_rack = [0] * s.racks
        for i in range(s.devices):
            per_rack[self.rack_of(i)] += 1
        power_room = min(
            ((lim - s.host_watts_per_rack) / n - s.idle_watts) / dyn
            for lim, n in zip(limits_watts, per_rack, strict=True)
            if n
        )
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
