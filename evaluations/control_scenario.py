"""Control scenarios: one pool's load, power and sensor events over time, as data.

A control scenario (YAML) drives `fleetloop eval control`::

    name: control-mix
    duration_s: 7200
    period_s: 10
    pool: {devices: 16, racks: 2}
    baseline:                                   # share of the pool's saturation
      - {at_s: 0, level: 0.35}
      - {at_s: 1800, kind: oscillate, level: 0.35, amplitude_ratio: 0.05, period_s: 120}
      - {at_s: 3600, kind: step, level: 0.42}
      - {at_s: 4800, kind: ramp, level: 0.42, to: 0.5, until_s: 5400}
      - {at_s: 5400, kind: trace, level: 0.45, step_s: 120, shape: [1.0, 1.1, 0.9]}
    events:
      - {at_s: 5400, kind: breaker, rack: 0, limit_ratio: 0.6, duration_s: 600}
      - {at_s: 6300, kind: stale, duration_s: 60}   # no latency reaches the controller
      - {at_s: 6600, kind: spike, factor: 3}        # one reading, three times the truth
      - {at_s: 6700, kind: nan}                      # one reading that is not a number
      - {at_s: 6000, kind: slowdown, ratio: 1.3, duration_s: 300}

Unknown keys are errors.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

M = TypeVar("M", bound=BaseModel)


class _Closed(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class ControlScenarioError(ValueError):
    pass


class PoolSpec(_Closed):
    devices: int = Field(16, ge=1)
    racks: int = Field(2, ge=1)
    tpot_base_s: float = Field(0.015, gt=0)
    spread_ratio: float = Field(0.15, ge=0)
    tpot_slo_s: float = Field(0.06, gt=0)
    wait_slo_s: float = Field(1.0, gt=0)
    idle_watts: float = Field(90.0, gt=0)
    max_watts: float = Field(700.0, gt=0)
    min_watts: float = Field(200.0, gt=0)
    host_watts_per_rack: float = Field(1200.0, ge=0)
    breaker_ratio: float = Field(0.85, gt=0, le=1)  # of the rack's nameplate
    trip_after_s: float = Field(5.0, gt=0)
    max_batch: int = Field(256, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> PoolSpec:
        if not self.idle_watts < self.min_watts <= self.max_watts:
            raise ValueError("idle_watts < min_watts <= max_watts")
        if self.racks > self.devices:
            raise ValueError("at least one device per rack")
        return self

    @property
    def nameplate_watts(self) -> float:
        return self.host_watts_per_rack + self.max_watts * self.devices / self.racks


class Segment(_Closed):
    at_s: float = Field(ge=0)
    kind: Literal["steady", "step", "ramp", "oscillate", "trace"] = "steady"
    level: float = Field(ge=0)
    to: float | None = Field(None, ge=0)
    until_s: float | None = None
    amplitude_ratio: float = Field(0.05, ge=0, lt=1)
    period_s: float = Field(120.0, gt=0)
    # trace: a recorded series' shape (each value over the series' mean), one value per
    # step_s, joined by straight lines; the load is level times the shape
    shape: list[float] = Field(default_factory=list)
    step_s: float = Field(600.0, gt=0)

    @model_validator(mode="after")
    def _ramp_has_an_end(self) -> Segment:
        if self.kind == "ramp" and (self.to is None or self.until_s is None):
            raise ValueError("a ramp needs 'to' and 'until_s'")
        if self.until_s is not None and self.until_s <= self.at_s:
            raise ValueError("until_s must be after at_s")
        if self.kind == "trace" and (not self.shape or min(self.shape) < 0):
            raise ValueError("a trace needs a 'shape' of values >= 0")
        return self


class ControlEvent(_Closed):
    at_s: float = Field(ge=0)
    kind: Literal["breaker", "stale", "spike", "nan", "slowdown"]
    duration_s: float = Field(0.0, ge=0)
    rack: int = Field(0, ge=0)
    limit_ratio: float = Field(0.6, gt=0, le=1)  # breaker: the limit as a share of nameplate
    factor: float = Field(3.0, gt=0)  # spike: the reading over the truth
    ratio: float = Field(1.3, ge=1)  # slowdown: time per token over normal

    def active(self, at_s: float) -> bool:
        return self.at_s <= at_s < self.at_s + max(self.duration_s, 1.0)


class ControlScenario(_Closed):
    name: str
    description: str = ""
    duration_s: float = Field(gt=0)
    period_s: float = Field(10.0, gt=0)
    seed: int = 1
    pool: PoolSpec = PoolSpec()
    noise_ratio: float = Field(0.02, ge=0)  # baseline load, per second
    sensor_noise_ratio: float = Field(0.01, ge=0)
    baseline: list[Segment] = Field(min_length=1)
    batch_level: float = Field(0.05, ge=0)
    static_budget: float = Field(0.15, ge=0, le=1)
    events: list[ControlEvent] = Field(default_factory=list)

    @model_validator(mode="after")
    def _sorted(self) -> ControlScenario:
        starts = [s.at_s for s in self.baseline]
        if starts != sorted(starts) or starts[0] != 0:
            raise ValueError("baseline segments start at 0 and are in time order")
        if any(e.kind == "breaker" and e.rack >= self.pool.racks for e in self.events):
            raise ValueError("a breaker event names a rack the pool does not have")
        return self

    def segment_at(self, at_s: float) -> Segment:
        return [s for s in self.baseline if s.at_s <= at_s][-1]

    def baseline_at(self, at_s: float) -> float:
        s = self.segment_at(at_s)
        if s.kind == "ramp":
            assert s.to is not None and s.until_s is not None
            done = min(1.0, (at_s - s.at_s) / (s.until_s - s.at_s))
            return s.level + (s.to - s.level) * done
        if s.kind == "oscillate":
            phase = 2 * math.pi * (at_s - s.at_s) / s.period_s
            return s.level * (1 + s.amplitude_ratio * math.sin(phase))
        if s.kind == "trace":
            where = (at_s - s.at_s) / s.step_s
            k = min(int(where), len(s.shape) - 1)
            after = s.shape[min(k + 1, len(s.shape) - 1)]
            return s.level * (s.shape[k] + (after - s.shape[k]) * min(1.0, where - k))
        return s.level

    def limits_at(self, at_s: float) -> list[float]:
        p = self.pool
        limits = [p.breaker_ratio * p.nameplate_watts] * p.racks
        for e in self.events:
            if e.kind == "breaker" and e.active(at_s):
                limits[e.rack] = min(limits[e.rack], e.limit_ratio * p.nameplate_watts)
        return limits

    def events_at(self, at_s: float, kind: str) -> list[ControlEvent]:
        return [e for e in self.events if e.kind == kind and e.active(at_s)]


def load_yaml_model(path: Path, model: type[M]) -> M:
    """``path``'s YAML as ``model``; any fault (unreadable, not YAML, not valid) is a
    :class:`ControlScenarioError` naming the file."""
    try:
        raw: Any = yaml.safe_load(path.read_text())
        return model.model_validate(raw or {})
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise ControlScenarioError(f"{path}: {exc}") from None


def load_control_scenario(path: Path) -> ControlScenario:
    return load_yaml_model(path, ControlScenario)
