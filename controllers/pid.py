"""A PID step: positional form, derivative on measurement, anti-windup, deadband.

For setpoint ``r``, measurement ``y`` and error ``e = r - y`` (positive when
the measurement is below the setpoint), with ``dt`` seconds since the last
measurement::

    P = kp * e
    I = I_prev + ki * e * dt          (not when the output is pinned at a clamp
                                       and ``e`` pushes further into it)
    D = -kd * dy/dt                    (on the measurement, low-pass filtered
                                       with time constant ``derivative_tau_s``)
    output = clamp(bias + P + I + D, out_min, out_max)

The derivative acts on the measurement, not the error, so a setpoint change
gives no kick. Within ``deadband`` of the setpoint the error counts as zero
(no integration; the output holds on its integral). A measurement that is not
finite changes nothing; a gap longer than ``max_gap_s`` restarts the
derivative (its history is too old to difference). Pure: state in, state out.

Example::

    cfg = PidConfig(kp=0.5, ki=0.05, kd=0.0, out_min=0.0, out_max=1.0)
    state, step = pid_step(cfg, PidState(), setpoint=0.9, measurement=0.7, now=observed_at)
    step.output, step.p, step.i, step.d
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum


class PidReason(StrEnum):
    TRACKING = "tracking"
    IN_DEADBAND = "in_deadband"
    SATURATED = "saturated"  # pinned at a clamp; the integral held (anti-windup)
    INVALID_INPUT = "invalid_input"  # NaN or inf: nothing changed
    FIRST = "first"  # no previous measurement: no integral or derivative yet


@dataclass(frozen=True, slots=True)
class PidConfig:
    kp: float
    ki: float
    kd: float
    out_min: float
    out_max: float
    bias: float = 0.0  # output at zero error and zero integral
    deadband: float = 0.0
    derivative_tau_s: float = 0.0
    max_gap_s: float = math.inf

    def __post_init__(self) -> None:
        for name in ("kp", "ki", "kd", "deadband", "derivative_tau_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, not {value!r}")
        if not (math.isfinite(self.out_min) and math.isfinite(self.out_max)):
            raise ValueError("output clamps must be finite")
        if self.out_min > self.out_max:
            raise ValueError(f"out_min {self.out_min} > out_max {self.out_max}")
        if not self.max_gap_s > 0:
            raise ValueError("max_gap_s must be positive")


@dataclass(frozen=True, slots=True)
class PidState:
    integral: float = 0.0
    last_measurement: float | None = None
    last_at: datetime | None = None
    derivative: float = 0.0  # filtered dy/dt
    output: float | None = None


@dataclass(frozen=True, slots=True)
class PidStep:
    output: float
    p: float
    i: float
    d: float
    error: float
    reason: PidReason


def pid_step(
    cfg: PidConfig, state: PidState, *, setpoint: float, measurement: float, now: datetime
) -> tuple[PidState, PidStep]:
    """One measurement, taken at ``now``, through the controller: the new state and the
    step's terms."""
    held = state.output if state.output is not None else _clamp(cfg, cfg.bias + state.integral)
    if not (math.isfinite(measurement) and math.isfinite(setpoint)):
        return state, PidStep(held, 0.0, state.integral, 0.0, math.nan, PidReason.INVALID_INPUT)
    error = setpoint - measurement
    if abs(error) <= cfg.deadband:
        error = 0.0
    p = cfg.kp * error
    dt = math.nan if state.last_at is None else (now - state.last_at).total_seconds()
    if state.last_measurement is None or not 0 < dt <= cfg.max_gap_s:
        i = state.integral
        out = _clamp(cfg, cfg.bias + p + i)
        new = replace(state, last_measurement=measurement, last_at=now, derivative=0.0, output=out)
        return new, PidStep(out, p, i, 0.0, error, PidReason.FIRST)
    slope = (measurement - state.last_measurement) / dt
    k = 1.0 if cfg.derivative_tau_s == 0 else dt / (cfg.derivative_tau_s + dt)
    derivative = state.derivative + k * (slope - state.derivative)
    d = -cfg.kd * derivative
    i = state.integral + cfg.ki * error * dt
    raw = cfg.bias + p + i + d
    reason = PidReason.IN_DEADBAND if error == 0.0 else PidReason.TRACKING
    if (raw > cfg.out_max and error > 0) or (raw < cfg.out_min and error < 0):
        # anti-windup: integrating further into a clamp only stores a debt to unwind later
        i = state.integral
        reason = PidReason.SATURATED
    # and never keep an integral that alone lies beyond the clamps
    i = min(max(i, cfg.out_min - cfg.bias), cfg.out_max - cfg.bias)
    out = _clamp(cfg, cfg.bias + p + i + d)
    new = PidState(i, measurement, now, derivative, out)
    return new, PidStep(out, p, i, d, error, reason)


def _clamp(cfg: PidConfig, value: float) -> float:
    return min(max(value, cfg.out_min), cfg.out_max)
