"""Network profiles: what one link should look like.

A profile is YAML with `delay`, `jitter`, `loss` and `rate` in the units people write
("10ms", "1%", "250mbit"), plus netem's finer controls (jitter distribution and
correlation, Gilbert-Elliott loss, duplicate, corrupt, reorder, queue limit), the
direction to shape and the peers to shape towards. It is normalised once, at load, into a
frozen `Profile` with integer microseconds, ratios and bits per second. Delay is one-way
and added at each node's egress, so the round trip between two shaped nodes is twice the
delay; `direction: both` shapes arriving traffic too (through an ifb device).
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping


from netbench import units
from netbench.errors import ProfileError, shown, shown_key
from netbench.yamlfile import read_yaml

MAX_DELAY_US = 10_000_000  # 10 s one-way: beyond this TCP and gRPC time out anyway
# netem keeps jitter as a signed 32-bit count of nanoseconds; kernels clamp more to this
MAX_JITTER_US = (2**31 - 1) // 1000
MIN_RATE_BPS = 8_000  # 8 kbit/s: a token bucket below one packet a second is meaningless
MAX_RATE_BPS = 100_000_000_000  # 100 gbit/s

_BARE_NUMBER_RE = re.compile(r"[0-9]*\.?[0-9]+")  # fullmatch, as every pattern here
_VALUE_UNIT_RE = re.compile(r"[0-9]*\.?[0-9]+\s*([A-Za-z%]+(?:/s)?)")

PROFILE_KEYS = ("name", "description", "delay", "jitter", "jitter_correlation", "distribution", "loss",
                "loss_correlation", "duplicate", "duplicate_correlation", "corrupt", "corrupt_correlation",
                "reorder", "reorder_correlation", "reorder_gap", "rate", "limit", "direction", "peers")
LOSS_MODEL_KEYS = ("model", "p", "r", "bad_loss", "good_loss")
DISTRIBUTIONS = ("uniform", "normal", "pareto", "paretonormal")
DIRECTIONS = ("egress", "ingress", "both")
LOSS_MODELS = ("random", "gilbert-elliott")
MAX_LIMIT_PACKETS = 10_000_000
MAX_REORDER_GAP = 2**32 - 1  # netem holds the gap in a u32
NETEM_ONLY_FIELDS = ("jitter_correlation", "distribution", "loss_correlation", "loss_model", "duplicate", "corrupt",
                     "reorder", "limit_packets", "direction", "peers")  # correlations/GE need their base field


@dataclass(frozen=True)
class Profile:
    """A link profile in canonical units.

    delay_us: one-way delay added at egress, microseconds.
    jitter_us: delay variation, microseconds; at most delay_us. With the uniform
        distribution the delay is uniform on delay +- jitter; otherwise jitter is the
        distribution's standard deviation (netem's convention).
    loss: probability that a packet is dropped at egress (random loss), ratio in [0, 1].
    rate_bps: egress rate limit in bits/s, or None for unlimited.
    The rest are netem's controls (ratios in [0, 1]; correlations as netem defines them);
    loss_model "gilbert-elliott" replaces random loss with a two-state chain: p (good to
    bad), r (bad to good), ge_bad_loss (1-h) and ge_good_loss (1-k).
    limit_packets: netem queue limit; None sizes it from the bandwidth-delay product.
    direction: shape what a node sends (egress), receives (ingress) or both.
    peers: shape only traffic to (egress) or from (ingress) these nodes or CIDRs.
    """

    name: str = "custom"
    delay_us: int = 0
    jitter_us: int = 0
    loss: float = 0.0
    rate_bps: int | None = None
    description: str = ""
    jitter_correlation: float = 0.0
    distribution: str = "uniform"
    loss_correlation: float = 0.0
    loss_model: str = "random"
    ge_p: float = 0.0
    ge_r: float = 1.0
    ge_bad_loss: float = 1.0
    ge_good_loss: float = 0.0
    duplicate: float = 0.0
    duplicate_correlation: float = 0.0
    corrupt: float = 0.0
    corrupt_correlation: float = 0.0
    reorder: float = 0.0
    reorder_correlation: float = 0.0
    reorder_gap: int = 0
    limit_packets: int | None = None
    direction: str = "egress"
    peers: tuple[str, ...] = ()

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
        return not (self.delay_us or self.jitter_us or self.loss or self.rate_bps or self.uses_ge
                    or self.duplicate or self.corrupt or self.reorder)

    @property
    def uses_ge(self) -> bool:
        return self.loss_model == "gilbert-elliott"

    def netem_only_fields(self) -> list[str]:
        """The profile keys only netem can emulate (the userspace backend refuses them)."""
        default = Profile()
        return [_FIELD_KEYS[field] for field in NETEM_ONLY_FIELDS if getattr(self, field) != getattr(default, field)]

    def to_yaml_dict(self) -> dict[str, Any]:
        """The profile in the units people write; loads back to an equal Profile."""
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        out["delay"] = units.format_duration_us(self.delay_us)
        out["jitter"] = units.format_duration_us(self.jitter_us)
        if self.uses_ge:
            out["loss"] = {"model": self.loss_model, "p": units.format_ratio(self.ge_p),
                           "r": units.format_ratio(self.ge_r), "bad_loss": units.format_ratio(self.ge_bad_loss),
                           "good_loss": units.format_ratio(self.ge_good_loss)}
        else:
            out["loss"] = units.format_ratio(self.loss)
        if self.rate_bps is not None:
            out["rate"] = units.format_rate_bps(self.rate_bps)
        default = Profile()
        for key in ("jitter_correlation", "loss_correlation", "duplicate", "duplicate_correlation", "corrupt",
                    "corrupt_correlation", "reorder", "reorder_correlation"):
            if getattr(self, key) != getattr(default, key):
                out[key] = units.format_ratio(getattr(self, key))
        if self.distribution != default.distribution:
            out["distribution"] = self.distribution
        if self.reorder_gap:
            out["reorder_gap"] = self.reorder_gap
        if self.limit_packets is not None:
            out["limit"] = self.limit_packets
        if self.direction != default.direction:
            out["direction"] = self.direction
        if self.peers:
            out["peers"] = list(self.peers)
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
        if self.uses_ge:
            parts.append(f"GE(p={units.format_ratio(self.ge_p)},r={units.format_ratio(self.ge_r)})")
        else:
            parts.append(units.format_ratio(self.loss))
        for key, short in (("duplicate", "dup"), ("corrupt", "corrupt"), ("reorder", "reorder")):
            if getattr(self, key):
                parts.append(f"{short} {units.format_ratio(getattr(self, key))}")
        if self.direction != "egress":
            parts.append(self.direction)
        return "/".join(parts)


def _field(source: str, key: str, raw: Any, parse: Callable[[Any], Any], hint: str) -> Any:
    try:
        return parse(raw)
    except ValueError as exc:
        where = f"flag {key}" if source == "flag" else f"{source}: {key}"
        raise ProfileError(f"{where}: {exc}", hint=hint) from None


_FIELD_KEYS = {"delay_us": "delay", "jitter_us": "jitter", "loss": "loss", "rate_bps": "rate",
               "jitter_correlation": "jitter_correlation", "distribution": "distribution",
               "loss_correlation": "loss_correlation", "loss_model": "loss.model", "ge_p": "loss.p",
               "ge_r": "loss.r", "ge_bad_loss": "loss.bad_loss", "ge_good_loss": "loss.good_loss",
               "duplicate": "duplicate", "duplicate_correlation": "duplicate_correlation", "corrupt": "corrupt",
               "corrupt_correlation": "corrupt_correlation", "reorder": "reorder",
               "reorder_correlation": "reorder_correlation", "reorder_gap": "reorder_gap",
               "limit_packets": "limit", "direction": "direction", "peers": "peers"}
_NODE_RE = re.compile(r"n[1-9][0-9]*")  # fullmatch: "$" would let "n2\n" through


def _check_peer(peer: str) -> str | None:
    """None if `peer` is a testbed node name (n2) or an IPv4 address/CIDR, else why not."""
    if not isinstance(peer, str) or not peer.strip():
        return "a peer must be a node name such as n2 or a CIDR such as 10.0.0.0/24"
    if _NODE_RE.fullmatch(peer):
        return None
    try:
        ipaddress.IPv4Network(peer, strict=False)
    except ValueError:
        return f"{shown(peer)} is neither a node name (n2) nor an IPv4 address or CIDR"
    return None


def validate(profile: Profile, source: str, keys: Mapping[str, str] | None = None) -> Profile:
    """Check ranges and combinations; `keys` maps field names to how the user named them."""
    names = dict(_FIELD_KEYS)
    names.update(keys or {})

    def fail(field: str, message: str, hint: str) -> ProfileError:
        where = f"flag {names[field]}" if source == "flag" else f"{source}: {names[field]}"
        return ProfileError(f"{where}: {message}", hint=hint)

    if profile.delay_us > MAX_DELAY_US:
        raise fail("delay_us", f"{units.format_duration_us(profile.delay_us)} is absurd "
                   "(over 10s one-way)", "use a one-way delay of at most 10s, e.g. 100ms")
    if profile.jitter_us > MAX_JITTER_US:
        raise fail("jitter_us", f"jitter {units.format_duration_us(profile.jitter_us)} is more than netem can "
                   f"hold ({units.format_duration_us(MAX_JITTER_US)})", "use a jitter of at most 2s")
    if profile.jitter_us > profile.delay_us:
        raise fail("jitter_us", f"jitter {units.format_duration_us(profile.jitter_us)} exceeds "
                   f"delay {units.format_duration_us(profile.delay_us)}",
                   "jitter is +- around the delay; keep it at most the delay, e.g. delay 10ms jitter 2ms")
    for field in ("loss", "jitter_correlation", "loss_correlation", "ge_p", "ge_r", "ge_bad_loss", "ge_good_loss",
                  "duplicate", "duplicate_correlation", "corrupt", "corrupt_correlation", "reorder",
                  "reorder_correlation"):
        if not 0.0 <= getattr(profile, field) <= 1.0:
            raise fail(field, f"{getattr(profile, field):g} is outside 0%..100%", "write a percentage, e.g. 1%")
    if profile.rate_bps is not None:
        if profile.rate_bps <= 0:
            raise fail("rate_bps", "rate must be positive", "omit rate for an unlimited link, or write e.g. 250mbit")
        if profile.rate_bps < MIN_RATE_BPS:
            raise fail("rate_bps", f"{profile.rate_bps} bit/s is below 8kbit", "use at least 8kbit")
        if profile.rate_bps > MAX_RATE_BPS:
            raise fail("rate_bps", f"{units.format_rate_bps(profile.rate_bps)} is over 100gbit",
                       "use at most 100gbit, or omit rate for unlimited")
    if profile.distribution not in DISTRIBUTIONS:
        raise fail("distribution", f"unknown distribution {shown(profile.distribution)}",
                   f"use one of: {', '.join(DISTRIBUTIONS)}")
    if profile.loss_model not in LOSS_MODELS:
        raise fail("loss_model", f"unknown loss model {shown(profile.loss_model)}",
                   f"use one of: {', '.join(LOSS_MODELS)}")
    needs = (("jitter_correlation", "jitter_us", "jitter"), ("duplicate_correlation", "duplicate", "duplicate"),
             ("corrupt_correlation", "corrupt", "corrupt"), ("reorder_correlation", "reorder", "reorder"),
             ("reorder_gap", "reorder", "reorder"))
    for field, base, what in needs:
        if getattr(profile, field) and not getattr(profile, base):
            raise fail(field, f"has no effect without {what}", f"set {what} too, or remove {names[field]}")
    if profile.uses_ge:
        if profile.loss or profile.loss_correlation:
            raise fail("loss_model", "Gilbert-Elliott loss replaces random loss and its correlation",
                       "remove loss_correlation, or use random loss")
        if not profile.ge_p:
            raise fail("ge_p", "p (good to bad) must be above 0%, or no loss ever happens", "e.g. p: 1%")
    elif profile.loss_correlation and not profile.loss:
        raise fail("loss_correlation", "has no effect without loss", "set loss too, or remove loss_correlation")
    if profile.reorder and not profile.delay_us:
        raise fail("reorder", "reordering needs a delay: netem sends some packets at once and delays the rest",
                   "set a delay, e.g. delay: 10ms")
    if not 0 <= profile.reorder_gap <= MAX_REORDER_GAP:
        raise fail("reorder_gap", f"must be a whole number of packets in 0..{MAX_REORDER_GAP}", "e.g. reorder_gap: 5")
    if profile.limit_packets is not None and not 1 <= profile.limit_packets <= MAX_LIMIT_PACKETS:
        raise fail("limit_packets", f"{profile.limit_packets} is outside 1..{MAX_LIMIT_PACKETS} packets",
                   "omit limit to size the queue from the bandwidth-delay product")
    if profile.direction not in DIRECTIONS:
        raise fail("direction", f"unknown direction {shown(profile.direction)}", f"use one of: {', '.join(DIRECTIONS)}")
    for peer in profile.peers:
        problem = _check_peer(peer)
        if problem:
            raise fail("peers", problem, "e.g. peers: [n2] or peers: [10.20.0.0/24]")
    return profile


def _ratio_field(source: str, data: Mapping, key: str, prefix: str = "") -> float:
    return _field(source, prefix + key, data.get(key, 0), units.parse_ratio, f"e.g. '{key}: 25%'")


def _int_field(source: str, key: str, raw: Any, hint: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ProfileError(f"{source}: {key}: must be a whole number, got {shown(raw)}", hint=hint)
    return raw


def _loss_fields(data: Any, source: str) -> dict[str, Any]:
    """`loss: 1%` (random) or `loss: {model: gilbert-elliott, p: 1%, r: 30%, ...}`."""
    if not isinstance(data, Mapping):
        return {"loss": _field(source, "loss", data, units.parse_ratio, "e.g. 'loss: 1%'")}
    for key in data:
        if key not in LOSS_MODEL_KEYS:
            close = difflib.get_close_matches(str(key), LOSS_MODEL_KEYS, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(LOSS_MODEL_KEYS)}"
            raise ProfileError(f"{source}: loss.{shown_key(key)}: unknown key", hint=hint)
    model = data.get("model")
    if model not in ("gilbert-elliott", "gemodel"):
        raise ProfileError(f"{source}: loss.model: must be gilbert-elliott, got {shown(model)}",
                           hint="write 'loss: 1%' for random loss, or 'loss: {model: gilbert-elliott, p: 1%, r: 30%}'")
    out: dict[str, Any] = {"loss_model": "gilbert-elliott"}
    for key, field, default in (("p", "ge_p", 0), ("r", "ge_r", "100%"), ("bad_loss", "ge_bad_loss", "100%"),
                                ("good_loss", "ge_good_loss", 0)):
        out[field] = _field(source, f"loss.{key}", data.get(key, default), units.parse_ratio, f"e.g. '{key}: 10%'")
    return out


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
            raise ProfileError(f"{source}: {shown_key(key)}: unknown key", hint=hint)
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name.strip():
        raise ProfileError(f"{source}: name: must be a non-empty string", hint="e.g. 'name: wan'")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ProfileError(f"{source}: description: must be a string")
    rate_raw = data.get("rate")
    limit_raw = data.get("limit")
    peers_raw = data.get("peers", [])
    if isinstance(peers_raw, str) or not isinstance(peers_raw, (list, tuple)):
        raise ProfileError(f"{source}: peers: must be a list", hint="e.g. 'peers: [n2, n3]'")
    for text_key in ("distribution", "direction"):
        if text_key in data and not isinstance(data[text_key], str):
            raise ProfileError(f"{source}: {text_key}: must be a word, got {shown(data[text_key])}")
    profile = Profile(
        name=name.strip(),
        description=description,
        delay_us=_field(source, "delay", data.get("delay", 0), units.parse_duration_us, "e.g. 'delay: 10ms'"),
        jitter_us=_field(source, "jitter", data.get("jitter", 0), units.parse_duration_us, "e.g. 'jitter: 1ms'"),
        rate_bps=None if rate_raw is None else _field(source, "rate", rate_raw, units.parse_rate_bps,
                                                      "e.g. 'rate: 250mbit'"),
        jitter_correlation=_ratio_field(source, data, "jitter_correlation"),
        distribution=data.get("distribution", "uniform"),
        loss_correlation=_ratio_field(source, data, "loss_correlation"),
        duplicate=_ratio_field(source, data, "duplicate"),
        duplicate_correlation=_ratio_field(source, data, "duplicate_correlation"),
        corrupt=_ratio_field(source, data, "corrupt"),
        corrupt_correlation=_ratio_field(source, data, "corrupt_correlation"),
        reorder=_ratio_field(source, data, "reorder"),
        reorder_correlation=_ratio_field(source, data, "reorder_correlation"),
        reorder_gap=_int_field(source, "reorder_gap", data.get("reorder_gap", 0), "e.g. 'reorder_gap: 5'"),
        limit_packets=None if limit_raw is None else _int_field(source, "limit", limit_raw, "e.g. 'limit: 5000'"),
        direction=data.get("direction", "egress"),
        peers=tuple(str(peer) for peer in peers_raw),
        **_loss_fields(data.get("loss", 0), source),
    )
    return validate(profile, source)


def load_profile(path: str | Path) -> Profile:
    """Load and validate one profile file; the name defaults to the file's stem."""
    path = Path(path)
    data = read_yaml(path, "profile", ProfileError, "list the shipped ones with 'ls profiles/'")
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


_LEVEL_EXAMPLES = {"--bandwidth": "100,1000mbit", "--loss": "0,0.1,1%", "--jitter": "0,1ms"}


def parse_levels(text: str, flag: str, parse: Callable[[str], Any]) -> list[Any]:
    """Parse a comma list of levels for a sweep flag: "1,10,100ms" -> [1000, 10000, 100000] us.

    A unit written on the last level applies to bare numbers before it, as people write
    "1,10,100ms".
    """
    example = f"e.g. {flag} {_LEVEL_EXAMPLES.get(flag, '1,10,100ms')}"
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise ProfileError(f"flag {flag}: empty level in {shown(text)}", hint=example)
    last_unit = _VALUE_UNIT_RE.fullmatch(items[-1])
    suffix = last_unit.group(1) if last_unit else ""
    values = []
    for item in items:
        if suffix and _BARE_NUMBER_RE.fullmatch(item):
            item = item + suffix
        try:
            values.append(parse(item))
        except ValueError as exc:
            raise ProfileError(f"flag {flag}: {exc}", hint=example) from None
    if len(set(values)) != len(values):
        raise ProfileError(f"flag {flag}: repeated level in {shown(text)}", hint="use --repeat for repetitions")
    return values

