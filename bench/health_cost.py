"""What the health detector costs per sample, against decoding the same samples.

A simulated fleet's telemetry (the three families the detector reads:
accelerator and serving node-tick envelopes, node health) is encoded as agents
send it, then, in one process and one run:

- the baseline decodes and validates every message (:func:`schemas.codec.decode_samples`);
- the detector's path decodes the same messages and feeds every sample to
  :class:`models.health.HealthDetector` as ``health.detect`` does, with its
  heartbeat tick once per simulated second, common-mode attribution on and off;
- the stream scorer (:mod:`models.univariate`, what ``eval nab`` runs) scores
  and learns one value per accelerator sample (its temperature), for scale.

Prints microseconds per sample for each, the detector's own share (its path less
decoding) and the pickled size of a device's record (the goal: at most 2 KiB).

    python -m bench.health_cost --nodes 60 --seconds 300
"""

from __future__ import annotations

import argparse
import pickle
import time
from datetime import UTC, datetime
from typing import Any

from agents.envelopes import pack
from agents.sim.scenario import FaultKind, FaultSpec, FleetSpec, Scenario, TargetSpec
from agents.sim.simulation import Simulation
from fleetloop.worker import tune_gc
from models.health import HealthConfig, HealthDetector
from models.univariate import StreamScorer
from schemas.codec import decode_samples, encode
from schemas.envelopes import AcceleratorSample
from schemas.topics import ACCELERATOR_TICKS, NODE_HEALTH, SERVING_TICKS


def _messages(nodes: int, seconds: int) -> list[tuple[int, Any, bytes]]:
    """Every message of the run as (second, value type, bytes), with a few faults and a
    hot rack so the detector's slow paths run too."""
    faults = (
        FaultSpec(kind=FaultKind.GREY_SLOWDOWN, target=TargetSpec(node=1, device=2),
                  start_s=seconds / 2, duration_s=seconds / 2),
        FaultSpec(kind=FaultKind.INLET_HEAT, target=TargetSpec(rack=0),
                  start_s=seconds / 3, duration_s=seconds / 3),
    )  # fmt: skip
    scenario = Scenario(duration_s=seconds, fleet=FleetSpec(nodes=nodes, seed=3), faults=faults)
    sim = Simulation(scenario, start=datetime(2026, 1, 1, tzinfo=UTC))
    judged = {ACCELERATOR_TICKS.name, SERVING_TICKS.name, NODE_HEALTH.name}
    out = []
    for n in range(seconds):
        for spec, value in pack(sim.tick(n)):
            if spec.name in judged:
                out.append((n, spec.value_type, encode(value)))
    return out


def _decode(messages: list[tuple[int, Any, bytes]]) -> tuple[float, int]:
    started = time.perf_counter()
    samples = 0
    for _, value_type, raw in messages:
        samples += len(decode_samples(raw, value_type))
    return time.perf_counter() - started, samples


def _detect(messages: list[tuple[int, Any, bytes]], config: HealthConfig) -> HealthDetector:
    detector = HealthDetector(config)
    second = 0
    newest: datetime | None = None
    for n, value_type, raw in messages:
        if n != second and newest is not None:
            detector.tick(newest)
            second = n
        for value in decode_samples(raw, value_type):
            detector.observe(value)
            newest = value.observed_at
    return detector


def _score(messages: list[tuple[int, Any, bytes]]) -> float:
    """The stream scorer on each accelerator sample's temperature, one series per device."""
    scorers: dict[str, StreamScorer] = {}
    started = time.perf_counter()
    for _, value_type, raw in messages:
        for value in decode_samples(raw, value_type):
            if isinstance(value, AcceleratorSample) and value.gpu_temp_celsius is not None:
                scorer = scorers.setdefault(value.device_uuid, StreamScorer())
                scorer.score_one(value.gpu_temp_celsius)
                scorer.learn_one(value.gpu_temp_celsius)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=60)
    parser.add_argument("--seconds", type=int, default=300)
    args = parser.parse_args()
    messages = _messages(args.nodes, args.seconds)
    tune_gc()
    decode_s, samples = min((_decode(messages) for _ in range(3)), key=lambda r: r[0])
    per = 1e6 / samples
    print(f"{len(messages)} messages, {samples} samples ({args.nodes} nodes, {args.seconds} s)")
    print(f"{'decode + validate (baseline)':40}{decode_s * per:8.2f} us/sample")
    for label, config in (
        ("decode + detector, attribution on", HealthConfig()),
        ("decode + detector, attribution off", HealthConfig(common_mode=False)),
    ):
        spent = float("inf")
        for _ in range(2):  # the better of two: the first pays for warming up
            started = time.perf_counter()
            detector = _detect(messages, config)
            spent = min(spent, time.perf_counter() - started)
        print(
            f"{label:40}{spent * per:8.2f} us/sample  (detector alone "
            f"{(spent - decode_s) * per:.2f} us, {spent / decode_s:.2f}x decoding)"
        )
    scored = _score(messages)
    print(f"{'decode + stream scorer (temperature)':40}{scored * per:8.2f} us/sample")
    sizes = [len(pickle.dumps(d)) for d in detector.devices.values()]
    print(f"device record pickled: max {max(sizes)} B, mean {sum(sizes) / len(sizes):.0f} B "
          f"(goal <= 2048)")  # fmt: skip


if __name__ == "__main__":
    main()
