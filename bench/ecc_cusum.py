"""The correctable-ECC rise test (:mod:`models.counts`) on its two failure modes.

With the detector's own settings (:class:`models.health_state.HealthConfig`):

- **false alarms**: healthy devices counting errors at the simulator's quiet
  rate, and at ten and a hundred times it (a device that always logged more),
  each watched for a day from its prior alone, ``--device-days`` in all. Each
  alarm counts once, then the statistic starts again. Printed per 1,000
  device-days.
- **storms caught**: ``--storms`` storms drawn from a scenario family's
  ``ecc_storm`` rows (rate ``base * exp(growth * t)`` until the double-bit fault
  at ``lead_s``), read once a second as the agents report; the share flagged
  before the double-bit fault and how long it took.

    python -m bench.ecc_cusum --family fleet-mix --device-days 20000 --storms 2000
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

from agents.sim.family import draw, load_family
from agents.sim.fleet import BASE_SBE_PER_S, poisson
from agents.sim.scenario import DEFAULT_PARAMS, FaultKind
from models.counts import RateRise, RiseState
from models.health_state import HealthConfig

FAMILIES = Path(__file__).resolve().parent.parent / "scenarios" / "families"


def false_alarms(rise: RateRise, rate_per_s: float, days: float, rng: random.Random) -> int:
    """Alarms of devices counting at ``rate_per_s``, ``days`` of them in all, each watched
    for a day from nothing (the prior only: the hardest case for a device that always
    logged more), event by event. The statistic drains linearly and floors at zero, so
    per-event steps equal per-sample ones."""
    alarms = 0
    for _ in range(math.ceil(days)):
        state, t = RiseState(), 0.0
        while (t := t + (gap := rng.expovariate(rate_per_s))) < 86400.0:
            state = rise.update(state, 1, gap)
            if state.statistic >= rise.threshold:
                alarms += 1
                state = RiseState(0.0, state.quiet_events, state.quiet_s)
    return alarms


def storm_flagged_s(
    rise: RateRise, base: float, growth: float, lead_s: float, rng: random.Random
) -> float | None:
    """Seconds from a storm's start to the flag, read once a second; None if the
    double-bit fault came first. The device has an hour of quiet history behind it."""
    state = rise.update(RiseState(), poisson(rng, BASE_SBE_PER_S * 3600.0), 3600.0)
    for second in range(int(lead_s)):
        rate = base * math.exp(min(60.0, growth * second))
        state = rise.update(state, poisson(rng, rate), 1.0)
        if state.statistic >= rise.threshold:
            return float(second + 1)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", default="fleet-mix")
    parser.add_argument("--device-days", type=float, default=20000.0)
    parser.add_argument("--storms", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rise = HealthConfig().ecc_rise()
    print(f"rise test: ratio {rise.ratio}, threshold {rise.threshold}")
    for times in (1.0, 10.0, 100.0):
        rate = BASE_SBE_PER_S * times
        alarms = false_alarms(rise, rate, args.device_days, rng)
        per_1k = 1000.0 * alarms / args.device_days
        print(
            f"healthy at {times:g}x the quiet rate ({rate * 3600:.2f}/h): {alarms} alarms in "
            f"{args.device_days:g} device-days = {per_1k:.3f} per 1,000 device-days"
        )
    family = load_family(FAMILIES / f"{args.family}.yaml")
    rows = [f for f in family.faults if f.kind is FaultKind.ECC_STORM]
    if not rows:
        raise SystemExit(f"{args.family}: no ecc_storm rows")
    defaults = DEFAULT_PARAMS[FaultKind.ECC_STORM]
    caught: list[float] = []
    for _ in range(args.storms):
        row = rng.choice(rows)
        params = {name: draw(rng, span) for name, span in row.params.items()}
        length = draw(rng, row.duration_s or (300.0, 900.0))
        lead = min(params.get("lead_s", defaults["lead_s"]), 0.8 * length)
        growth = params.get("growth_per_s", defaults["growth_per_s"])
        base = params.get("base_sbe_per_s", defaults["base_sbe_per_s"])
        taken = storm_flagged_s(rise, base, growth, lead, rng)
        if taken is not None:
            caught.append(taken)
    caught.sort()
    share = len(caught) / args.storms
    p50 = caught[len(caught) // 2] if caught else math.nan
    print(
        f"storms ({args.family}): {len(caught)} of {args.storms} flagged before the "
        f"double-bit fault ({share:.1%}); time to flag p50 {p50:.0f} s"
    )


if __name__ == "__main__":
    main()
