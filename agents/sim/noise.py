"""The telemetry path's imperfections, applied to a step's events on their way out.

Real pipelines lose a sample now and then, deliver one twice (a producer retry),
carry events from a node whose clock is off, and lag on one partition while the
others flow (every node whose key hashes there, :func:`partition_of`).
:class:`TelemetryNoise` does each of these to the simulator's events, from its
own generator, so a scenario can ask for them and a detector
is judged with them (:class:`~agents.sim.scenario.NoiseSpec`). Which nodes are
skewed, by how much, and which sit on the lagging partition are drawn once.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

from aiokafka.partitioner import murmur2

from agents.sim.scenario import NoiseSpec

Record = tuple[Any, Any]  # (topic spec, event)


def partition_of(node_id: str, partitions: int) -> int:
    """The partition a node's events land in, as the agents' producer puts them: Kafka's
    default partitioner (murmur2) on the node id (the key), so what lags here lags together
    there."""
    return int(murmur2(node_id.encode()) & 0x7FFFFFFF) % partitions


class TelemetryNoise:
    """Drops, duplicates, skews and delays events as ``spec`` says."""

    def __init__(self, spec: NoiseSpec, node_ids: list[str]) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        draw = random.Random(spec.seed + 1)
        self.skew: dict[str, timedelta] = {}
        for node in node_ids:
            if draw.random() < spec.skewed_nodes_ratio:
                offset = draw.uniform(-spec.clock_skew_s, spec.clock_skew_s)
                self.skew[node] = timedelta(seconds=offset)
        lagging = min(spec.delayed_partitions, spec.partitions)
        self.lagging = set(draw.sample(range(spec.partitions), lagging))
        self.delayed = {n for n in node_ids if partition_of(n, spec.partitions) in self.lagging}
        self._held: list[tuple[float, Record]] = []  # (due at, record), in order

    @property
    def active(self) -> bool:
        s = self.spec
        return bool(s.drop_ratio or s.duplicate_ratio or self.skew or self.delayed)

    def apply(self, records: list[Record], *, t_s: float) -> list[Record]:
        """The records a step delivers at simulated second ``t_s``: what was held back and is
        due now, then this step's, less the lost, with the copies."""
        if not self.active:
            return records
        s = self.spec
        out = [r for due, r in self._held if due <= t_s]
        self._held = [(due, r) for due, r in self._held if due > t_s]
        for spec, event in records:
            if s.drop_ratio and self.rng.random() < s.drop_ratio:
                continue
            node = getattr(event, "node_id", None)
            skew = self.skew.get(node) if node is not None else None
            if skew is not None:
                event = event.model_copy(update={"observed_at": event.observed_at + skew})
            copies = 2 if s.duplicate_ratio and self.rng.random() < s.duplicate_ratio else 1
            for _ in range(copies):
                if node in self.delayed and s.delay_s > 0:
                    self._held.append((t_s + s.delay_s, (spec, event)))
                else:
                    out.append((spec, event))
        return out
