"""Node-tick envelopes at the agent's edge: one message per node per tick per family.

A tick's source (the simulated fleet, an NVML reader) yields one v1 record per
device sample and per serving replica; :func:`pack` turns a node's samples of
one instant into one v2 envelope (:mod:`schemas.envelopes`) before they are
published, so the broker and every consumer pay per node, not per device. The
envelope takes the first sample's event id, which is unique and, in a seeded
simulation, reproducible. Other families pass through as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from schemas.envelopes import MAX_SAMPLES, pack_accelerator, pack_serving
from schemas.topics import ACCELERATOR, ACCELERATOR_TICKS, SERVING, SERVING_TICKS, TopicSpec

_PACKED = {ACCELERATOR.name: ACCELERATOR_TICKS, SERVING.name: SERVING_TICKS}


def pack(records: Sequence[tuple[TopicSpec, Any]]) -> list[tuple[TopicSpec, Any]]:
    """``records`` with each node's accelerator samples and serving metrics of one instant
    packed into one envelope each (in the place of the node's first such record, so a
    node's families keep their order); the rest unchanged."""
    slots: list[tuple[TopicSpec, Any]] = []  # a record, or an envelope's list of samples
    open_at: dict[tuple[str, str, object], int] = {}  # (topic, node, instant) -> its slot
    for spec, value in records:
        target = _PACKED.get(spec.name)
        if target is None:
            slots.append((spec, value))
            continue
        key = (target.name, value.node_id, value.observed_at)
        at = open_at.get(key)
        if at is None or len(slots[at][1]) == MAX_SAMPLES:
            at = open_at[key] = len(slots)
            slots.append((target, []))
        slots[at][1].append(value)
    return [
        (spec, _PACKERS[spec.name](value, event_id=value[0].event_id))
        if spec.name in _PACKERS
        else (spec, value)
        for spec, value in slots
    ]


_PACKERS = {ACCELERATOR_TICKS.name: pack_accelerator, SERVING_TICKS.name: pack_serving}
