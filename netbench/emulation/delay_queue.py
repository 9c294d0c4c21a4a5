"""The delay engine's parameters and its single-profile scheduler (pure: no I/O, injected times).

All times are ``time.monotonic()`` seconds (float); parameters are integer microseconds.

* :class:`EngineParams`: one delay/jitter/loss for every packet (the node's profile), and,
  when ``pairs`` is not empty, a per-destination table (:class:`DestParams`, scheduled by
  pair_queue.PairScheduler) for which delay/jitter/loss are the default of destinations not
  in the table (all zero: they pass unshaped).
* :class:`DelayScheduler`: the single-profile path. NO REORDERING: a packet is never released
  before the packet queued before it (``release_i = max(release_i, release_{i-1})``). Jitter
  therefore stretches gaps instead of reordering, like netem when a rate is set. This is what
  makes the kernel's batch verdict ("accept every id <= N") valid: one verdict per wakeup
  instead of one per packet keeps a Python engine fast. Dropped packets get an individual
  NF_DROP verdict at arrival, which removes them from the kernel queue, so later batch
  accepts never touch them.
"""

from __future__ import annotations

import collections
import ipaddress
import random
from dataclasses import dataclass


# bounds on every field (at least a profile's, model/profile.py: a unit test holds them so):
# a control datagram or a command line beyond them is refused, never turned into an
# overflow inside the engine's loop
MAX_DELAY_US = 2**32 - 1  # ~71 minutes
MAX_JITTER_US = 2**32 - 1
MAX_RATE_BPS = 2**63 - 1
MAX_SEED = 2**64 - 1
_MAX_INT = {"delay_us": MAX_DELAY_US, "jitter_us": MAX_JITTER_US, "seed": MAX_SEED}


def shown_value(value: object) -> str:
    """`value` for a message, at most ~60 characters (an int of 4,300 digits has no repr)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"<an integer of {value.bit_length()} bits>"
    text = repr(value) if not isinstance(value, (list, dict, str)) or len(value) < 60 else f"<a {type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _check_int(name: str, value: object) -> None:
    top = _MAX_INT.get(name, MAX_SEED)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
        raise ValueError(f"{name} must be an int >= 0 and <= {top}, got {shown_value(value)}")


def _check_loss(value: object) -> None:
    # an int is compared as is: float() of a 400-digit one would overflow
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"loss must be a ratio in [0, 1], got {shown_value(value)}")


@dataclass(frozen=True)
class DestParams:
    """What the engine does to packets for one destination IPv4 address.

    dst: the destination address ("10.213.0.3"); delay_us, jitter_us: as EngineParams;
    loss: drop ratio; rate_bps: the pair's rate in bits/s (a serialization clock per
    destination, with a queue limit sized from its bandwidth-delay product), or None.
    """

    dst: str
    delay_us: int = 0
    jitter_us: int = 0
    loss: float = 0.0
    rate_bps: int | None = None

    def __post_init__(self) -> None:
        try:
            ipaddress.IPv4Address(self.dst)
        except (ipaddress.AddressValueError, ValueError, TypeError):
            raise ValueError(f"dst must be an IPv4 address, got {shown_value(self.dst)}") from None
        _check_int("delay_us", self.delay_us)
        _check_int("jitter_us", self.jitter_us)
        _check_loss(self.loss)
        if self.rate_bps is not None and (not isinstance(self.rate_bps, int) or isinstance(self.rate_bps, bool)
                                          or not 0 < self.rate_bps <= MAX_RATE_BPS):
            raise ValueError(f"rate_bps must be an int > 0 and <= {MAX_RATE_BPS} or None, "
                             f"got {shown_value(self.rate_bps)}")

    @property
    def key(self) -> int:
        """The destination as the engine reads it from the IPv4 header (a big-endian u32)."""
        return int(ipaddress.IPv4Address(self.dst))

    def as_dict(self) -> dict:
        return {"dst": self.dst, "delay_us": self.delay_us, "jitter_us": self.jitter_us,
                "loss": self.loss, "rate_bps": self.rate_bps}


def dest_params_from_dict(data: object) -> DestParams:
    """A DestParams from its JSON form (``as_dict``); ValueError naming the bad field."""
    if not isinstance(data, dict):
        raise ValueError(f"a pair must be an object, got {type(data).__name__}")
    unknown = sorted(set(data) - {"dst", "delay_us", "jitter_us", "loss", "rate_bps"})
    if unknown:
        raise ValueError(f"unknown pair field(s) {', '.join(unknown)[:200]}")
    if "dst" not in data:
        raise ValueError("a pair needs dst")
    loss = data.get("loss", 0.0)
    _check_loss(loss)
    return DestParams(data["dst"], data.get("delay_us", 0), data.get("jitter_us", 0), float(loss),
                      data.get("rate_bps"))


@dataclass(frozen=True)
class EngineParams:
    """Emulation parameters.

    delay_us: constant one-way delay added, microseconds (>= 0).
    jitter_us: half-width of a uniform jitter, microseconds (>= 0); each
        packet gets delay + U(-jitter, +jitter), clamped at >= 0.
    loss: drop probability per packet, ratio in [0, 1].
    seed: seed of the random generator (loss and jitter draws).
    pairs: per-destination parameters (no two for one dst); empty: every packet gets the
        above. Not empty: the above apply to destinations not in `pairs`.
    """

    delay_us: int
    jitter_us: int = 0
    loss: float = 0.0
    seed: int = 0
    pairs: tuple[DestParams, ...] = ()

    def __post_init__(self) -> None:
        _check_int("delay_us", self.delay_us)
        _check_int("jitter_us", self.jitter_us)
        _check_int("seed", self.seed)
        _check_loss(self.loss)
        seen: set[str] = set()
        for pair in self.pairs:
            if not isinstance(pair, DestParams):
                raise ValueError(f"pairs must be DestParams, got {type(pair).__name__}")
            if pair.dst in seen:
                raise ValueError(f"pairs: {pair.dst} is given twice")
            seen.add(pair.dst)

    def profile_dict(self) -> dict:
        """delay_us, jitter_us, loss, seed (the single profile, or the table's default)."""
        return {"delay_us": self.delay_us, "jitter_us": self.jitter_us, "loss": self.loss, "seed": self.seed}

    def as_dict(self) -> dict:
        """JSON form: profile_dict, plus "pairs" when there is a table."""
        out = self.profile_dict()
        if self.pairs:
            out["pairs"] = [pair.as_dict() for pair in self.pairs]
        return out


@dataclass
class LatenessStats:
    """How late releases were vs. schedule (verdict time - release time), s; and how many were
    over 1 ms and over 10 ms late (counters a reader can difference over any interval, where
    the max cannot be: a starved engine shows as a share of late releases, not one spike)."""

    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    over_1ms: int = 0
    over_10ms: int = 0

    def record(self, lag_s: float) -> None:
        """One release, `lag_s` after its scheduled time."""
        self.count += 1
        self.total_s += lag_s
        if lag_s > 1e-3:
            self.over_1ms += 1
            if lag_s > 1e-2:
                self.over_10ms += 1
        if lag_s > self.max_s:
            self.max_s = lag_s

    def as_dict_us(self) -> dict:
        mean = self.total_s / self.count if self.count else 0.0
        return {"count": self.count, "mean": round(mean * 1e6, 1),
                "max": round(self.max_s * 1e6, 1), "over_1ms": self.over_1ms, "over_10ms": self.over_10ms}


class DelayScheduler:
    """Decides drop / release time for each arriving packet (pure, no I/O).

    Call :meth:`arrive` for each packet in kernel queue order, then
    :meth:`due` with the current time to learn the highest packet id that may
    be accepted with one batch verdict.
    """

    def __init__(self, params: EngineParams) -> None:
        self.set_params(params)
        # (release_time_s, packet_id) in arrival == release order
        self._held: collections.deque = collections.deque()
        self._last_release_s = float("-inf")
        self.max_depth = 0
        self.released = 0
        self.dropped = 0
        self.lateness = LatenessStats()

    def set_params(self, params: EngineParams) -> None:
        """Use ``params`` for packets arriving from now on, with a generator seeded afresh.

        Held packets keep their release time, and no later arrival is released before
        them (the no-reordering rule), so nothing leaves earlier than it was scheduled.
        """
        self.params = params
        self._rng = random.Random(params.seed)
        self._delay_s = params.delay_us / 1e6
        self._jitter_s = params.jitter_us / 1e6
        self._loss = float(params.loss)

    def __len__(self) -> int:
        """Number of packets currently held."""
        return len(self._held)

    @property
    def last_release_s(self) -> float:
        """The latest release time given so far (-inf before any)."""
        return self._last_release_s

    def raise_floor(self, floor_s: float) -> None:
        """No packet arriving from now on is released before `floor_s` (a scheduler taking
        over from another keeps that one's order)."""
        self._last_release_s = max(self._last_release_s, floor_s)

    def arrive(self, packet_id: int, arrival_s: float) -> float | None:
        """Register a packet; return its release time (s) or None to drop it."""
        if self._loss and self._rng.random() < self._loss:
            self.dropped += 1
            return None
        release = arrival_s + self._sample_delay_s()
        # No reordering: never release before the previous packet.
        if release < self._last_release_s:
            release = self._last_release_s
        self._last_release_s = release
        self._held.append((release, packet_id))
        if len(self._held) > self.max_depth:
            self.max_depth = len(self._held)
        return release

    def _sample_delay_s(self) -> float:
        """delay + uniform(-jitter, +jitter), clamped at >= 0, seconds."""
        if not self._jitter_s:
            return self._delay_s
        return max(0.0, self._delay_s + self._rng.uniform(-self._jitter_s, self._jitter_s))

    def next_release_time(self) -> float | None:
        """Release time (s) of the oldest held packet, or None if none held."""
        return self._held[0][0] if self._held else None

    def due(self, now_s: float) -> int | None:
        """Pop every packet with release time <= now_s; return the highest id.

        The caller sends one batch ACCEPT for that id right away, so lateness
        (now_s - scheduled release) is recorded here per packet.
        """
        held = self._held
        if not held or held[0][0] > now_s:
            return None
        late = self.lateness
        last_id = None
        while held and held[0][0] <= now_s:
            release, last_id = held.popleft()
            late.record(now_s - release)
            self.released += 1
        return last_id

    def held_packets(self) -> list[tuple[float, int]]:
        """(release time, id) of every held packet, in release order (a scheduler taking over)."""
        return list(self._held)

    def flush(self) -> int | None:
        """Pop everything regardless of time (shutdown); return highest id."""
        if not self._held:
            return None
        last_id = self._held[-1][1]
        self.released += len(self._held)
        self._held.clear()
        return last_id
