"""Units as people write them, normalised once to canonical numbers.

- durations ("500us", "10ms", "1s", "0") -> integer microseconds; seconds for the flags that
  take bare seconds ("90", "1.5s", "500ms") -> float seconds
- rates ("250mbit", "1gbit", "100kbit", "100Mbit/s") -> integer bits per second
- ratios ("1%", "0.5%", "0") -> float in [0, 1]
- sizes ("8", "8B", "64KiB", "1MiB") -> integer bytes

A spelling that two conventions read differently is refused, naming both readings, never
guessed: a bare loss "0.5" (tc: 0.5 %; a fraction: 50 %), a rate "100mbps" (tc: megabytes per
second, 800mbit; most people: megabits, 100mbit), a bare delay "10" (tc: 10us; most people:
10ms), a size "1MB" (1MiB or 1000000 bytes). docs/reference/units.md lists every unit.

Parsers raise ValueError with a message that says what was expected; callers add
the file/key or flag that the value came from.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

from netbench.errors import shown

_NUMBER = r"(?P<num>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_VALUE_RE = re.compile(r"\s*" + _NUMBER + r"\s*(?P<unit>[A-Za-zµ%]*(?:/s)?)\s*")  # fullmatch

# microseconds per unit
_DURATION_UNITS = {
    "us": 1, "usec": 1, "µs": 1,
    "ms": 1_000, "msec": 1_000,
    "s": 1_000_000, "sec": 1_000_000,
    "min": 60_000_000, "h": 3_600_000_000,
}

# bits per second per unit ("100Mbit/s" too)
_RATE_UNITS = {"bit": 1, "kbit": 1_000, "mbit": 1_000_000, "gbit": 1_000_000_000}
_RATE_PREFIX = {"": 1, "k": 1_000, "m": 1_000_000, "g": 1_000_000_000}
# spellings read as bytes/s by tc(8) and as bits/s by most people ("Mbps"), or as either
# (lowercase "mb/s"): refused, with both readings
_AMBIGUOUS_RATE = re.compile(r"(?P<prefix>[kmg]?)(?:bps|b/s|b)")

# bytes per size unit: binary multiples only, written as such
_SIZE_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30}
# "1MB": 1 MiB as memory and nccl-tests read it, 1000000 bytes as SI does
_AMBIGUOUS_SIZE = {"k": 2**10, "kb": 2**10, "m": 2**20, "mb": 2**20, "g": 2**30, "gb": 2**30}
MAX_SIZE_BYTES = 2**30  # a message per worker; every rank holds a few of them


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
        raise ValueError(f"duration {shown(text)} needs a unit (tc reads {value:g}us, people mostly mean "
                         f"{value:g}ms): write {value:g}us, {value:g}ms or {value:g}s")
    if unit not in _DURATION_UNITS:
        raise ValueError(f"unknown duration unit {shown(unit)} in {shown(text)}; use us, ms or s")
    # exactly, in decimal: a part of a microsecond is refused, never rounded away ("0.4us" was 0)
    exact = Decimal(_VALUE_RE.fullmatch(text).group("num")) * _DURATION_UNITS[unit]
    whole = int(exact)
    if exact != whole:
        raise ValueError(f"duration {shown(text)} is {exact.normalize():f}us: netbench keeps whole microseconds; "
                         f"write {format_duration_us(whole) if whole else '0'} or {format_duration_us(whole + 1)}")
    return whole


def parse_seconds(text: str | int | float) -> float:
    """A flag that has always taken seconds: a bare number is seconds ("90", "0.5"); a unit is
    welcome ("90s", "500ms", "2min"). Float seconds."""
    value, unit = _split(text, "duration", "90, 90s or 500ms")
    if unit == "":
        return value
    if unit not in _DURATION_UNITS:
        raise ValueError(f"unknown duration unit {shown(unit)} in {shown(text)}; use ms, s, min or h")
    return value * _DURATION_UNITS[unit] / 1e6


def parse_rate_bps(text: str | int | float) -> int:
    """Parse a rate ("250mbit", "1gbit", "100kbit") into integer bits per second."""
    value, unit = _split(text, "rate", "250mbit or 1gbit")
    if unit == "":
        raise ValueError(f"rate {shown(text)} needs a unit: kbit, mbit or gbit (for example 250mbit)")
    unit = unit.removesuffix("/s") if unit.endswith("bit/s") else unit
    ambiguous = _AMBIGUOUS_RATE.fullmatch(unit)
    if ambiguous:
        prefix = ambiguous.group("prefix")
        bits = f"{value:g}{prefix}bit"
        byte_bits = format_rate_bps(round(value * 8 * _RATE_PREFIX[prefix]))
        raise ValueError(f"rate {shown(text)} is ambiguous (as bits per second: {bits}; as bytes per second, tc's reading: "
                         f"{byte_bits}): write {bits} or {byte_bits}")
    if unit not in _RATE_UNITS:
        raise ValueError(f"unknown rate unit {shown(unit)} in {shown(text)}; use kbit, mbit or gbit")
    return round(value * _RATE_UNITS[unit])


def parse_ratio(text: str | int | float) -> float:
    """Parse a percentage: "1%" -> 0.01, "0.5%" -> 0.005; a bare 0 is 0.

    Any other bare number is refused: tc reads "loss 0.5" as 0.5 %, a fraction reads it as 50 %.
    The percentage is divided exactly (decimal), so format_ratio's text parses back to the float."""
    value, unit = _split(text, "percentage", "1% or 0.5%")
    if unit == "":
        if value == 0:
            return 0.0
        readings = [f"{value:g}%"] + ([f"{value * 100:g}%"] if value <= 1 else [])
        raise ValueError(f"{shown(text)} is ambiguous without % (tc reads {value:g}%, a fraction "
                         f"{value * 100:g}%): write {' or '.join(readings)}")
    if unit != "%":
        raise ValueError(f"unknown unit {shown(unit)} in {shown(text)}; write a percentage such as 1%")
    number = text.strip().removesuffix("%").strip()  # a % came from text, never from a number
    ratio = float(Decimal(number) / 100)
    if ratio > 1:
        raise ValueError(f"{shown(text)} is over 100%")
    return ratio


def parse_size_bytes(text: str | int) -> int:
    """A size ("8", "8B", "64KiB", "1MiB", "1GiB") -> bytes, 1 to MAX_SIZE_BYTES. "1MB", "1M"
    are refused: binary (1MiB) and SI (1000000) read them differently."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise ValueError(f"expected a size such as 8, 4KiB or 64MiB, got {shown(text)}")
    written = str(text).strip()
    value = written.lower()
    digits = value.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = value[len(digits):]
    if unit in _SIZE_UNITS and unit.endswith("b") and written.endswith("b") and digits.isdigit():
        # a lower-case b is a bit to rates and to SI ("8b", "64kib"), refused as it is there
        spelled = {"b": "B", "kib": "KiB", "mib": "MiB", "gib": "GiB"}[unit]
        raise ValueError(f"size {shown(text)} is ambiguous (b is a bit, B a byte): write {digits}{spelled}"
                         + (f" or {digits}" if unit == "b" else ""))
    if not digits.isdigit() or len(digits) > 12:
        raise ValueError(f"{shown(text)} is not a size such as 8, 4KiB or 64MiB")
    if unit in _AMBIGUOUS_SIZE:
        binary = int(digits) * _AMBIGUOUS_SIZE[unit]
        si = int(digits) * 1000 ** (1 + "kmg".index(unit[0]))
        raise ValueError(f"size {shown(text)} is ambiguous ({format_size_bytes(binary)} or {si} bytes): "
                         f"write {format_size_bytes(binary)} or {si}")
    if unit not in _SIZE_UNITS:
        raise ValueError(f"{shown(text)} is not a size such as 8, 4KiB or 64MiB (units: B, KiB, MiB, GiB)")
    size = int(digits) * _SIZE_UNITS[unit]
    if size < 1:
        raise ValueError(f"{shown(text)}: a size must be at least 1 byte")
    if size > MAX_SIZE_BYTES:
        raise ValueError(f"{shown(text)} is over {format_size_bytes(MAX_SIZE_BYTES)}")
    return size


def format_size_bytes(size: int) -> str:
    """8 -> "8B", 65536 -> "64KiB", 67108864 -> "64MiB" (exact multiples only)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


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
    text = f"{ratio * 100.0:g}"
    if parse_ratio(f"{text}%") != ratio:
        # the shortest decimal of the ratio, moved two places: parse_ratio divides it back exactly
        text = format(Decimal(repr(ratio)) * 100, "f")
        text = text.rstrip("0").rstrip(".") if "." in text else text
    return f"{text}%"


def format_wall_seconds(seconds: float, digits: int = 1) -> str:
    """A wall time read at a glance: "3.2 s", "14.0 min", "5.3 h" (`digits` after the point of
    seconds and minutes; hours always one)."""
    if seconds < 120:
        return f"{seconds:.{digits}f} s"
    if seconds < 7200:
        return f"{seconds / 60:.{digits}f} min"
    return f"{seconds / 3600:.1f} h"
