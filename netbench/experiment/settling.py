"""When a point in a shared launch has settled after its network change (pure).

A change in place disturbs the job's TCP connections for a while: after a fall in rate the
queued bytes drain and lost segments are retransmitted; after a rise in delay the congestion
window grows again over a few round trips. The settle drops the chief's steps until that is
over (`PointWindow` in experiment/launch.py asks `decide` at each step):

* at least `Settle.steps` steps started after the change;
* at least the time floor: `round_trips` round trips of the point's path, at most `seconds`
  (so a 1 ms point waits milliseconds, a 50 ms one most of a second; `round_trips` 0: always
  `seconds`, as before the floor followed the link);
* then until the step series is stationary again: the median of the last max(steps, 3) steps
  no longer than `steady` x the shortest step since the change (step times are skewed right:
  a spike is common, a dip is not, so the shortest step is the new level's floor and a median
  near it says the transient is over); the test gives up `max_seconds` after the change.

Each point's record says how long it settled and why (`reason`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

ROUND_TRIPS = 8.0  # the time floor in round trips of the point's path (a few for TCP to react)


@dataclass(frozen=True)
class Settle:
    """How long a network change settles before a point's measured window: at least `steps`
    of the chief's steps started after the change AND at least min(`seconds`, `round_trips` x
    the path's round trip) after it (`seconds` where the round trip is unknown or
    `round_trips` is 0) AND the median of the last max(`steps`, 3) steps no longer than
    `steady` x the shortest step since the change; the steadiness rule gives up `max_seconds`
    after the change (0: no such rule)."""

    steps: int = 3
    seconds: float = 1.5
    steady: float = 1.5
    max_seconds: float = 30.0
    round_trips: float = ROUND_TRIPS

    def floor_s(self, rtt_s: float | None) -> float:
        """The time floor of a point whose path's round trip is `rtt_s` (None: unknown)."""
        if not self.round_trips or rtt_s is None:
            return self.seconds
        return min(self.seconds, self.round_trips * rtt_s)


def round_trip_s(run) -> float:
    """The round trip of a run's path, seconds: twice its one-way delay and jitter, or a per-pair
    topology's longest pair there and back (the ring waits on its slowest hop)."""
    pairs = getattr(run, "pairs", None)
    if pairs is not None and pairs.links:
        one_way = {(link.src, link.dst): link.profile.delay_us + link.profile.jitter_us for link in pairs.links}
        return max(us + one_way.get((dst, src), 0) for (src, dst), us in one_way.items()) / 1e6
    return 2 * (run.profile.delay_us + run.profile.jitter_us) / 1e6


def decide(settle: Settle, after: int, elapsed_s: float, durations: list[float], warmed: bool,
           floor_s: float) -> str | None:
    """Whether a point has settled at a step: None (not yet), or why it has: "warm-up" (a
    launch's first point: its warm-up settled it), "steady" (the series is stationary again),
    "floor" (no steadiness rule: the floors alone), "gave up" (not steady `max_seconds` after
    the change). `after`: the chief's steps started since the change, this one included;
    `elapsed_s`: this step's start since the change; `durations`: those steps' times."""
    if after <= settle.steps or elapsed_s < floor_s:
        return None
    if warmed:
        return "warm-up"
    if not settle.max_seconds:
        return "floor"
    if elapsed_s >= settle.max_seconds:
        return "gave up"
    recent = durations[-max(settle.steps, 3):]
    return "steady" if recent and statistics.median(recent) <= settle.steady * min(durations) else None


def reason(why: str | None, floor_s: float, rtt_s: float | None, settle: Settle) -> str | None:
    """A record's settle_reason: why, and the time floor that held (None: not settled)."""
    if why is None:
        return None
    if rtt_s is not None and settle.round_trips and floor_s < settle.seconds:
        return f"{why}; floor {floor_s:.3f} s ({settle.round_trips:g} round trips of {rtt_s * 1e3:g} ms)"
    return f"{why}; floor {floor_s:.3f} s"
