"""Step events -> images/sec and step-time statistics (pure).

Warm-up steps are kept in the records but excluded here. Throughput is the global batch
over the mean measured step time (total images / total time), which weights every step
by its duration as a long run would.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

MAD_TO_SIGMA = 1.4826  # scales the median absolute deviation to a normal's sigma


@dataclass(frozen=True)
class StepStats:
    """Statistics of measured step times (seconds) and the throughput they imply."""

    steps: int
    mean_s: float
    median_s: float
    p90_s: float
    stderr_s: float
    jitter_s: float  # 1.4826 x MAD: a robust spread
    images_per_sec: float
    images_per_sec_stderr: float


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100] (numpy's default method)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def mad_jitter(values: Sequence[float]) -> float:
    med = statistics.median(values)
    return MAD_TO_SIGMA * statistics.median(abs(v - med) for v in values)


def step_stats(durations: Sequence[float], images_per_step: int) -> StepStats:
    """Summarise measured step durations (s) for a global batch of `images_per_step`."""
    if not durations:
        raise ValueError("no measured steps")
    if any(d <= 0 for d in durations):
        raise ValueError("step durations must be positive")
    n = len(durations)
    mean = statistics.fmean(durations)
    stderr = statistics.stdev(durations) / math.sqrt(n) if n > 1 else 0.0
    ips = images_per_step / mean
    # delta method: d(B/m) = B/m^2 dm
    ips_stderr = images_per_step * stderr / (mean * mean)
    return StepStats(steps=n, mean_s=mean, median_s=statistics.median(durations),
                     p90_s=percentile(durations, 90), stderr_s=stderr, jitter_s=mad_jitter(durations),
                     images_per_sec=ips, images_per_sec_stderr=ips_stderr)


def measured_durations(events: Iterable[dict]) -> list[float]:
    """Durations of the measured (non-warm-up) step events, in step order."""
    steps = [e for e in events if e.get("event") == "step" and e.get("phase") == "measured"]
    return [float(e["duration"]) for e in sorted(steps, key=lambda e: e["step"])]
