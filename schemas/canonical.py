"""JSON Canonicalization Scheme (RFC 8785): the bytes a command's signature covers.

Any language reproduces them from the JSON it received, without our models:
object members sorted by the UTF-16 code units of their names, no whitespace,
strings as ECMAScript's ``JSON.stringify`` writes them (only ``"``, ``\\`` and
control characters escaped; everything else as UTF-8), numbers as ECMAScript
writes them (``350``, not ``350.0``; ``0.00001``, not ``1e-05``; ``1e+21``).
In JavaScript that is ``JSON.stringify`` with the keys sorted at every level.

Example::

    canonical({"b": 1.0, "a": [1e-05, "é"]})  # b'{"a":[0.00001,"\xc3\xa9"],"b":1}'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n",
                  "\r": "\\r", "\t": "\\t"}  # fmt: skip
MAX_SAFE_INTEGER = 2**53 - 1


def canonical(value: Any) -> bytes:
    """``value`` (what ``json.loads`` returns) as RFC 8785 bytes."""
    return _write(value).encode("utf-8", "surrogatepass")


def _write(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise ValueError(f"{value} is not exact as a double: send it as a string")
        return str(value)
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, Mapping):
        names = sorted(value, key=lambda name: name.encode("utf-16-be", "surrogatepass"))
        return "{" + ",".join(f"{_string(n)}:{_write(value[n])}" for n in names) + "}"
    if isinstance(value, Sequence):
        return "[" + ",".join(_write(v) for v in value) + "]"
    raise TypeError(f"{type(value).__name__} is not JSON")


def _string(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif ch < " " or "\ud800" <= ch <= "\udfff":  # controls, and lone surrogates
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _number(value: float) -> str:
    """ECMAScript's Number::toString for a finite double: the shortest digits that read
    back as ``value`` (Python's ``repr`` finds the same), laid out ECMAScript's way."""
    if not math.isfinite(value):
        raise ValueError("NaN and infinities are not JSON")
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    digits_tuple, exponent = Decimal(repr(abs(value))).normalize().as_tuple()[1:]
    digits = "".join(map(str, digits_tuple))
    assert isinstance(exponent, int)
    k, n = len(digits), exponent + len(digits)  # value = 0.digits x 10^n
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * -n + digits
    else:
        e = n - 1
        mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
        text = f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"
    return sign + text
