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

After a change that widens the path (a longer round trip, a higher rate, more jitter or
less loss: `widens`, the opposite of launch_plan.follows), TCP has to grow its window into the new path, and two of its answers pass
the stationarity test while they last (bench/live_changes.py measured them on netem and on the
engine alike, docs/background/launches.md): cubic's window growth after a tenfold rise in delay
is a slow ramp of steps each a little shorter than the last (about 10 s from 10 to 100 ms
one-way at 1 Gbit/s), and bbr keeps the shortest round trip of the last 10 s, so after a rise
in delay it runs at a fraction of the rate, evenly, until that minimum expires. So after a
widening change the series must also have stopped falling (the median of the last
max(steps, 3) steps at least (1 - DRIFT) x the median of the ones before them), and under bbr
a rise in the round trip waits out its 10 s window (`change_floor_s`). The default launches
(`--order descending`) only narrow the path, and none of these applies to them.

Each point's record says how long it settled and why (`reason`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from netbench.experiment.launch_plan import follows
from netbench.model.run import path_of

ROUND_TRIPS = 8.0  # the time floor in round trips of the point's path (a few for TCP to react)
DRIFT = 0.1  # after a widening change: the last steps' median at least this much under the ones before is a ramp
BBR_MIN_RTT_S = 10.0  # bbr's min_rtt filter: the shortest round trip of the last 10 s sizes its window
BBR_PROBE_RTT_S = 0.2  # then PROBE_RTT holds 4 packets in flight for 200 ms and a round trip


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


def widens(before, after) -> bool:
    """Whether the change from run `before` to run `after` widens the path (a rate, delay or
    jitter rises, or loss falls, on the path its steps see: model.run.path_of): the opposite of
    launch_plan.follows; False without a `before` (a launch's first point: its warm-up settles it)."""
    return before is not None and not follows(path_of(before), path_of(after))


def change_floor_s(before, after, congestion: str | None) -> float:
    """The least time a change's transient lasts, whatever the steps say: under bbr a longer round
    trip waits out bbr's min_rtt window (BBR_MIN_RTT_S), its PROBE_RTT and two of the new round
    trips (measured: 1 -> 10 ms at 1 Gbit/s ran at 2-11 Mbit/s for 5.8-7.5 s, evenly, on netem and
    on the engine); 0 otherwise, or without a `before`. `congestion`: the nodes' congestion control
    ("a;b" where they differ: any bbr counts)."""
    if before is None or not congestion or "bbr" not in congestion.split(";"):
        return 0.0
    rtt0, rtt1 = round_trip_s(before), round_trip_s(after)
    return BBR_MIN_RTT_S + BBR_PROBE_RTT_S + 2 * rtt1 if rtt1 > rtt0 else 0.0


def falling(durations: list[float], steps: int) -> bool:
    """Whether the step series is still falling: the median of the last max(steps, 3) steps more
    than DRIFT under the median of the as many before them (True while there are fewer)."""
    m = max(steps, 3)
    if len(durations) < 2 * m:
        return True
    return statistics.median(durations[-m:]) < (1 - DRIFT) * statistics.median(durations[-2 * m:-m])


def decide(settle: Settle, after: int, elapsed_s: float, durations: list[float], warmed: bool,
           floor_s: float, widened: bool = False) -> str | None:
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
    if widened and falling(durations, settle.steps):
        return None
    return "steady" if recent and statistics.median(recent) <= settle.steady * min(durations) else None


def reason(why: str | None, floor_s: float, rtt_s: float | None, settle: Settle, change_floor_s: float = 0.0,
           widened: bool = False) -> str | None:
    """A record's settle_reason: why, and the time floor that held (None: not settled); after a
    change that widened the path, that it waited for its steps to stop falling, and where bbr's
    window set the floor, that too."""
    if why is None:
        return None
    more = "; widened: until the steps stopped falling" if widened and why == "steady" else ""
    if change_floor_s and floor_s == change_floor_s:
        return f"{why}; floor {floor_s:.3f} s (bbr: a longer round trip waits out its 10 s min_rtt window){more}"
    if rtt_s is not None and settle.round_trips and floor_s < settle.seconds:
        return f"{why}; floor {floor_s:.3f} s ({settle.round_trips:g} round trips of {rtt_s * 1e3:g} ms){more}"
    return f"{why}; floor {floor_s:.3f} s{more}"
