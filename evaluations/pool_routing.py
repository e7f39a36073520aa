"""Power-aware routing across pools, judged on variants of ``scenarios/pool-capped.yaml``.

Rack 0 holds a region's whole pool of one accelerator type, rack 1 another pool of
another type serving the same models; rack 0 loses part of its feed for five minutes,
and the caps that keep it from tripping hold every replica of its pool down. Each
variant runs twice on the simulated fleet, in-process, with the control role as a
worker runs it (:class:`~planning.pools.RegionalControl` built from the worker's
settings by its own wiring, every signed command applied by the simulator's executors):
with routing across pools off, then on (``--control.power-routing.across-pools``).
Per run, over the requests the fleet served (second by second, by device): the share
served over the TPOT SLO, the mean TTFT, the requests refused, breaker trips, and the
commands the executors refused as expired.

The grid: four pairings of pool types (A100/H100, H100/B200, MI300X/H100, B200/A100),
loads 0.5/0.6/0.7, the feed cut to 35% or 50%, a TPOT SLO of 50 or 80 ms; each
variant its own fleet seed. The routing was built on ``pool-capped`` itself (A100/H100,
load 0.6, 35%, 50 ms, seed 7, at a 2-s control period); the other 47 variants, and the
worker's own 10-s period, are what it was not fitted to.

``python -m evaluations.pool_routing [--json] [--seconds 480] [--only A100/H100]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry

from agents.sim.control import SimControl
from agents.sim.scenario import DemandSpec, FaultKind, FaultSpec, FleetSpec, Scenario, TargetSpec
from agents.sim.simulation import Simulation
from fleetloop.settings import WorkerSettings
from fleetloop.sim import build_dispatcher
from fleetloop.wiring import control_wiring
from planning.pools import RegionalControl
from schemas.base import AcceleratorType

EVAL_KEY = "eval=eval-pool-routing-key-0123"
START = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
PAIRS = (("A100", "H100"), ("H100", "B200"), ("MI300X", "H100"), ("B200", "A100"))
LOADS = (0.5, 0.6, 0.7)
FEEDS = (0.35, 0.5)  # the breaker limit left on rack 0, as a share of its nominal
SLOS_S = (0.05, 0.08)
FAULT_START_S, FAULT_S = 120.0, 300.0


@dataclass(frozen=True, slots=True)
class Variant:
    capped: str  # the pool type on rack 0 (nodes 0-3), whose feed is cut
    other: str  # the pool type on rack 1 (nodes 4-7)
    load: float
    feed: float
    slo_s: float
    seed: int

    @property
    def name(self) -> str:
        pair, slo_ms = f"{self.capped}/{self.other}", self.slo_s * 1e3
        return f"{pair} load {self.load:g} feed {self.feed:g} SLO {slo_ms:.0f} ms"

    def scenario(self) -> Scenario:
        mix = tuple(AcceleratorType(t) for t in (self.capped,) * 4 + (self.other,) * 4)
        return Scenario(
            name="pool-capped-variant",
            duration_s=FAULT_START_S + FAULT_S + 600.0,
            fleet=FleetSpec(nodes=8, seed=self.seed, type_mix=mix),
            demand=DemandSpec(kind="synthetic", load_ratio=self.load),
            faults=(
                FaultSpec(
                    kind=FaultKind.PDU_OVERLOAD, target=TargetSpec(rack=0),
                    start_s=FAULT_START_S, duration_s=FAULT_S,
                    params={"breaker_limit_ratio": self.feed, "trip_after_s": 10},
                ),
            ),
        )  # fmt: skip


BUILT_ON = ("A100", "H100", 0.6, 0.35, 0.05)  # pool-capped itself, seed 7


def variants() -> list[Variant]:
    """The grid, each variant its own fleet seed: 7 for ``pool-capped`` itself, the one
    the routing was built on, and 101 onwards for the others."""
    grid = itertools.product(PAIRS, LOADS, FEEDS, SLOS_S)
    return [
        Variant(capped, other, load, feed, slo,
                seed=7 if (capped, other, load, feed, slo) == BUILT_ON else 101 + i)
        for i, ((capped, other), load, feed, slo) in enumerate(grid)
    ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Run:
    over_slo_ratio: float  # of the requests served, the share served over the TPOT SLO
    mean_ttft_s: float
    refused: float  # requests refused (a queue past its limit)
    trips: int
    expired_commands: int  # commands the executors refused as already expired
    pool_moves: int  # pool weights moved across pools (decisions)
    admission_cuts: int = 0  # a pool's admission cut: the last lever on a rack over its breaker
    admitted_at_end: float = 1.0  # the least share of its requests a pool admits at the end


def run(variant: Variant, *, across_pools: bool, seconds: float = 480.0) -> Run:
    """One variant, in-process, the control role as a worker runs it."""
    sim = Simulation(variant.scenario(), start=START)
    settings = WorkerSettings(
        command_keys=EVAL_KEY,
        control={"tpot_slo_s": variant.slo_s, "power_routing": {"across_pools": across_pools}},
    )
    planner = RegionalControl(control_wiring(settings))
    dispatcher = build_dispatcher(
        SimControl(sim.fleet), settings.verification_keys(), CollectorRegistry()
    )
    served = over = ttft = refused = 0.0
    statuses: Counter[str] = Counter()
    moves = cuts = 0
    for n in range(int(seconds / sim.interval_s)):
        for _, event in sim.tick(n):
            for out in planner.feed(event):
                moves += out.decision.reason == "pool_capped"
                cuts += out.decision.reason == "admission_shed"
                if out.command is not None:
                    result = dispatcher.handle(out.command, now=sim.now, received_at=sim.now)
                    statuses[result.status.value if result is not None else "none"] += 1
        for d in sim.fleet.devices.values():
            if d.model and d.tpot_s > 0:
                served += d.served_rps
                over += d.served_rps * (d.tpot_s > variant.slo_s)
                ttft += d.served_rps * d.ttft_s
                refused += d.rejected
    trips = sum(1 for c in sim.faults.consequences if c["what"] == "breaker_trip")
    return Run(
        over_slo_ratio=over / served if served else 0.0,
        mean_ttft_s=ttft / served if served else 0.0,
        refused=refused, trips=trips, expired_commands=statuses["expired"], pool_moves=moves,
        admission_cuts=cuts,
        admitted_at_end=min(sim.fleet.router.admission_ratio.values(), default=1.0),
    )  # fmt: skip


def _ratio(after: float, before: float, floor: float) -> float:
    return (after + floor) / (before + floor)


def summary(results: list[tuple[Variant, Run, Run]]) -> dict[str, Any]:
    """Over the variants where a pool weight moved: the totals off and on, and per variant
    the geometric mean and worst of on over off (a floor keeps a zero from dividing)."""
    moved = [(v, off, on) for v, off, on in results if on.pool_moves]
    out: dict[str, Any] = {"variants": len(results), "moved": len(moved)}
    for key, floor in (("over_slo_ratio", 1e-5), ("mean_ttft_s", 1e-3), ("refused", 1.0)):
        before = sum(getattr(off, key) for _, off, _ in moved)
        after = sum(getattr(on, key) for _, _, on in moved)
        ratios = [_ratio(getattr(on, key), getattr(off, key), floor) for _, off, on in moved]
        out[key] = {
            "off_total": before, "on_total": after,
            "ratio_geomean": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
            "ratio_worst": max(ratios, default=None),
            "worse": sum(1 for r in ratios if r > 1.05),
            "better": sum(1 for r in ratios if r < 1 / 1.05),
        }  # fmt: skip
    out["trips"] = {"off": sum(off.trips for _, off, _ in results),
                    "on": sum(on.trips for _, _, on in results)}  # fmt: skip
    return out


def _line(variant: Variant, off: Run, on: Run) -> str:
    return (f"{variant.name:44s} over SLO {off.over_slo_ratio:7.3%} -> {on.over_slo_ratio:7.3%}  "
            f"TTFT {off.mean_ttft_s * 1e3:7.0f} -> {on.mean_ttft_s * 1e3:7.0f} ms  "
            f"refused {off.refused:8.0f} -> {on.refused:8.0f}  trips {off.trips}/{on.trips}"
            f"  moves {on.pool_moves}")  # fmt: skip


def run_grid(
    only: str | None = None,
    *,
    seconds: float = 480.0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The grid (or one pairing of it, ``only`` as CAPPED/OTHER), each variant off then on:
    ``{"summary": ..., "per_variant": [...]}``. ``progress`` gets a line per variant."""
    logging.getLogger("agents.executors").setLevel(logging.WARNING)  # a line per command
    chosen = [v for v in variants() if not only or f"{v.capped}/{v.other}" == only]
    if not chosen:
        raise ValueError(f"{only}: the pairings are {[f'{a}/{b}' for a, b in PAIRS]}")
    results = []
    for v in chosen:
        off = run(v, across_pools=False, seconds=seconds)
        on = run(v, across_pools=True, seconds=seconds)
        results.append((v, off, on))
        if progress is not None:
            progress(_line(v, off, on))
    per = [{"variant": asdict(v), "name": v.name, "off": asdict(off), "on": asdict(on)}
           for v, off, on in results]  # fmt: skip
    return {"summary": summary(results), "per_variant": per}


def format_grid(result: dict[str, Any]) -> str:
    """The grid's summary as an operator reads it (the lines per variant come as it runs)."""
    s = result["summary"]
    lines = [f"{s['variants']} variants; a pool's share moved across pools in {s['moved']}",
             f"breaker trips, all variants: off {s['trips']['off']}, on {s['trips']['on']}",
             "over the variants where it moved, off -> on:"]  # fmt: skip
    labels = {
        "over_slo_ratio": ("share served over the SLO", "{:.1%}"),
        "mean_ttft_s": ("mean TTFT", "{:.1f} s"),
        "refused": ("requests refused", "{:,.0f}"),
    }
    for key, (label, form) in labels.items():
        k = s[key]
        geo, worst = k["ratio_geomean"], k["ratio_worst"]
        ratios = "" if geo is None else f"; on/off geomean {geo:.2f}, worst {worst:.2f}"
        off, on = form.format(k["off_total"]), form.format(k["on_total"])
        lines.append(f"  {label:26s} summed {off} -> {on}{ratios}; "
                     f"worse/better by 5%: {k['worse']}/{k['better']}")  # fmt: skip
    return "\n".join(lines)


def report(only: str | None, *, seconds: float, as_json: bool) -> str:
    """:func:`run_grid` as a command reports it: a line per variant printed as it runs
    (text only), then the JSON or the summary. A pairing not in the grid: ValueError."""
    progress = None if as_json else (lambda line: print(line, flush=True))
    result = run_grid(only, seconds=seconds, progress=progress)
    return json.dumps(result, sort_keys=True) if as_json else format_grid(result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evaluations.pool_routing")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--seconds", type=float, default=480.0)
    parser.add_argument("--only", help="one pairing, as CAPPED/OTHER (A100/H100, ...)")
    args = parser.parse_args(argv)
    try:
        print(report(args.only, seconds=args.seconds, as_json=args.json))
    except ValueError as exc:
        parser.error(f"--only {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
