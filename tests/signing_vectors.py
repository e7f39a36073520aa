"""Writes ``schemas/signing_vectors.json``, the published test vectors of the signing
rule (``python -m tests.signing_vectors``); ``tests/unit/test_signing_any_language.py``
checks the committed file against the code, so the two never drift apart."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from schemas.codec import encode
from schemas.commands import (
    ClockMode,
    Command,
    RouteAction,
    RouteCommand,
    Target,
    ThrottleAction,
    ThrottleCommand,
    WarmAction,
    WarmCommand,
)
from schemas.signing import canonical_bytes, sign

PATH = Path(__file__).resolve().parents[1] / "schemas" / "signing_vectors.json"
KEY_ID, KEY = "vector-k1", "a vector key, 32 bytes or more ..."
AT = datetime(2026, 3, 1, 12, 0, 0, 250_000, tzinfo=UTC)
RULE = (
    "signature = lowercase hex HMAC-SHA256(key named by key_id, RFC 8785 canonical JSON of "
    "the command object as received, without its 'signature' member)"
)


def _commands() -> list[tuple[str, Command]]:
    def head(number: int) -> dict[str, object]:
        return {
            "command_id": uuid.UUID(int=number),
            "issued_at": AT,
            "expires_at": AT + timedelta(seconds=60),
            "issuer": "vectors",
        }

    return [
        (
            "route: non-ASCII text, a device target",
            RouteCommand(
                **head(1),
                target=Target(node_id="node-7", device_uuid="GPU-1a2b"),
                reason="ecc_storm",
                message="drain: ECC storm \u2014 \u00e9 \U0001f525",
                action=RouteAction.DRAIN,
            ),
        ),
        (
            "throttle: a whole-number float (350.0 is written 350)",
            ThrottleCommand(
                **head(2),
                target=Target(node_id="node-7", device_uuid="GPU-1a2b"),
                reason="rack_over_target",
                action=ThrottleAction.POWER_CAP,
                power_limit_watts=350.0,
                cause_observed_at=AT - timedelta(microseconds=1),
            ),
        ),
        (
            "throttle: small and fractional floats (1e-05 is written 0.00001)",
            ThrottleCommand(
                **head(3),
                target=Target(pool="us-east-h100"),
                reason="tracking",
                action=ThrottleAction.OPTIONAL_BUDGET,
                optional_budget_ratio=1e-05,
                funnel_extra_candidates=2.5,
                upgrade_ratio=0.1,
            ),
        ),
        (
            "throttle: an enum parameter",
            ThrottleCommand(
                **head(4),
                target=Target(node_id="node-7"),
                reason="hold",
                action=ThrottleAction.CLOCK_MODE,
                clock_mode=ClockMode.LOW,
            ),
        ),
        (
            "warm: quotes, a backslash and a newline in the message",
            WarmCommand(
                **head(5),
                target=Target(pool="us-east-h100"),
                reason="forecast_rise",
                message='say "warm"\\now\nplease',
                action=WarmAction.WARM,
                model="gemma-27b",
                replicas=3,
            ),
        ),
    ]


def vectors() -> dict[str, object]:
    out = []
    for name, command in _commands():
        signed = sign(command, key_id=KEY_ID, key=KEY.encode())
        out.append(
            {
                "name": name,
                "key_id": KEY_ID,
                "key": KEY,
                "wire": encode(signed).decode(),
                "canonical": canonical_bytes(signed).decode(),
                "signature": signed.signature,
            }
        )
    return {"rule": RULE, "vectors": out}


if __name__ == "__main__":
    PATH.write_text(json.dumps(vectors(), indent=2, ensure_ascii=False) + "\n")
    print(PATH)
