"""Control scenario families: each seed draws one pool's scenario from declared ranges.

`fleetloop eval control --family FILE --seeds A-B` runs :func:`run_family`: each
seed's :class:`~evaluations.control_scenario.ControlScenario` is drawn by
:func:`draw_control_scenario` and run by :func:`~evaluations.control.run_eval_control`
(the production planner, static and HPA-style on the same draws), and the seeds
the family was not tuned on are summed up: mean and worst seed.

A family (YAML, unknown keys are errors) says how big the pool is, how its load
moves and what goes wrong, each number a value or a ``[low, high]`` range::

    name: pool-mix
    tune_seeds: [1, 2, 3, 4, 5]
    duration_s: 5400
    pool: {devices: [8, 48], racks: [2, 6], tpot_slo_s: [0.045, 0.08]}
    load:
      level: [0.2, 0.45]            # where the baseline starts, of the pool's saturation
      segment_s: [450, 900]
      kinds: {steady: 1, step: 3, ramp: 2, oscillate: 2, trace: 2}   # weights
      trace: {path: ../data/servegen/rates_2days.csv, windows: [6, 18], window_s: [60, 300]}
    events:
      slowdown: {count: [1, 2], ratio: [1.1, 1.5], duration_s: [60, 600]}
      breaker: {count: [1, 2], racks: [1, 2], limit_ratio: [0.6, 0.8], duration_s: [300, 900]}

A ``trace`` segment replays a slice of a recorded request-rate series (one of
its models, consecutive windows) as the baseline's shape around the drawn
level, each window compressed to ``window_s``. Levels stay between ``floor``
and ``ceiling`` times what the pool can carry within its SLO at full clocks,
so a draw is never hopeless by construction; a slowdown or a breaker may still
make some periods unattainable, which the oracle's attainment says.
"""

from __future__ import annotations

import csv
import math
import random
import statistics
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agents.sim.family import draw
from evaluations.control import SHORTFALL_CAUSES, SUFFIXES, causes_line, run_eval_control
from evaluations.control_scenario import (
    ControlEvent,
    ControlScenario,
    ControlScenarioError,
    PoolSpec,
    Segment,
    load_yaml_model,
)

Range = float | tuple[float, float]
Kind = Literal["steady", "step", "ramp", "oscillate", "trace"]
KINDS: tuple[Kind, ...] = ("steady", "step", "ramp", "oscillate", "trace")


def _default_kinds() -> dict[Kind, float]:
    return {"steady": 1.0, "step": 3.0, "ramp": 2.0, "oscillate": 2.0}


class _Closed(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class PoolDraw(_Closed):
    devices: Range = (8, 48)
    racks: Range = (2, 6)
    tpot_slo_s: Range = (0.045, 0.08)
    max_batch: Range = 256


class TraceDraw(_Closed):
    path: str  # relative to the family file
    windows: Range = (6, 18)  # consecutive windows of one model's series
    window_s: Range = (60, 300)  # each window compressed to this many seconds


class LoadDraw(_Closed):
    level: Range = (0.2, 0.45)
    segment_s: Range = (450, 900)
    kinds: dict[Kind, float] = Field(default_factory=_default_kinds)  # weights
    step_ratio: Range = (0.2, 0.35)  # a step's size, up or down, of the level before it
    ramp_ratio: Range = (0.15, 0.4)
    amplitude_ratio: Range = (0.03, 0.08)
    oscillation_s: Range = (60, 300)
    trace: TraceDraw | None = None
    floor: float = Field(0.15, gt=0)  # of what the pool can carry within its SLO
    ceiling: float = Field(0.75, gt=0, le=1)


class EventDraw(_Closed):
    count: Range = (0, 1)
    duration_s: Range = (60, 300)
    ratio: Range = (1.1, 1.5)  # slowdown
    racks: Range = 1  # breaker: racks losing feed at once
    limit_ratio: Range = (0.6, 0.8)  # breaker
    factor: Range = (2, 4)  # spike


class ControlFamily(_Closed):
    name: str
    description: str = ""
    tune_seeds: list[int] = Field(default_factory=list)
    duration_s: float = Field(5400.0, gt=0)
    period_s: float = Field(10.0, gt=0)
    pool: PoolDraw = PoolDraw()
    load: LoadDraw = LoadDraw()
    batch_level: Range = (0.0, 0.1)
    noise_ratio: Range = (0.01, 0.03)
    sensor_noise_ratio: Range = (0.005, 0.02)
    events: dict[Literal["slowdown", "breaker", "stale", "spike", "nan"], EventDraw] = Field(
        default_factory=dict
    )
    home: Path | None = Field(None, exclude=True)  # the family file's folder


def load_control_family(path: Path) -> ControlFamily:
    """Read and validate a family file; its trace path resolves beside it."""
    return load_yaml_model(path, ControlFamily).model_copy(update={"home": path.parent})


def _whole(rng: random.Random, value: Range) -> int:
    return round(draw(rng, value))


def _traces(family: ControlFamily) -> dict[str, list[float]]:
    """Each model's series in the family's trace file (``model`` and ``total_rate_rps``
    columns, rows in time order)."""
    spec = family.load.trace
    if spec is None:
        return {}
    path = Path(spec.path) if family.home is None else family.home / spec.path
    series: dict[str, list[float]] = {}
    try:
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                series.setdefault(row["model"], []).append(float(row["total_rate_rps"]))
    except (OSError, KeyError, ValueError) as exc:
        raise ControlScenarioError(f"{path}: not a rate series ({exc})") from None
    return series


def draw_control_scenario(family: ControlFamily, seed: int) -> ControlScenario:
    """Seed ``seed``'s scenario: the same family and seed always draw the same one."""
    rng = random.Random(f"{family.name}/{seed}")
    p = family.pool
    devices = _whole(rng, p.devices)
    racks = max(1, min(devices, _whole(rng, p.racks)))
    pool = PoolSpec(
        devices=devices, racks=racks, tpot_slo_s=draw(rng, p.tpot_slo_s),
        max_batch=_whole(rng, p.max_batch),
    )  # fmt: skip
    # what the pool carries within its SLO at full clocks (the plant's fluid model)
    carry = 1.0 - pool.tpot_base_s * (1 + pool.spread_ratio) / pool.tpot_slo_s
    lo, hi = family.load.floor * carry, family.load.ceiling * carry
    segments = _segments(family, rng, lo, hi)
    events = _events(family, rng, racks)
    return ControlScenario(
        name=f"{family.name}-{seed}",
        description=f"drawn from family {family.name}, seed {seed}",
        duration_s=family.duration_s, period_s=family.period_s, seed=seed, pool=pool,
        noise_ratio=draw(rng, family.noise_ratio),
        sensor_noise_ratio=draw(rng, family.sensor_noise_ratio),
        baseline=segments, batch_level=draw(rng, family.batch_level),
        static_budget=0.25, events=events,
    )  # fmt: skip


def _segments(family: ControlFamily, rng: random.Random, lo: float, hi: float) -> list[Segment]:
    load = family.load
    traces = _traces(family)
    kinds = [k for k in KINDS if load.kinds.get(k, 0) > 0 and (k != "trace" or traces)]
    weights = [load.kinds[k] for k in kinds]
    level = min(hi, max(lo, draw(rng, load.level)))
    out = [Segment(at_s=0, level=level)]
    at = draw(rng, load.segment_s)
    while at < family.duration_s:
        kind = rng.choices(kinds, weights)[0]
        sign = rng.choice((-1.0, 1.0))
        if kind == "step":
            level = min(hi, max(lo, level * (1 + sign * draw(rng, load.step_ratio))))
            out.append(Segment(at_s=at, kind="step", level=level))
        elif kind == "ramp":
            to = min(hi, max(lo, level * (1 + sign * draw(rng, load.ramp_ratio))))
            until = at + draw(rng, load.segment_s)
            out.append(Segment(at_s=at, kind="ramp", level=level, to=to, until_s=until))
            level, at = to, until
        elif kind == "oscillate":
            amplitude = min(draw(rng, load.amplitude_ratio), hi / level - 1)
            out.append(Segment(at_s=at, kind="oscillate", level=level,
                               amplitude_ratio=max(0.0, amplitude),
                               period_s=draw(rng, load.oscillation_s)))  # fmt: skip
        elif kind == "trace":
            out.append(_trace(rng, load, traces, at, level, lo, hi))
        else:
            out.append(Segment(at_s=at, level=level))
        at += draw(rng, load.segment_s)
    return out


def _trace(
    rng: random.Random, load: LoadDraw, traces: dict[str, list[float]], at: float,
    level: float, lo: float, hi: float,
) -> Segment:  # fmt: skip
    """A slice of one model's recorded series as the shape around ``level``, squeezed so
    its highs and lows stay within ``[lo, hi]``."""
    assert load.trace is not None
    series = traces[rng.choice(sorted(traces))]
    n = max(2, min(len(series), _whole(rng, load.trace.windows)))
    start = rng.randrange(0, len(series) - n + 1)
    raw = series[start : start + n]
    mean = statistics.fmean(raw) or 1.0
    shape = [v / mean for v in raw]
    top, bottom = max(shape), min(shape)
    squeeze = 1.0
    if level * top > hi:
        squeeze = min(squeeze, (hi / level - 1) / max(top - 1, 1e-9))
    if level * bottom < lo:
        squeeze = min(squeeze, (1 - lo / level) / max(1 - bottom, 1e-9))
    shape = [1 + (v - 1) * max(0.0, squeeze) for v in shape]
    return Segment(at_s=at, kind="trace", level=level, shape=shape,
                   step_s=draw(rng, load.trace.window_s))  # fmt: skip


def _events(family: ControlFamily, rng: random.Random, racks: int) -> list[ControlEvent]:
    out: list[ControlEvent] = []
    span = family.duration_s
    for kind, spec in sorted(family.events.items()):
        for _ in range(_whole(rng, spec.count)):
            at = rng.uniform(0.1 * span, 0.9 * span)
            duration = 0.0 if kind in ("spike", "nan") else draw(rng, spec.duration_s)
            if kind == "breaker":
                hit = rng.sample(range(racks), max(1, min(racks, _whole(rng, spec.racks))))
                limit = draw(rng, spec.limit_ratio)
                out += [ControlEvent(at_s=at, kind="breaker", rack=r, limit_ratio=limit,
                                     duration_s=duration) for r in hit]  # fmt: skip
            elif kind == "slowdown":
                out.append(ControlEvent(at_s=at, kind="slowdown", ratio=draw(rng, spec.ratio),
                                        duration_s=duration))  # fmt: skip
            elif kind == "spike":
                out.append(ControlEvent(at_s=at, kind="spike", factor=draw(rng, spec.factor)))
            else:
                out.append(ControlEvent(at_s=at, kind=kind, duration_s=duration))
    return sorted(out, key=lambda e: e.at_s)


# what the aggregate reports, and whether more is better
FIGURES = {
    "slo_attainment": True,
    "slo_attainment_oracle": True,
    "slo_shortfall_vs_oracle": False,
    "harvest_vs_oracle": True,
    "slo_attainment_oracle_at_mark": True,
    "slo_shortfall_vs_oracle_at_mark": False,
    "harvest_vs_oracle_at_mark": True,
    "breaker_violations": False,
    "held_device_over_slo_ratio": False,
    "actions_per_300s_oscillation": False,
    "reaction_periods_after_step": False,
    "reaction_periods_after_step_down": False,
    "settling_periods_after_step": False,
    "settling_periods_after_step_down": False,
    "slowdown_budget_cut_periods": False,
    "slowdown_batch_cut_periods": False,
    "breach_after_slowdown_periods": False,
    "breach_after_slowdown_periods_oracle": False,
}


def run_family(path: Path, seeds: list[int]) -> dict[str, Any]:
    """Each seed's scenario run through :func:`run_eval_control`; the aggregate over the
    seeds that are not the family's tuning seeds (mean and worst seed)."""
    family = load_control_family(path)
    per_seed: dict[str, dict[str, Any]] = {}
    for seed in seeds:
        result = run_eval_control(draw_control_scenario(family, seed))
        for suffix in ("", "_at_mark"):
            result[f"slo_shortfall_vs_oracle{suffix}"] = round(
                max(0.0, result[f"slo_attainment_oracle{suffix}"] - result["slo_attainment"]), 5
            )
        per_seed[str(seed)] = result
    held_out = [per_seed[str(s)] for s in seeds if s not in family.tune_seeds]
    return {
        "family": family.name, "seeds": seeds, "tune_seeds": family.tune_seeds,
        "per_seed": per_seed, "aggregate_held_out": _aggregate(held_out),
    }  # fmt: skip


def _aggregate(results: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"seeds": len(results)}
    for key, more_is_better in FIGURES.items():
        for suffix in SUFFIXES:
            # a seed without such a step has no figure for it (absent); None is a step the
            # budget never moved after
            values = [r[key + suffix] for r in results if key + suffix in r]
            if not values:
                continue
            # a step never reacted to (None) is worse than any number of periods
            numbers = [math.inf if v is None else float(v) for v in values]
            worst = min(numbers) if more_is_better else max(numbers)
            finite = [v for v in numbers if math.isfinite(v)]
            out[key + suffix] = {
                "mean": round(statistics.fmean(finite), 4) if finite else None,
                "worst": None if not math.isfinite(worst) else round(worst, 4),
                "never": len(numbers) - len(finite),
            }
    # the periods each seed fell short of the oracle by, summed by what put them out
    causes = [r["shortfall_periods_by_cause"] for r in results if "shortfall_periods_by_cause" in r]
    if causes:
        out["shortfall_periods_by_cause"] = {
            k: sum(c.get(k, 0) for c in causes) for k in SHORTFALL_CAUSES
        }
    for suffix in SUFFIXES:
        # the oscillations of every seed as one: actions over all their seconds (the mean of
        # per-seed rates weighs a seed's short window as much as another's long one)
        seconds = sum(r.get(f"oscillation_seconds{suffix}", 0) for r in results)
        if seconds:
            actions = sum(r.get(f"oscillation_actions{suffix}", 0) for r in results)
            out[f"actions_per_300s_oscillation_pooled{suffix}"] = {
                "actions": actions, "seconds": seconds,
                "per_300s": round(actions * 300 / seconds, 4),
            }  # fmt: skip
    return out


def format_family(result: dict[str, Any]) -> str:
    agg = result["aggregate_held_out"]
    lines = [
        f"control family {result['family']}: seeds {len(result['seeds'])}, "
        f"held out {agg['seeds']} (tuned on {result['tune_seeds'] or 'none'})",
        "",
        f"{'seed':<6}{'SLO':>9}{'oracle':>9}{'harvest':>9}{'trips':>7}{'osc/300s':>10}"
        f"{'react up/down':>15}{'settle up/down':>16}",
    ]
    for seed, r in result["per_seed"].items():
        tuned = "*" if int(seed) in result["tune_seeds"] else ""
        lines.append(
            f"{seed + tuned:<6}{r['slo_attainment']:>9.2%}{r['slo_attainment_oracle']:>9.2%}"
            f"{r['harvest_vs_oracle']:>9.1%}{r['breaker_violations']:>7}"
            f"{r.get('actions_per_300s_oscillation', '-'):>10}"
            f"{_pair(r, 'reaction_periods'):>15}{_pair(r, 'settling_periods'):>16}"
        )
    if not agg["seeds"]:
        lines += ["", "held-out seeds: none (every seed drawn is one the family tunes on)"]
        return "\n".join(lines)
    lines += ["", "held-out seeds: mean / worst (ours; static; HPA-style)"]
    for key in FIGURES:
        cells = []
        for suffix in SUFFIXES:
            v = agg.get(key + suffix)
            if v is not None:
                never = f" ({v['never']} never)" if v["never"] else ""
                cells.append(f"{v['mean']} / {v['worst']}{never}")
        if cells:
            lines.append(f"  {key}: " + "; ".join(cells))
    pooled = [
        f"{v['per_300s']} ({v['actions']} in {v['seconds']} s)"
        for suffix in SUFFIXES
        if (v := agg.get(f"actions_per_300s_oscillation_pooled{suffix}")) is not None
    ]
    if pooled:
        lines.append(
            "  actions per 300 s of oscillation, every seed's pooled: " + "; ".join(pooled)
        )
    if causes := agg.get("shortfall_periods_by_cause"):
        lines.append("  periods out of SLO that the oracle kept, by cause: " + causes_line(causes))
    return "\n".join(lines)


def _pair(result: dict[str, Any], key: str) -> str:
    """Up and down: ``-`` where the scenario had no such step, ``never`` where the budget
    never moved after it."""
    cells = []
    for name in (f"{key}_after_step", f"{key}_after_step_down"):
        value = result.get(name, "-")
        cells.append("never" if value is None else value if value == "-" else f"{value:g}")
    return "/".join(cells)
