"""Where the simulated fleet's requests come from.

A demand source answers one question: how many requests per second arrive for
``model`` in ``region`` at ``t_s`` seconds after the start of the run, and how
long they are. Three sources:

- :class:`SyntheticDemand`: a diurnal sine per region (regions are out of
  phase) with seeded bursts; mean 1 request/s, so the fleet scales it.
- :class:`RateCsvDemand`: per-model request rates in 10-minute windows, the
  ServeGen aggregate layout (``category,model,window_start_s,total_rate_rps,...``).
- :class:`AzureTraceDemand`: one row per request in the Azure LLM inference
  layout (``TIMESTAMP,ContextTokens,GeneratedTokens``), binned per second.

Trace sources repeat when the run outlasts them. The fleet scales every source
so that its mean rate loads the replicas placed at start to a target
utilisation; only the shape of a trace matters to the simulator.
"""

from __future__ import annotations

import csv
import math
import random
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Offered:
    """Requests offered in one instant: rate and mean lengths (None: the model's own)."""

    rps: float
    prompt_tokens: float | None = None
    generated_tokens: float | None = None


class DemandSource(Protocol):
    def at(self, model: str, region: str, t_s: float) -> Offered: ...

    def mean_rps(self, model: str, region: str) -> float: ...


class DemandFormatError(ValueError):
    """A demand file that does not have the layout it was read as."""


@dataclass(frozen=True, slots=True)
class SyntheticDemand:
    """Diurnal plus bursts: ``1 + amplitude*sin(2*pi*(t/period + phase)) + bursts``.

    Bursts are drawn per (model, region, 10-minute bucket) from a generator
    seeded by those values, so the rate at ``t`` is a pure function of
    ``t`` and the seed: any run, any order of calls, same answer.
    """

    seed: int
    period_s: float = 3600.0
    amplitude: float = 0.35
    burst_probability: float = 0.15  # per bucket
    burst_factor: float = 0.8  # extra load at the burst's peak
    bucket_s: float = 600.0

    def at(self, model: str, region: str, t_s: float) -> Offered:
        phase = (sum(map(ord, region)) % 12) / 12.0  # regions peak at different times
        base = 1.0 + self.amplitude * math.sin(2 * math.pi * (t_s / self.period_s + phase))
        return Offered(max(0.0, base + self._burst(model, region, t_s)))

    def _burst(self, model: str, region: str, t_s: float) -> float:
        bucket = math.floor(t_s / self.bucket_s)
        rng = random.Random(f"{self.seed}:{model}:{region}:{bucket}")
        if rng.random() >= self.burst_probability:
            return 0.0
        start = rng.uniform(0.0, self.bucket_s * 0.7)
        length = rng.uniform(60.0, self.bucket_s * 0.3)
        x = (t_s - bucket * self.bucket_s - start) / length
        return self.burst_factor * math.sin(math.pi * x) if 0.0 <= x <= 1.0 else 0.0

    def mean_rps(self, model: str, region: str) -> float:
        return 1.0


@dataclass(frozen=True, slots=True)
class _Series:
    step_s: float
    rps: Sequence[float]
    prompt: Sequence[float | None]
    generated: Sequence[float | None]

    def at(self, t_s: float) -> Offered:
        i = int(t_s // self.step_s) % len(self.rps)
        return Offered(self.rps[i], self.prompt[i], self.generated[i])

    def mean(self) -> float:
        return sum(self.rps) / len(self.rps)


class _SeriesDemand:
    """A per-model series shared by regions in fixed shares."""

    def __init__(self, series: Mapping[str, _Series], region_shares: Mapping[str, float]) -> None:
        if not series:
            raise DemandFormatError("the demand file holds no rows")
        self.series = dict(series)
        self.region_shares = dict(region_shares)

    def at(self, model: str, region: str, t_s: float) -> Offered:
        s = self.series.get(model)
        if s is None:
            return Offered(0.0)
        o = s.at(t_s)
        return Offered(
            o.rps * self.region_shares.get(region, 0.0), o.prompt_tokens, o.generated_tokens
        )

    def mean_rps(self, model: str, region: str) -> float:
        s = self.series.get(model)
        return 0.0 if s is None else s.mean() * self.region_shares.get(region, 0.0)


def _csv_rows(
    path: Path, need: set[str], what: str, parse: Callable[[dict[str, str]], T]
) -> Iterator[T]:
    """Each row of a CSV with the ``need`` columns, parsed; a value that does not parse is
    a :class:`DemandFormatError` naming the line."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if not need <= set(reader.fieldnames or ()):
            raise DemandFormatError(f"{path}: {what} needs columns {sorted(need)}")
        for n, row in enumerate(reader, start=2):
            try:
                parsed = parse(row)
            except ValueError as exc:
                raise DemandFormatError(f"{path}:{n}: {exc}") from None
            yield parsed


def _assign(
    trace_models: Sequence[str], ours: Sequence[str], given: Mapping[str, str] | None
) -> dict[str, str]:
    if given:
        return dict(given)
    if not ours:  # keep the trace's own names
        return {m: m for m in trace_models}
    return dict(zip(sorted(trace_models), ours, strict=False))


class RateCsvDemand(_SeriesDemand):
    """ServeGen-style rates: one row per (model, 600 s window).

    Trace models map onto ours by ``model_map`` or, by default, in sorted order
    (``m-large``, ``m-mid``, ``m-small`` -> the first three served models).
    """

    def __init__(
        self,
        path: Path,
        *,
        models: Sequence[str],
        region_shares: Mapping[str, float],
        model_map: Mapping[str, str] | None = None,
    ) -> None:
        rows: dict[str, list[tuple[float, float]]] = defaultdict(list)
        need = {"model", "window_start_s", "total_rate_rps"}

        def rate(row: dict[str, str]) -> tuple[str, float, float]:
            return row["model"], float(row["window_start_s"]), float(row["total_rate_rps"])

        for trace_model, start_s, rps_ in _csv_rows(path, need, "a rate CSV", rate):
            rows[trace_model].append((start_s, rps_))
        mapping = _assign(list(rows), models, model_map)
        series = {}
        for trace_model, ours in mapping.items():
            points = sorted(rows.get(trace_model, []))
            if len(points) < 1:
                raise DemandFormatError(f"{path}: no rows for model {trace_model!r}")
            step = points[1][0] - points[0][0] if len(points) > 1 else 600.0
            rps = [max(0.0, r) for _, r in points]
            series[ours] = _Series(step, rps, [None] * len(rps), [None] * len(rps))
        super().__init__(series, region_shares)


class AzureTraceDemand(_SeriesDemand):
    """Azure LLM inference trace: one row per request, binned into ``step_s`` bins.

    The trace has no model column; it drives ``model`` (one trace per model).
    """

    def __init__(
        self,
        path: Path,
        *,
        model: str,
        region_shares: Mapping[str, float],
        step_s: float = 1.0,
    ) -> None:
        counts: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        first: datetime | None = None
        need = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}

        def request(row: dict[str, str]) -> tuple[datetime, int, int]:
            at = datetime.fromisoformat(row["TIMESTAMP"])
            return at, int(row["ContextTokens"]), int(row["GeneratedTokens"])

        for at, prompt, generated in _csv_rows(path, need, "an Azure LLM trace", request):
            first = at if first is None else first
            b = counts[int((at - first).total_seconds() // step_s)]
            b[0] += 1
            b[1] += prompt
            b[2] += generated
        if not counts:
            raise DemandFormatError(f"{path}: the trace holds no requests")
        length = max(counts) + 1
        rps: list[float] = [0.0] * length
        pr: list[float | None] = [None] * length
        gen: list[float | None] = [None] * length
        for i, (c, p, g) in counts.items():
            rps[i] = c / step_s
            pr[i], gen[i] = p / c, g / c
        super().__init__({model: _Series(step_s, rps, pr, gen)}, region_shares)
