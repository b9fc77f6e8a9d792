"""Parsing of human-written sizes (``512GiB``, ``1.5TB``) and durations (``30s``, ``5m``)."""

from __future__ import annotations

import math
import re

from ..text import shown

#: The largest byte count kvagent takes: the kernel's file and device sizes are signed
#: 64-bit (loff_t), so anything larger overflows there (or in nvmet's configfs).
MAX_BYTES = 2**63 - 1
#: The longest duration kvagent takes: the kernel's and nvme-cli's timeouts are C ints of
#: seconds (about 68 years).
MAX_SECONDS = 2**31 - 1

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "p": 1000**5,
    "pb": 1000**5,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "pib": 1024**5,
}
#: Each duration unit as a fraction of seconds (numerator, denominator).
_DURATION_UNITS = {"ms": (1, 1000), "s": (1, 1), "m": (60, 1), "h": (3600, 1), "d": (86400, 1)}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(value: object) -> int:
    """Bytes from an int or a string like ``512GiB``, ``1.5TB``, ``4096``.

    Decimal units (kB, MB, GB, TB) are powers of 1000; binary ones (KiB, MiB,
    GiB, TiB) powers of 1024. A fraction must come out as a whole number of bytes.
    """
    if isinstance(value, bool):
        raise ValueError("must be a size such as 512GiB or 1.5TB, not a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return _at_most_max_bytes(value, value)
    if not isinstance(value, str):
        raise ValueError(f"must be a size such as 512GiB or 1.5TB, got {type(value).__name__}")
    m = _NUMBER_UNIT.match(value)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(
            f"{shown(value)} is not a size; use a number with a unit: "
            "B, kB, MB, GB, TB, KiB, MiB, GiB, TiB"
        )
    numerator, denominator = _exact(m.group(1))
    total, part = divmod(numerator * _SIZE_UNITS[m.group(2).lower()], denominator)
    if part:
        raise ValueError(f"{shown(value)} is not a whole number of bytes")
    return _at_most_max_bytes(total, value)


def _exact(number: str) -> tuple[int, int]:
    """A decimal numeral (``1.5``) as an exact fraction: (15, 10)."""
    whole, _, fraction = number.partition(".")
    return int(whole + fraction), 10 ** len(fraction)


def _at_most_max_bytes(n: int, written: object) -> int:
    if n > MAX_BYTES:
        raise ValueError(f"{shown(written)} is more than the kernel's largest size (8 EiB)")
    return n


def parse_duration(value: object) -> float:
    """Seconds from a number or a string like ``30s``, ``5m``, ``1.5h``, ``250ms``."""
    if isinstance(value, bool):
        raise ValueError("must be a duration such as 30s or 5m, not a boolean")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(
                f"{shown(value)} is not a duration; use a number with ms, s, m, h or d")
        if value < 0:
            raise ValueError("must not be negative")
        return _at_most_max_seconds(float(value), value)
    if not isinstance(value, str):
        raise ValueError(f"must be a duration such as 30s or 5m, got {type(value).__name__}")
    m = _NUMBER_UNIT.match(value)
    unit = m.group(2).lower() if m else ""
    if not m or (unit and unit not in _DURATION_UNITS):
        raise ValueError(f"{shown(value)} is not a duration; use a number with ms, s, m, h or d")
    numerator, denominator = _exact(m.group(1))
    times, per = _DURATION_UNITS[unit] if unit else (1, 1)
    # int / int is the correctly rounded float of the exact quotient
    return _at_most_max_seconds(numerator * times / (denominator * per), value)


def _at_most_max_seconds(seconds: float, written: object) -> float:
    if seconds > MAX_SECONDS:
        raise ValueError(f"{shown(written)} is longer than the longest timeout kvagent can pass "
                         f"on ({MAX_SECONDS} s, about 68 years)")
    return seconds


def format_size(n: int) -> str:
    """A short binary-unit rendering of a byte count, for humans (``1.5 GiB``)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    """``30s``, ``5m``, ``1.5h``: the shortest unit that keeps the value readable."""
    if seconds >= 3600 and seconds % 360 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 6 == 0:
        return f"{seconds / 60:g}m"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"
