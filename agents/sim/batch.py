"""Deferrable batch work in the simulated fleet, and where the batch scheduler puts it.

Each pool runs standing batch jobs (offline scoring, evaluation, embedding
backfills: work due in hours, not seconds) worth ``ratio`` of its serving
replicas' capacity, spread over them by capacity. A replica serves batch work
from what baseline leaves spare, before any optional work; what it cannot
serve is deferred to its pool's backlog and offered again next step, never
dropped (the backlog holds at most ``backlog_limit_s`` of the pool's batch
work; the rest counts as late).

A move (the router's ``move_batch``) places ``ratio`` of a pool's batch work on
one rack in another pool instead (or on the same pool's other racks): that
rack draws less, and the work is still done where there is headroom. Work
that has nowhere to go (no serving replica off the moved racks) stays put.

Example::

    work = BatchWork(ratio=0.2)
    work.moves[("us-east-h100", "rack-0000")] = (1.0, "us-west-h100")
    work.place([(device, capacity_rps), ...], dt=5.0)   # sets each device's batch offer
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agents.sim.state import Device


@dataclass(slots=True)
class BatchWork:
    ratio: float = 0.0  # of each serving replica's capacity, in batch jobs
    backlog_limit_s: float = 600.0
    # (pool, rack) -> (share of the pool's batch work on the rack moved, the pool taking it)
    moves: dict[tuple[str, str], tuple[float, str]] = field(default_factory=dict)
    backlog: dict[str, float] = field(default_factory=dict)  # pool -> requests deferred
    standing: dict[str, float] = field(default_factory=dict)  # pool -> rps of its own jobs
    late_total: float = 0.0  # requests the backlog could not hold
    moved_rps: float = 0.0  # placed away from its rack in the last step

    @property
    def active(self) -> bool:
        """Whether there is any batch work to place (a fleet without it skips the step)."""
        return self.ratio > 0 or any(self.backlog.values())

    def place(self, serving: Sequence[tuple[Device, float]], *, dt: float) -> None:
        """Set ``batch_offered_rps`` on each serving ``(device, capacity_rps)``."""
        by_pool: dict[str, list[tuple[Device, float]]] = {}
        for dev, capacity in serving:
            dev.batch_offered_rps = 0.0
            by_pool.setdefault(dev.pool, []).append((dev, capacity))
        hot = {rack for (_, rack), (r, _) in self.moves.items() if r > 0}
        takers = {
            pool: [(d, c) for d, c in members if d.node.rack_id not in hot and c > 0]
            for pool, members in by_pool.items()
        }
        moved: dict[str, float] = {}
        self.standing, self.moved_rps = {}, 0.0
        for pool, members in by_pool.items():
            total = sum(c for _, c in members)
            if total <= 0:
                continue
            self.standing[pool] = self.ratio * total
            demand = self.ratio * total + self.backlog.pop(pool, 0.0) / dt
            for dev, capacity in members:
                share = demand * capacity / total
                r, to = self.moves.get((pool, dev.node.rack_id), (0.0, pool))
                if not takers.get(to):
                    r = 0.0  # nowhere to go: it stays put
                dev.batch_offered_rps += share * (1.0 - r)
                moved[to] = moved.get(to, 0.0) + share * r
        for to, rps in moved.items():
            total = sum(c for _, c in takers.get(to, []))
            if rps <= 0 or total <= 0:
                continue
            self.moved_rps += rps
            for dev, capacity in takers[to]:
                dev.batch_offered_rps += rps * capacity / total

    def defer(self, pool: str, requests: float) -> None:
        """Batch work not served this step waits for the next."""
        if requests <= 0:
            return
        held = self.backlog.get(pool, 0.0) + requests
        limit = self.backlog_limit_s * self.standing.get(pool, 0.0)
        if held > limit:
            self.late_total += held - limit
            held = limit
        self.backlog[pool] = held
