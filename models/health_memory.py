"""What a restarted detector must not relearn: each device's record, as plain numbers.

A device's history takes the detector minutes to hours to learn: its long-run
TPOT offset from its peers (a chip that always ran 3% slow is not news), its
correctable-ECC baseline rate, its top clock, a latched fatal XID, its XID flap
statistic, whether it had warmed up. Losing them on a restart would
judge every device as new (and miss a flapping XID, or a baseline already
risen). :func:`remember` turns a :class:`~models.health_state.DeviceState` into
a JSON-able mapping and :func:`recall` back; the health processor keeps them on
a compacted topic. Non-finite values (the "never" of a timestamp, the "not yet"
of a baseline) are written as ``None`` and read back as the field's default,
which is that same value. Where a sample comes from (its partition) is not kept:
the next sample says. Nor is when the device's verdict was last said: a
restarted detector says every device's verdict once on its first sample, so
the isolation ladder (which judges its own freshness on verdicts) hears from
the whole fleet at once instead of over the next keep-alive interval.

The cohorts (river models per model, accelerator and load band) and the
thermal fits are not kept: every device of a cohort feeds them, so they are
back within a minute of samples, and until then they judge nothing.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, fields
from typing import Any

from models.health_state import DeviceState
from schemas.base import AcceleratorType
from schemas.verdicts import HealthStatus

Memory = dict[str, Any]
_SKIPPED = {"source", "keepalive_s", "confirmed_emitted"}
_FIELDS = [f for f in fields(DeviceState) if f.name not in _SKIPPED]


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, AcceleratorType | HealthStatus):
        return value.value
    return value


def remember(device: DeviceState) -> Memory:
    """A device's record as JSON-able values (finite numbers, strings, lists, mappings)."""
    return {f.name: _plain(getattr(device, f.name)) for f in _FIELDS}


def recall(memory: Memory) -> DeviceState:
    """The record :func:`remember` made; a missing or ``None`` value takes the default."""
    given: dict[str, Any] = {}
    for f in _FIELDS:
        value = memory.get(f.name)
        if value is None:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ValueError(f"detector memory without {f.name}")
            continue
        if f.name == "kind":
            value = AcceleratorType(value)
        elif f.name == "status":
            value = HealthStatus(value)
        elif f.name == "since":
            value = {str(k): float(v) for k, v in value.items() if v is not None}
        given[f.name] = value
    return DeviceState(**given)
