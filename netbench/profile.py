"""Network profiles: what one link should look like.

A profile is YAML with `delay`, `jitter`, `loss` and `rate` in the units people write
("10ms", "1%", "250mbit"). It is normalised once, at load, into a frozen `Profile` with
integer microseconds, a loss ratio and bits per second. Delay is one-way and added at
each node's egress, so the round trip between two shaped nodes is twice the delay.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from netbench import units
from netbench.errors import ProfileError

MAX_DELAY_US = 10_000_000  # 10 s one-way: beyond this TCP and gRPC time out anyway
MIN_RATE_BPS = 8_000  # 8 kbit/s: a token bucket below one packet a second is meaningless
MAX_RATE_BPS = 100_000_000_000  # 100 gbit/s

_BARE_NUMBER_RE = re.compile(r"^[0-9]*\.?[0-9]+$")
_VALUE_UNIT_RE = re.compile(r"^[0-9]*\.?[0-9]+\s*([A-Za-z%]+)$")

PROFILE_KEYS = ("name", "description", "delay", "jitter", "loss", "rate")


@dataclass(frozen=True)
class Profile:
    """A link profile in canonical units.

    delay_us: one-way delay added at egress, microseconds.
    jitter_us: delay variation (uniform +-jitter), microseconds; at most delay_us.
    loss: probability that a packet is dropped at egress, ratio in [0, 1].
    rate_bps: egress rate limit in bits/s, or None for unlimited.
    """

    name: str = "custom"
    delay_us: int = 0
    jitter_us: int = 0
    loss: float = 0.0
    rate_bps: int | None = None
    description: str = ""

    @property
    def delay_ms(self) -> float:
        return self.delay_us / 1000.0

    @property
    def jitter_ms(self) -> float:
        return self.jitter_us / 1000.0

    @property
    def loss_pct(self) -> float:
        return self.loss * 100.0

    @property
    def rate_mbit(self) -> float | None:
        return None if self.rate_bps is None else self.rate_bps / 1e6

    @property
    def is_null(self) -> bool:
        """True when the profile changes nothing (no delay, jitter, loss or rate)."""
        return not (self.delay_us or self.jitter_us or self.loss or self.rate_bps)

    def to_yaml_dict(self) -> dict[str, Any]:
        """The profile in the units people write; loads back to an equal Profile."""
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        out["delay"] = units.format_duration_us(self.delay_us)
        out["jitter"] = units.format_duration_us(self.jitter_us)
        out["loss"] = units.format_ratio(self.loss)
        if self.rate_bps is not None:
            out["rate"] = units.format_rate_bps(self.rate_bps)
        return out

    def to_record(self) -> dict[str, Any]:
        """Canonical numbers, for JSON records and journals."""
        return asdict(self)

    def label(self) -> str:
        """A short human label: "10ms/250mbit/1%"."""
        parts = [units.format_duration_us(self.delay_us)]
        if self.jitter_us:
            parts[0] += f"±{units.format_duration_us(self.jitter_us)}"
        parts.append(units.format_rate_bps(self.rate_bps))
        parts.append(units.format_ratio(self.loss))
        return "/".join(parts)


def _field(source: str, key: str, raw: Any, parse: Callable[[Any], Any], hint: str) -> Any:
    try:
        return parse(raw)
    except ValueError as exc:
        where = f"flag {key}" if source == "flag" else f"{source}: {key}"
        raise ProfileError(f"{where}: {exc}", hint=hint) from None


def validate(profile: Profile, source: str, keys: Mapping[str, str] | None = None) -> Profile:
    """Check ranges; `keys` maps field names to how the user named them (key or flag)."""
    names = {"delay_us": "delay", "jitter_us": "jitter", "loss": "loss", "rate_bps": "rate"}
    names.update(keys or {})

    def fail(field: str, message: str, hint: str) -> ProfileError:
        where = f"flag {names[field]}" if source == "flag" else f"{source}: {names[field]}"
        return ProfileError(f"{where}: {message}", hint=hint)

    if profile.delay_us > MAX_DELAY_US:
        raise fail("delay_us", f"{units.format_duration_us(profile.delay_us)} is absurd "
                   "(over 10s one-way)", "use a one-way delay of at most 10s, e.g. 100ms")
    if profile.jitter_us > profile.delay_us:
        raise fail("jitter_us", f"jitter {units.format_duration_us(profile.jitter_us)} exceeds "
                   f"delay {units.format_duration_us(profile.delay_us)}",
                   "jitter is +- around the delay; keep it at most the delay, e.g. delay 10ms jitter 2ms")
    if not 0.0 <= profile.loss <= 1.0:
        raise fail("loss", f"{profile.loss:g} is outside 0%..100%", "write loss as a percentage, e.g. 1%")
    if profile.rate_bps is not None:
        if profile.rate_bps <= 0:
            raise fail("rate_bps", "rate must be positive", "omit rate for an unlimited link, or write e.g. 250mbit")
        if profile.rate_bps < MIN_RATE_BPS:
            raise fail("rate_bps", f"{profile.rate_bps} bit/s is below 8kbit", "use at least 8kbit")
        if profile.rate_bps > MAX_RATE_BPS:
            raise fail("rate_bps", f"{units.format_rate_bps(profile.rate_bps)} is over 100gbit",
                       "use at most 100gbit, or omit rate for unlimited")
    return profile


def profile_from_mapping(data: Any, source: str, default_name: str = "custom") -> Profile:
    """Build and validate a Profile from a parsed YAML mapping; errors name `source` and key."""
    if data is None:
        raise ProfileError(f"{source}: the profile is empty",
                           hint="write at least one of delay, jitter, loss, rate, e.g. 'delay: 10ms'")
    if not isinstance(data, Mapping):
        raise ProfileError(f"{source}: a profile must be a mapping of keys to values, "
                           f"got {type(data).__name__}", hint="write lines like 'delay: 10ms'")
    for key in data:
        if key not in PROFILE_KEYS:
            close = difflib.get_close_matches(str(key), PROFILE_KEYS, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(PROFILE_KEYS)}"
            raise ProfileError(f"{source}: {key}: unknown key", hint=hint)
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name.strip():
        raise ProfileError(f"{source}: name: must be a non-empty string", hint="e.g. 'name: wan'")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ProfileError(f"{source}: description: must be a string")
    rate_raw = data.get("rate")
    profile = Profile(
        name=name.strip(),
        description=description,
        delay_us=_field(source, "delay", data.get("delay", 0), units.parse_duration_us, "e.g. 'delay: 10ms'"),
        jitter_us=_field(source, "jitter", data.get("jitter", 0), units.parse_duration_us, "e.g. 'jitter: 1ms'"),
        loss=_field(source, "loss", data.get("loss", 0), units.parse_ratio, "e.g. 'loss: 1%'"),
        rate_bps=None if rate_raw is None else _field(source, "rate", rate_raw, units.parse_rate_bps,
                                                      "e.g. 'rate: 250mbit'"),
    )
    return validate(profile, source)


def load_profile(path: str | Path) -> Profile:
    """Load and validate one profile file; the name defaults to the file's stem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such profile file",
                           hint="list the shipped ones with 'ls profiles/'") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ProfileError(f"{path}: broken YAML{where}: {problem}",
                           hint="check indentation and 'key: value' syntax") from None
    return profile_from_mapping(data, str(path), default_name=path.stem)


def profile_from_flags(base: Profile | None = None, **flags: str | None) -> Profile:
    """Overlay command-line flags (`latency`, `jitter`, `bandwidth`, `loss`) on a base profile.

    Errors name the flag, e.g. "--latency: unknown duration unit 'xs' in '10xs'".
    """
    profile = base or Profile(name="custom")
    parsers = {
        "latency": ("delay_us", units.parse_duration_us, "e.g. --latency 10ms"),
        "jitter": ("jitter_us", units.parse_duration_us, "e.g. --jitter 1ms"),
        "bandwidth": ("rate_bps", units.parse_rate_bps, "e.g. --bandwidth 250mbit"),
        "loss": ("loss", units.parse_ratio, "e.g. --loss 1%"),
    }
    changes: dict[str, Any] = {}
    for flag, raw in flags.items():
        if raw is None:
            continue
        field, parse, hint = parsers[flag]
        changes[field] = _field("flag", f"--{flag}", raw, parse, hint)
    if changes:
        profile = replace(profile, **changes)
        if base is None or base.name == "custom":
            profile = replace(profile, name=profile.label())
    keys = {"delay_us": "--latency", "jitter_us": "--jitter", "rate_bps": "--bandwidth", "loss": "--loss"}
    return validate(profile, "flag", keys=keys)


def parse_levels(text: str, flag: str, parse: Callable[[str], Any]) -> list[Any]:
    """Parse a comma list of levels for a sweep flag: "1,10,100ms" -> [1000, 10000, 100000] us.

    A unit written on the last level applies to bare numbers before it, as people write
    "1,10,100ms".
    """
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise ProfileError(f"flag {flag}: empty level in {text!r}", hint=f"e.g. {flag} 1,10,100ms")
    last_unit = _VALUE_UNIT_RE.match(items[-1])
    suffix = last_unit.group(1) if last_unit else ""
    values = []
    for item in items:
        if suffix and _BARE_NUMBER_RE.match(item):
            item = item + suffix
        try:
            values.append(parse(item))
        except ValueError as exc:
            raise ProfileError(f"flag {flag}: {exc}", hint=f"e.g. {flag} 1,10,100ms") from None
    if len(set(values)) != len(values):
        raise ProfileError(f"flag {flag}: repeated level in {text!r}", hint="use --repeat for repetitions")
    return values

