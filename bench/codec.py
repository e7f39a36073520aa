"""Codec: decode + validate per sample, pydantic against msgspec, on the same envelopes.

The simulated fleet's accelerator samples are packed into node-tick envelopes
(:mod:`agents.envelopes`) and each codec decodes and validates every one of
them; ``orjson.loads`` and ``json.loads`` (parse only, no validation) are the
floors. pydantic runs an envelope model built from the v1 contract's fields,
so both enforce the same bounds. Prints microseconds per sample and the ratios.

    python -m bench.codec --nodes 100
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec
import orjson
from pydantic import create_model

from agents.envelopes import pack
from agents.simulated import SimulatedFleetAgent
from schemas.base import Contract
from schemas.codec import decode, decode_tick, encode
from schemas.envelopes import AcceleratorTick, accelerator_samples
from schemas.events import AcceleratorTelemetry
from schemas.topics import ACCELERATOR, ACCELERATOR_TICKS

HEAD = ("event_id", "observed_at", "node_id", "region", "pod_id", "rack_id", "pdu_id")


def _pydantic_envelope() -> type[Contract]:
    """The same envelope as a pydantic model, every field and bound taken from v1."""
    fields = AcceleratorTelemetry.model_fields
    sample = create_model(  # type: ignore[call-overload]
        "PydanticDeviceSample",
        __base__=Contract,
        **{n: (f.annotation, f) for n, f in fields.items() if n not in (*HEAD, "schema_version")},
    )
    return create_model(  # type: ignore[call-overload, no-any-return]
        "PydanticAcceleratorTick",
        __base__=Contract,
        **{n: (fields[n].annotation, fields[n]) for n in HEAD},
        samples=(tuple[sample, ...], ...),
        schema_version=(Literal[2], 2),
    )


def _rate(label: str, fn: Callable[[bytes], Any], raws: list[bytes], samples: int) -> float:
    fn(raws[0])  # warm
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for raw in raws:
            fn(raw)
        best = min(best, time.perf_counter() - started)
    per_sample_us = best / samples * 1e6
    print(f"{label:58}: {per_sample_us:6.2f} us/sample  {samples / best:12,.0f} samples/s")
    return per_sample_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--ticks", type=int, default=10)
    args = parser.parse_args()
    agent = SimulatedFleetAgent(
        nodes=args.nodes, devices_per_node=8, seed=7, start=datetime.now(UTC)
    )
    events = [r for n in range(args.ticks) for r in agent.tick(n)]
    ticks = [encode(v) for s, v in pack(events) if s is ACCELERATOR_TICKS]
    singles = [encode(v) for s, v in events if s is ACCELERATOR]
    samples = len(singles)
    print(
        f"{len(ticks)} envelopes of {samples} samples, {sum(map(len, ticks)) // samples} B/sample"
    )
    envelope = _pydantic_envelope()
    msgspec_us = _rate(
        "msgspec envelope: decode + validate",
        msgspec.json.Decoder(AcceleratorTick).decode,
        ticks,
        samples,
    )
    _rate(
        "msgspec envelope: decode_tick (the pipeline's call)",
        lambda r: decode_tick(r, AcceleratorTick),
        ticks,
        samples,
    )
    _rate(
        "msgspec envelope: decode_tick + flat views (the detectors')",
        lambda r: accelerator_samples(decode_tick(r, AcceleratorTick).tick),  # type: ignore[arg-type]
        ticks,
        samples,
    )
    pydantic_us = _rate(
        "pydantic envelope: decode + validate", envelope.model_validate_json, ticks, samples
    )
    v1_us = _rate(
        "pydantic v1: one message per sample (before)",
        lambda r: decode(r, AcceleratorTelemetry),
        singles,
        samples,
    )
    orjson_us = _rate(
        "orjson.loads envelope (parse only, no validation)", orjson.loads, ticks, samples
    )
    _rate("json.loads envelope (parse only, no validation)", json.loads, ticks, samples)
    print(f"ratio pydantic envelope / msgspec envelope: {pydantic_us / msgspec_us:.2f}")
    print(f"ratio pydantic v1 per sample / msgspec envelope: {v1_us / msgspec_us:.2f}")
    print(f"ratio orjson.loads / msgspec envelope: {orjson_us / msgspec_us:.2f}")


if __name__ == "__main__":
    main()
