"""Units as people write them, normalised once to canonical numbers.

- durations ("500us", "10ms", "1s", "0") -> integer microseconds
- rates ("250mbit", "1gbit", "100kbit", "10mbps") -> integer bits per second
- ratios ("1%", "0.5%", "0.01") -> float in [0, 1]

Parsers raise ValueError with a message that says what was expected; callers add
the file/key or flag that the value came from.
"""

from __future__ import annotations

import math
import re

from netbench.errors import shown

_NUMBER = r"(?P<num>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_VALUE_RE = re.compile(r"\s*" + _NUMBER + r"\s*(?P<unit>[A-Za-zµ%]*)\s*")  # fullmatch

# microseconds per unit
_DURATION_UNITS = {
    "us": 1, "usec": 1, "µs": 1,
    "ms": 1_000, "msec": 1_000,
    "s": 1_000_000, "sec": 1_000_000,
}

# bits per second per unit; "bps" suffixes are bytes per second, as in tc(8)
_RATE_UNITS = {
    "bit": 1, "kbit": 1_000, "mbit": 1_000_000, "gbit": 1_000_000_000,
    "bps": 8, "kbps": 8_000, "mbps": 8_000_000, "gbps": 8_000_000_000,
}


def _split(text: str, what: str, example: str) -> tuple[float, str]:
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError(f"expected a {what} such as {example}, got {shown(text)}")
    if isinstance(text, (int, float)):
        # compare ints as ints: float() of a YAML integer of 400 digits raises OverflowError
        usable = abs(text) <= 10**15 if isinstance(text, int) else math.isfinite(text) and abs(text) <= 1e15
        if not usable:
            raise ValueError(f"{shown(text)} is not a usable number")
        return float(text), ""
    if text.strip().startswith("-"):
        raise ValueError(f"{what} must not be negative, got {shown(text)}")
    match = _VALUE_RE.fullmatch(text)
    if not match:
        raise ValueError(f"expected a {what} such as {example}, got {shown(text)}")
    value = float(match.group("num"))
    if not math.isfinite(value) or value > 1e15:
        raise ValueError(f"{shown(text)} is too large")
    return value, match.group("unit").lower().replace("µ", "u")


def parse_duration_us(text: str | int | float) -> int:
    """Parse a duration ("500us", "10ms", "1s") into integer microseconds.

    A bare number is taken as milliseconds only if it is zero; otherwise a unit is required,
    because "10" is ambiguous between tc's microseconds and people's milliseconds.
    """
    value, unit = _split(text, "duration", "500us, 10ms or 1s")
    if value < 0:
        raise ValueError(f"duration must not be negative, got {shown(text)}")
    if unit == "":
        if value == 0:
            return 0
        raise ValueError(f"duration {shown(text)} needs a unit: us, ms or s (for example 10ms)")
    if unit not in _DURATION_UNITS:
        raise ValueError(f"unknown duration unit {shown(unit)} in {shown(text)}; use us, ms or s")
    return round(value * _DURATION_UNITS[unit])


def parse_rate_bps(text: str | int | float) -> int:
    """Parse a rate ("250mbit", "1gbit", "100kbit") into integer bits per second."""
    value, unit = _split(text, "rate", "250mbit or 1gbit")
    if unit == "":
        raise ValueError(f"rate {shown(text)} needs a unit: kbit, mbit or gbit (for example 250mbit)")
    if unit not in _RATE_UNITS:
        raise ValueError(f"unknown rate unit {shown(unit)} in {shown(text)}; use kbit, mbit or gbit")
    return round(value * _RATE_UNITS[unit])


def parse_ratio(text: str | int | float) -> float:
    """Parse a ratio: "1%" -> 0.01; a bare number is a fraction in [0, 1] ("0.01")."""
    value, unit = _split(text, "percentage", "1% or 0.5%")
    if unit == "%":
        ratio = value / 100.0
    elif unit == "":
        ratio = value
        if ratio >= 1:  # "1" could mean 1% or 100%: make people say which
            raise ValueError(f"{shown(text)} is ambiguous: write a percentage such as {value:g}%")
    else:
        raise ValueError(f"unknown unit {shown(unit)} in {shown(text)}; write a percentage such as 1%")
    if ratio > 1:
        raise ValueError(f"{shown(text)} is over 100%")
    return ratio


def _exact(value: int, scale: int) -> str:
    """value/scale written exactly, without trailing zeros: (1234567, 1000) -> "1234.567"."""
    whole, frac = divmod(value, scale)
    if not frac:
        return str(whole)
    digits = len(str(scale)) - 1
    return f"{whole}.{frac:0{digits}d}".rstrip("0")


def format_duration_us(us: int) -> str:
    """Format microseconds exactly, as people write them: 1500 -> "1.5ms", 0 -> "0ms"."""
    if us == 0:
        return "0ms"
    if us % 1_000_000 == 0:
        return f"{us // 1_000_000}s"
    if us >= 1000:
        return f"{_exact(us, 1000)}ms"
    return f"{us}us"


def format_rate_bps(bps: int | None) -> str:
    """Format bits/s exactly: 250_000_000 -> "250mbit"; None -> "unlimited"."""
    if bps is None:
        return "unlimited"
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps >= scale:
            return f"{_exact(bps, scale)}{unit}"
    return f"{bps}bit"


def format_ratio(ratio: float) -> str:
    """Format a ratio as a percentage that parses back to the same float: 0.01 -> "1%"."""
    pct = ratio * 100.0
    text = f"{pct:g}"
    if float(text) / 100.0 != ratio:
        text = repr(pct)
        if float(text) / 100.0 != ratio:
            return repr(ratio)  # a bare fraction below 1 parses back exactly
    return f"{text}%"
