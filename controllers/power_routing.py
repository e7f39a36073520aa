"""Power-aware routing: the router's weight for a replica whose device our power cap (or
low-clock mode) holds down.

A capped device runs a slower clock, and every token it serves takes longer. A
least-loaded router already gives it less work (equal outstanding requests per
replica), which evens the batches, not the token times: its requests see a
TPOT up to ``1 / clock`` times its peers' (the pool's replicas of the same
model). So while a device is held down, the router weights its replica by what
keeps its TPOT with its peers'.

The model is the control planner's own (Little's law and the batch-slot model,
:class:`~planning.pools.ReplicaLoad`): a replica's TPOT is ``tau (1 + B / D)``,
with ``tau`` its time per token at a batch of one and ``D`` the doubling batch,
and its batch ``B = a T`` for a request intensity ``a`` (sequences started per
second of TPOT). So ``T = tau / (1 - a tau / D)``, and the pool's total
intensity ``A`` is served with every replica at one TPOT ``T*`` when each runs
at ``a_i = D (1 / tau_i - 1 / T*)``, where ``1 / T* = (sum 1 / tau_i - A / D) /
N``. A held replica's new weight is its weight times ``a_i / (its measured
a)``, relative to the mean of that factor over the replicas no cap holds (they
keep weight 1). Past saturation (no ``T*`` exists) the intensities follow each
replica's speed, ``1 / tau``. A capped device's clock rises as its load falls,
so the step overshoots a little; the next period's readings correct it.

When the power side caps a device under its draw, its weight falls at once in
proportion (the cap over the draw): a device capped to its floor at its old
share would breach within seconds. Then once a period, per pool: a held
replica whose TPOT is more than ``tolerance`` off its peers' (a reading's
noise moves nothing) takes ``gain`` of the model's step (in ratio: a capped
device's clock rises as its load falls, so the whole step overshoots; a rise
takes half that, as the clock falls again when load comes back), sent only
when the whole step is over ``tolerance`` and the damped one over half of it
(a sliver a period would be an action a period). When the pool is crowded
(its mandatory work waits, and no optional work is left to give up) a held
replica's rise is taken as a fall is, at ``gain`` and whenever the whole step
is over ``tolerance``: what it could carry and does not is then the queue's
growth, and a damped rise under half the tolerance, never sent, would leave it
a few percent short for good. TPOTs are not the measure when the pool is short of slots
rather than speed (crowded, and the free replicas at their batch cap, within
``tolerance``, at a TPOT under the target): a held replica then takes what its own batch
cap holds within the target TPOT, however level the TPOTs read. Weights fall at once (a
held replica breaches now), rise at most ``max_rise_ratio`` a period (a lower weight may
be what keeps its rack under its limit), never while its cap is at the driver's floor,
and never go under ``min_weight``. A replica on a rack the power side leaves over its
limit with every lever spent sheds the share of its pool's draw there that the rack is
over, at once (the planner sheds at the plan, and again at each reading that still finds
the rack over its breaker: a breaker trips in seconds); once its replicas there are at
``min_weight`` and the rack is still over, their pool's share of the model among the
region's pools goes (:meth:`PowerRouter.shed_pool`). A replica no cap holds any more
goes back to weight 1 as fast as the rise limit allows.

Example::

    router = PowerRouter(PowerRoutingConfig())
    router.step("pool-a", [ReplicaServing("gpu-1", "rack-1", 0.030, 40.0, 0.053, held=True),
                           ReplicaServing("gpu-2", "rack-2", 0.020, 40.0, 0.026)],
                doubling_batch=128)
    # -> [ReplicaWeight(device_uuid="gpu-1", weight=0.36..., reason=device_capped, ...)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

STEP = 0.01  # a weight change smaller than this is not sent


class PowerRouteReason(StrEnum):
    CAPPED = "device_capped"  # weighted to keep its TPOT with its peers'
    OVER_LIMIT = "rack_over_limit"  # every lever spent and still over: load off the rack
    LIFTED = "caps_lifted"  # no cap holds it any more: its weight goes back to 1
    # every replica of a model in the pool held: the pool's share of the model moves to
    # the region's other pools serving it, and comes back once a replica runs free
    POOL_CAPPED = "pool_capped"
    POOL_LIFTED = "pool_caps_lifted"


@dataclass(frozen=True, slots=True)
class PowerRoutingConfig:
    enabled: bool = True
    # a pool every cap holds sends its share of a model to the region's other pools
    across_pools: bool = True
    min_weight: float = 0.1
    tolerance: float = 0.05  # a replica within this share of its peers' TPOT keeps its weight
    max_rise_ratio: float = 1.5  # per period
    # the share of the model's step taken each period: a capped device's clock rises as its
    # load falls, so the full step overshoots (the next period would swing it back)
    gain: float = 0.5
    max_shed_ratio: float = 0.5  # the most one over-limit cut (one reading) takes off a weight

    def shed(self, level: float, over_ratio: float) -> float:
        """A weight (or a pool's admission) ``level`` cut by ``over_ratio`` of itself, the
        share a rack is over its breaker: at most ``max_shed_ratio``, never under
        ``min_weight``."""
        return max(self.min_weight, level * (1.0 - min(self.max_shed_ratio, over_ratio)))

    def __post_init__(self) -> None:
        if not 0.0 < self.min_weight <= 1.0:
            raise ValueError("min_weight is a weight in (0, 1]")
        if not 0.0 <= self.tolerance < 1.0:
            raise ValueError("tolerance is a share of a TPOT in [0, 1)")
        if self.max_rise_ratio <= 1.0:
            raise ValueError("max_rise_ratio must be over 1 (weights must be able to come back)")
        if not 0.0 < self.max_shed_ratio < 1.0:
            raise ValueError("max_shed_ratio is a share of a weight in (0, 1)")
        if not 0.0 < self.gain <= 1.0:
            raise ValueError("gain is a share of the model's step in (0, 1]")


@dataclass(frozen=True, slots=True)
class ReplicaServing:
    """One replica of a pool over one period (zeros: it reported nothing)."""

    device_uuid: str
    rack_id: str
    unit_tpot_s: float  # mean time per token at a batch of one
    batch: float  # mean running sequences
    tpot_s: float  # mean TPOT p95
    held: bool = False  # our cap or low-clock mode holds its device down
    # its cap is at the driver's floor: the power side has no lever left on it, so its
    # weight never rises (what it would draw is what keeps its rack under the breaker)
    at_floor: bool = False
    model: str = ""  # its peers serve the same model (TPOT is a model's own)
    batch_cap: float = math.inf  # its pool's batch cap: the most sequences it runs at once
    waiting: float = 0.0  # mean requests queued on it (its throughput spent, not its TPOT)

    @property
    def known(self) -> bool:
        return self.unit_tpot_s > 0 and self.tpot_s > 0


@dataclass(frozen=True, slots=True)
class ReplicaWeight:
    """A change of a replica's weight in its pool's router, and why."""

    device_uuid: str
    rack_id: str
    weight: float
    previous: float
    desired: float  # before the limits on a step
    reason: PowerRouteReason
    message: str


@dataclass(frozen=True, slots=True)
class PoolWeight:
    """A change of a pool's weight for one model in its region's router, and why."""

    pool: str
    model: str
    weight: float
    previous: float
    desired: float
    reason: PowerRouteReason
    message: str


@dataclass(slots=True)
class PowerRouter:
    config: PowerRoutingConfig
    weights: dict[tuple[str, str], float] = field(default_factory=dict)  # (pool, device)
    # (pool, model): the pool's weight for the model among the region's pools serving it
    pool_weights: dict[tuple[str, str], float] = field(default_factory=dict)

    def weight(self, pool: str, device_uuid: str) -> float:
        return self.weights.get((pool, device_uuid), 1.0)

    def pool_weight(self, pool: str, model: str) -> float:
        return self.pool_weights.get((pool, model), 1.0)

    def weighted(self, pool: str) -> list[str]:
        """The pool's devices the router weights under 1 now."""
        return [u for (p, u), w in self.weights.items() if p == pool and w < 1.0]

    def step(
        self,
        pool: str,
        replicas: list[ReplicaServing],
        *,
        doubling_batch: float,
        crowded: bool = False,
        target_tpot_s: float = math.inf,
    ) -> list[ReplicaWeight]:
        """One period of a pool: the weight changes to send. A replica's peers are the
        pool's replicas of the same model. ``crowded``: the pool's mandatory work waits
        with no optional work left to give up (a held replica's unused share is then the
        queue's growth: it rises at ``gain``, as it falls). ``target_tpot_s``: the latency
        setpoint within which a held replica fills its batch when the pool is short of slots
        (none: it never does)."""
        if not self.config.enabled:
            return []
        models: dict[str, list[ReplicaServing]] = {}
        for r in replicas:
            models.setdefault(r.model, []).append(r)
        return [
            w
            for group in models.values()
            for w in self._step(pool, group, doubling_batch, crowded, target_tpot_s)
        ]

    def _step(
        self, pool: str, replicas: list[ReplicaServing], doubling_batch: float, crowded: bool,
        target_tpot_s: float = math.inf,
    ) -> list[ReplicaWeight]:  # fmt: skip
        c = self.config
        known = [r for r in replicas if r.known and r.batch > 0]
        factors = _equalising_factors(known, doubling_batch)
        free = [r for r in known if not r.held]
        if free:  # the replicas no cap holds keep weight 1: scale to them
            reference = sum(factors[r.device_uuid] for r in free) / len(free)
        else:
            reference = max(factors.values(), default=1.0)
        peers = free or known
        peer_tpot = sum(r.tpot_s for r in peers) / len(peers) if peers else 0.0
        # the free replicas run full batches (their cap, within the tolerance) at a TPOT
        # under the target: what the pool cannot take is slots, not speed
        slot_bound = (
            bool(free)
            and math.isfinite(target_tpot_s)
            and peer_tpot < target_tpot_s
            and all(r.batch >= (1.0 - c.tolerance) * r.batch_cap for r in free)
        )
        out = []
        for r in replicas:
            now = self.weight(pool, r.device_uuid)
            if not r.held and now >= 1.0:
                continue
            factor = factors.get(r.device_uuid)
            # nothing known of it this period, or its TPOT with its peers': nothing to correct
            level = factor is None or abs(math.log(r.tpot_s / peer_tpot)) <= math.log1p(c.tolerance)
            # (no reference: the free replicas could take nothing more)
            ratio = 1.0 if level or factor is None or reference <= 0 else factor / reference
            if crowded and slot_bound and r.held and factor is not None:
                # the queue waits on its peers' full batches, not on their TPOT (under the
                # target): it takes what its own batch cap holds within the target, however
                # level the TPOTs read
                fill = _intensity_at(r, target_tpot_s, doubling_batch) / (r.batch / r.tpot_s)
                ratio = max(ratio, fill)
            if not r.held:  # as fast as its peers again: back as fast as the rise limit allows
                desired, new = 1.0, min(1.0, now * c.max_rise_ratio)
                send = new > now
                reason = PowerRouteReason.LIFTED
            else:
                desired, new, send = self._move(now, ratio, crowded=crowded,
                                                at_floor=r.at_floor)  # fmt: skip
                reason = PowerRouteReason.CAPPED
            if send:
                self.weights[(pool, r.device_uuid)] = new
                message = _message(pool, r, peer_tpot, now, new, reason)
                out.append(ReplicaWeight(r.device_uuid, r.rack_id, new, now, desired, reason,
                                         message))  # fmt: skip
        return out

    def _move(
        self, weight: float, ratio: float, *, crowded: bool, at_floor: bool,
        fall_limit: bool = False,
    ) -> tuple[float, float, bool]:  # fmt: skip
        """A held replica's or pool's ``weight`` and the model's ratio of intensities for it:
        the weight the model wants, the one to send within the limits, and whether it is
        worth sending (``fall_limit``: a fall of at most 1 / ``max_rise_ratio``)."""
        c = self.config
        # a held device's clock falls as its load rises: a rise takes half the step (in a
        # crowded pool, as much as a fall: what it could carry and does not waits, and a
        # step over the tolerance is always taken)
        gain = c.gain / 2 if ratio > 1 and not crowded else c.gain
        desired = min(1.0, weight * ratio**gain)
        if at_floor:
            desired = min(desired, weight)
        lowest = max(c.min_weight, weight / c.max_rise_ratio) if fall_limit else c.min_weight
        new = max(lowest, min(desired, weight * c.max_rise_ratio))
        # a correction whose whole step, or whose damped step, is under the tolerance (half
        # of it) moves its TPOT by less than the noise the tolerance forgives: not worth an
        # action (an oscillating load would send one every period)
        send = abs(new - weight) >= STEP and (
            ratio <= 0
            or (abs(math.log(ratio)) >= math.log1p(c.tolerance)
                and (crowded or abs(math.log(new / weight)) >= math.log1p(c.tolerance / 2)))
        )  # fmt: skip
        return desired, new, send

    def step_pools(
        self,
        pool: str,
        replicas: list[ReplicaServing],
        others: list[ReplicaServing],
        *,
        doubling_batch: float,
        target_tpot_s: float,
        crowded: bool = False,
    ) -> list[PoolWeight]:
        """One period of a pool, against ``others``: the replicas of the region's other
        pools at their last period. Per model, while every replica of it in the pool is
        held (no free peer in the pool to take its share): the pool's weight for the model
        is the one at which its TPOT is ``target_tpot_s`` (the latency setpoint), less
        only where the other pools' free replicas of the model have the room, at that TPOT,
        to take the rest; a pool within it keeps its share. Once one of its replicas runs
        free, back to 1 as fast as the rise limit allows."""
        if not self.config.enabled or not self.config.across_pools:
            return []
        models: dict[str, list[ReplicaServing]] = {}
        for r in replicas:
            models.setdefault(r.model, []).append(r)
        out = []
        for model, group in sorted(models.items()):
            change = self._step_pool(
                pool, model, group, others, doubling_batch, target_tpot_s, crowded
            )
            if change is not None:
                self.pool_weights[(pool, model)] = change.weight
                out.append(change)
        return out

    def _step_pool(
        self, pool: str, model: str, group: list[ReplicaServing], others: list[ReplicaServing],
        doubling_batch: float, target_s: float, crowded: bool,
    ) -> PoolWeight | None:  # fmt: skip
        c, now, d = self.config, self.pool_weight(pool, model), doubling_batch
        if any(not r.held for r in group):
            if now >= 1.0:
                return None  # a replica runs free: the pool's own routing evens it
            new = min(1.0, now * c.max_rise_ratio)
            return PoolWeight(pool, model, new, now, 1.0, PowerRouteReason.POOL_LIFTED,
                              f"{pool} for {model}: a replica runs free of caps again; weight "
                              f"{now:.2f} -> {new:.2f}")  # fmt: skip
        own = [r for r in group if r.known and r.batch > 0]
        peers = [r for r in others if r.model == model and r.known and r.batch > 0 and not r.held]
        if not own or not peers:
            return None  # nothing known of it, or no free replica elsewhere to take a share
        if any(r.waiting >= 1.0 for r in peers):
            # work waits on the other pools: they have no room to give (their throughput ran
            # out before their TPOT showed it). While none waits here, what was sent comes
            # back (a slow token beats a wait for a slot); once work waits here too, held
            if now >= 1.0 or sum(r.waiting for r in own) / len(own) >= 1.0:
                return None
            new = min(1.0, now * c.max_rise_ratio)
            message = (
                f"{pool} for {model}: work waits on the region's other pools' free replicas "
                f"and none here; weight {now:.2f} -> {new:.2f}"
            )
            return PoolWeight(pool, model, new, now, 1.0, PowerRouteReason.POOL_CAPPED, message)
        # request intensity (sequences started per second of TPOT) now, and at the target
        # TPOT or the batch cap, whichever binds first, by the batch-slot model: a = B / T,
        # and T = tau / (1 - a tau / D) = tau (1 + B / D)
        held = sum(r.batch / r.tpot_s for r in own)
        fits = sum(_intensity_at(r, target_s, d) for r in own)
        spare = sum(max(0.0, _intensity_at(r, target_s, d) - r.batch / r.tpot_s) for r in peers)
        tpot = sum(r.tpot_s for r in own) / len(own)
        if tpot > target_s:  # over: what the others can take, at most down to what fits
            wanted = max(fits, held - spare)
        elif now < 1.0:  # under, with a share sent away: as much back as fits
            wanted = fits
        else:
            return None
        if abs(math.log(tpot / target_s)) <= math.log1p(c.tolerance):
            return None  # within the noise of the target
        ratio = max(0.0, wanted) / held  # 0: the others can take it all
        # a fall at most 1 / max_rise_ratio a period: what the others can take is judged by
        # their TPOT, and their throughput may run out first (a queue stops it)
        desired, new, send = self._move(now, ratio, crowded=crowded, fall_limit=True,
                                        at_floor=all(r.at_floor for r in group))  # fmt: skip
        if not send:
            return None
        peer_tpot = sum(r.tpot_s for r in peers) / len(peers)
        message = (
            f"{pool} for {model}: every replica held down, TPOT {tpot * 1e3:.1f} ms against a "
            f"setpoint of {target_s * 1e3:.1f} ms (the region's other pools' free replicas at "
            f"{peer_tpot * 1e3:.1f} ms); weight {now:.2f} -> {new:.2f}"
        )
        return PoolWeight(pool, model, new, now, desired, PowerRouteReason.POOL_CAPPED, message)

    def capped(
        self, pool: str, device_uuid: str, rack_id: str, *, draw_watts: float, cap_watts: float
    ) -> ReplicaWeight | None:
        """A cap just set under the device's draw: its weight falls with its power at once,
        not a period later (a device capped to its floor at its old share breaches within
        seconds); the period's rule corrects it once readings show the new clock."""
        if draw_watts <= 0 or cap_watts >= draw_watts:
            return None
        why = (
            f"capped to {cap_watts:.0f} W from a draw of {draw_watts:.0f} W; with its power, "
            "until its readings show the clock it runs"
        )
        return self._cut(pool, device_uuid, rack_id, cap_watts / draw_watts,
                         PowerRouteReason.CAPPED, why)  # fmt: skip

    def shed(
        self, pool: str, device_uuid: str, rack_id: str, *, over_ratio: float
    ) -> ReplicaWeight | None:
        """Its rack is over its limit with every lever spent, by ``over_ratio`` of what its
        pool's devices there draw: that share of its work goes, at once (a breaker trips in
        seconds; the caller sheds at the plan and at each reading the rack stays over)."""
        if over_ratio <= 0:
            return None
        why = f"{rack_id} is {over_ratio:.0%} over its limit with every cap at its floor"
        kept = 1.0 - min(self.config.max_shed_ratio, over_ratio)
        return self._cut(pool, device_uuid, rack_id, kept, PowerRouteReason.OVER_LIMIT, why)

    def shed_pool(
        self, pool: str, model: str, rack_id: str, *, over_ratio: float
    ) -> PoolWeight | None:
        """Its replicas of ``model`` on ``rack_id``, over its limit with every lever spent,
        weigh the least a replica may and the rack is still over: the pool's share of the
        model among the region's pools goes down by ``over_ratio`` (at most
        ``max_shed_ratio``), at once. Only where the pool has no replica of the model that
        runs free (``step_pools`` brings it back once one does, or once the caps lift)."""
        c = self.config
        if not c.enabled or not c.across_pools or over_ratio <= 0:
            return None
        now = self.pool_weight(pool, model)
        new = c.shed(now, over_ratio)
        if now - new < STEP:
            return None
        self.pool_weights[(pool, model)] = new
        message = (
            f"{pool} for {model}: {rack_id} is {over_ratio:.0%} over its limit with every cap "
            f"at its floor and its replicas there at the least weight; weight {now:.2f} -> "
            f"{new:.2f}"
        )
        return PoolWeight(pool, model, new, now, new, PowerRouteReason.OVER_LIMIT, message)

    def _cut(
        self, pool: str, device_uuid: str, rack_id: str, kept: float, reason: PowerRouteReason,
        why: str,
    ) -> ReplicaWeight | None:  # fmt: skip
        """The replica's weight times ``kept`` (not under ``min_weight``), now."""
        if not self.config.enabled:
            return None
        now = self.weight(pool, device_uuid)
        new = max(self.config.min_weight, now * kept)
        if now - new < STEP:
            return None
        self.weights[(pool, device_uuid)] = new
        message = f"{pool} on {device_uuid} ({rack_id}): {why}; weight {now:.2f} -> {new:.2f}"
        return ReplicaWeight(device_uuid, rack_id, new, now, new, reason, message)


def _intensity_at(replica: ReplicaServing, tpot_s: float, doubling_batch: float) -> float:
    """The request intensity a replica carries at TPOT ``tpot_s``, or at its batch cap if
    that binds first (no queue: what waits is not carried)."""
    d, tau = doubling_batch, replica.unit_tpot_s
    at_tpot = max(0.0, d * (1.0 / tau - 1.0 / tpot_s))
    at_cap = replica.batch_cap / (tau * (1.0 + replica.batch_cap / d))
    return min(at_tpot, at_cap)


def _equalising_factors(replicas: list[ReplicaServing], doubling_batch: float) -> dict[str, float]:
    """Per replica, the factor on its request intensity that brings all to one TPOT."""
    if not replicas:
        return {}
    d = doubling_batch
    intensity = {r.device_uuid: r.batch / r.tpot_s for r in replicas}  # a = B / T
    total = sum(intensity.values())
    speed = sum(1.0 / r.unit_tpot_s for r in replicas)
    inverse_t = (speed - total / d) / len(replicas)
    out = {}
    for r in replicas:
        if inverse_t > 0:
            target = d * max(0.0, 1.0 / r.unit_tpot_s - inverse_t)
        else:  # past saturation: intensities by speed
            target = total / speed / r.unit_tpot_s
        out[r.device_uuid] = target / intensity[r.device_uuid]
    return out


def _message(
    pool: str, replica: ReplicaServing, peer_tpot: float, before: float, after: float,
    why: PowerRouteReason,
) -> str:  # fmt: skip
    where = f"{pool} on {replica.device_uuid} ({replica.rack_id})"
    if why is PowerRouteReason.LIFTED:
        return f"{where}: no cap holds it, weight {before:.2f} -> {after:.2f}"
    return (
        f"{where}: held down, TPOT {replica.tpot_s * 1e3:.1f} ms against its peers' "
        f"{peer_tpot * 1e3:.1f} ms ({replica.unit_tpot_s * 1e3:.1f} ms a token at a batch of one); "
        f"weight {before:.2f} -> {after:.2f} to bring it to theirs"
    )
