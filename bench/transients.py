"""What a live change does to a TCP flow, from a byte counter (pure: no I/O; bench/live_changes.py).

A flow's receiver's byte counter, sampled as (monotonic seconds, cumulative bytes), is cut into
bins of `width` seconds around a change made at `t0`. Per change:

* ``steady_before``: the mean rate over the `before_s` seconds before the change;
* ``steady_after`` (the new steady rate): the mean rate over the `before_s` seconds that start
  `after_s` after the change (the flow holds the new point that long before the next change);
* ``t90_s``: the time after the change from which every window of `window_s` seconds up to
  `after_s` carries at least 90 % of the new steady rate (0 when none falls short). A window,
  not a bin: a single 100 ms bin of a flow on a 2-core machine dips now and then, and a rule
  on bins would put the end of the transient at the last random dip; and at least five round
  trips of the new path (`window_for`): a window-limited flow sends a window per round trip, so
  at 200 ms its 100 ms bins alternate between a burst and a pause;
* ``lowest``: the lowest bin in the `after_s` seconds after the change (bit/s);
* ``lowest_before``: the lowest bin in the `before_s` seconds before it, on the old steady
  path: how low a bin falls with no change at all (a backend's own dips, beside the change's);
* ``short_before``: 1 when a window of those seconds before the change (t90's rule, its
  steady rate) already fell under 90 %, else 0: a flow that dips so with no change times
  its t90 to its last dip, whatever the change did;
* ``bytes_after``: the bytes the flow moved in those `after_s` seconds.

Across repetitions each figure is summarised by its median and range (``Spread``), and an
engine's figures are compared with netem's: an engine's median outside netem's own range
(widened by `slack`, the counter's resolution) differs by more than netem's run-to-run spread.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import asdict, dataclass

TARGET = 0.9  # "time to 90 % of the new steady rate"
WINDOW_S = 0.5  # the least window t90 is judged on (see the module's docstring)
WINDOW_RTTS = 5  # ... and at least this many round trips of the new path


def window_for(rtt_s: float) -> float:
    """The window t90 is judged on after a change to a path of round trip `rtt_s`."""
    return max(WINDOW_S, WINDOW_RTTS * rtt_s)


def counter_at(samples: list[tuple[float, int]], t: float) -> float:
    """The cumulative counter at time `t`, linearly interpolated between the samples around it
    (clamped to the first and last sample). `samples`: (time, bytes), in time order."""
    if not samples:
        raise ValueError("no samples")
    times = [s[0] for s in samples]
    i = bisect.bisect_left(times, t)
    if i == 0:
        return float(samples[0][1])
    if i >= len(samples):
        return float(samples[-1][1])
    (ta, ba), (tb, bb) = samples[i - 1], samples[i]
    return ba + (bb - ba) * (t - ta) / (tb - ta) if tb > ta else float(bb)


def bins(samples: list[tuple[float, int]], t0: float, start_s: float, end_s: float,
         width: float = 0.1) -> list[float]:
    """Bytes per bin of `width` s from `t0 + start_s` to `t0 + end_s` (start_s may be negative)."""
    count = int(round((end_s - start_s) / width))
    edges = [counter_at(samples, t0 + start_s + k * width) for k in range(count + 1)]
    return [max(0.0, b - a) for a, b in zip(edges, edges[1:])]


def covers(samples: list[tuple[float, int]], t0: float, start_s: float, end_s: float, gap_s: float) -> bool:
    """Whether the samples span [t0 + start_s, t0 + end_s] with no hole longer than `gap_s`
    (a sampler that stalled cannot give 100 ms bins)."""
    inside = [t for t, _ in samples if t0 + start_s - gap_s <= t <= t0 + end_s + gap_s]
    if not inside or inside[0] > t0 + start_s or inside[-1] < t0 + end_s:
        return False
    return all(b - a <= gap_s for a, b in zip(inside, inside[1:]))


@dataclass(frozen=True)
class Transient:
    """One change, from its flow's bins. Rates in bit/s, times in seconds after the change."""

    steady_before: float
    steady_after: float
    t90_s: float
    lowest: float
    bytes_after: float
    lowest_before: float = float("nan")
    short_before: float = float("nan")

    def as_dict(self) -> dict:
        return asdict(self)


def time_to(rates: list[float], target: float, width: float, window_s: float = WINDOW_S) -> float:
    """The earliest time (s from the first bin) from which every window of `window_s` within
    `rates` (bit/s per bin of `width` s) averages at least `target`; 0 if none falls short, the
    end of `rates` if the last window does."""
    n = max(1, int(round(window_s / width)))
    if len(rates) < n:
        return 0.0 if rates and statistics.fmean(rates) >= target else len(rates) * width
    short = [k for k in range(len(rates) - n + 1) if statistics.fmean(rates[k:k + n]) < target]
    if not short:
        return 0.0
    last = short[-1]
    return (last + 1) * width if last + 1 <= len(rates) - n else len(rates) * width


def transient(before: list[float], after: list[float], steady: list[float], width: float = 0.1,
              target: float = TARGET, window_s: float = WINDOW_S) -> Transient:
    """A change's figures from its bins (bytes each): `before` (the seconds before it),
    `after` (the seconds after it, each judged) and `steady` (the new point's steady seconds,
    after `after`)."""
    rate = lambda b: b * 8 / width  # noqa: E731 - bytes per bin -> bit/s
    steady_after = statistics.fmean(rate(b) for b in steady) if steady else float("nan")
    rates, old = [rate(b) for b in after], [rate(b) for b in before]
    return Transient(
        steady_before=statistics.fmean(rate(b) for b in before) if before else float("nan"),
        steady_after=steady_after,
        t90_s=time_to(rates, target * steady_after, width, window_s),
        lowest=min(rates) if rates else float("nan"),
        bytes_after=float(sum(after)),
        lowest_before=min(rate(b) for b in before) if before else float("nan"),
        short_before=float(time_to(old, target * statistics.fmean(old), width, window_s) > 0) if old else float("nan"),
    )


@dataclass(frozen=True)
class Spread:
    """A figure over repetitions: median, lowest, highest, count."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        values = [v for v in values if v == v]  # NaN: a repetition without the figure
        if not values:
            return cls(float("nan"), float("nan"), float("nan"), 0)
        return cls(statistics.median(values), min(values), max(values), len(values))


FIGURES = ("t90_s", "lowest", "bytes_after", "steady_before", "steady_after", "lowest_before", "short_before")
# the resolution below which two figures are the same: a 100 ms bin's time, and 2 % of a rate
# or byte count (the counter is sampled every 10-20 ms, and bins are interpolated)
SLACK = {"t90_s": 0.1, "lowest": 0.02, "bytes_after": 0.02, "steady_before": 0.02, "steady_after": 0.02,
         "lowest_before": 0.02, "short_before": 0.0}


def summarise(transients: list[Transient]) -> dict[str, Spread]:
    """Each figure's spread over repetitions."""
    return {name: Spread.of([getattr(t, name) for t in transients]) for name in FIGURES}


def beyond(reference: Spread, other: Spread, figure: str) -> bool:
    """Whether `other`'s median lies outside `reference`'s range (netem's run-to-run spread),
    widened by the figure's resolution (SLACK: absolute for times, relative for rates/bytes)."""
    if reference.n == 0 or other.n == 0:
        return False
    slack = SLACK.get(figure, 0.0)
    if figure.endswith("_s"):
        low, high = reference.low - slack, reference.high + slack
    else:
        low, high = reference.low * (1 - slack), reference.high * (1 + slack)
    return not low <= other.median <= high


def steps_from(rates_bps: list[float], step_bytes: float, width: float = 0.1) -> list[tuple[float, float]]:
    """(start, duration) of back-to-back steps that each move `step_bytes` through a flow whose
    rate per bin of `width` s was `rates_bps` (from the first bin's start): a job that only
    communicates, as a launch's steps would see the trace."""
    steps, moved, start, t = [], 0.0, 0.0, 0.0
    for rate in rates_bps:
        left = rate / 8 * width
        while left > 0:
            need = (len(steps) + 1) * step_bytes - moved
            if need > left:
                moved += left
                break
            moved += need
            left -= need
            end = t + width * (1 - left / (rate / 8 * width))
            steps.append((start, end - start))
            start = end
        t += width
    return steps


def settle_end(steps: list[tuple[float, float]], decide, floor_s: float) -> float | None:
    """When a launch's settle (`decide(after, elapsed_s, durations)`: experiment/settling.py's
    rule) lets the first measured step start on these steps: that step's start, s after the
    change; None if it never does within them."""
    durations: list[float] = []
    for k, (start, duration) in enumerate(steps, start=1):
        if decide(k, start, durations + [duration], floor_s) is not None:
            return start
        durations.append(duration)
    return None
