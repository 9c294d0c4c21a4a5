"""All of netbench's statistics, as small pure functions.

Step events -> images/sec and step-time statistics; percentiles and MAD; Student's t and
Welch intervals; intervals that keep to their domain (log-scale t for positive quantities such
as throughput and step time, logit-scale t for shares such as idleness and accuracy); ratios of
geometric means; the Wilson and exact intervals of a proportion; the
tolerance a measured value is judged by. Nothing here has side effects, and scipy (only
for t quantiles) is imported when a quantile is asked for, so it stays an optional extra.

Warm-up steps are kept in the records but excluded here. Throughput is the global batch
over the mean measured step time (total images / total time), which weights every step
by its duration as a long run would.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass
from statistics import NormalDist
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


# ---------------------------------------------------------------- intervals

@dataclass(frozen=True)
class Interval:
    """Mean of n values with a two-sided interval [low, high]; None bounds when n < 2."""

    n: int
    mean: float
    low: float | None
    high: float | None
    confidence: float

    @property
    def half_width(self) -> float | None:
        return None if self.high is None else self.high - self.mean

    def scaled(self, factor: float) -> "Interval":
        """The same interval with mean and bounds multiplied by `factor` (e.g. 100 for %)."""
        scale = lambda v: None if v is None else factor * v  # noqa: E731
        return Interval(n=self.n, mean=factor * self.mean, low=scale(self.low), high=scale(self.high),
                        confidence=self.confidence)


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError("confidence must be between 0 and 1")


def t_quantile(p: float, df: float) -> float:
    """The p quantile of Student's t distribution with df degrees of freedom (needs scipy)."""
    from scipy.stats import t

    return float(t.ppf(p, df))


def t_interval(values: Sequence[float], confidence: float = 0.99) -> Interval:
    """Mean and two-sided t confidence interval: mean +- t(1-a/2, n-1) x s / sqrt(n)."""
    if not values:
        raise ValueError("an interval needs at least one value")
    _check_confidence(confidence)
    n, mean = len(values), statistics.fmean(values)
    if n < 2:
        return Interval(n=n, mean=mean, low=None, high=None, confidence=confidence)
    half = t_quantile(1 - (1 - confidence) / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Interval(n=n, mean=mean, low=mean - half, high=mean + half, confidence=confidence)


MIN_RUNS = 3  # fewer runs than this give no interval a reader can use (see log_t_interval)


def log_t_interval(values: Sequence[float], confidence: float = 0.95, min_n: int = MIN_RUNS) -> Interval:
    """Geometric mean of positive values with a t interval on their logs, mapped back:
    exp(mean log +- t(1-a/2, n-1) x s_log / sqrt(n)). It cannot go below zero and is wider
    above than below, as a throughput's or a step time's spread is. With fewer than `min_n`
    values there are no bounds: with 2 runs t(0.975, 1) = 12.7 standard errors, an interval
    spanning orders of magnitude that tells a reader nothing."""
    if not values:
        raise ValueError("an interval needs at least one value")
    if min(values) <= 0:
        raise ValueError("a log-scale interval needs positive values")
    _check_confidence(confidence)
    logs = [math.log(v) for v in values]
    n, centre = len(logs), statistics.fmean(logs)
    if n < max(2, min_n):
        return Interval(n=n, mean=math.exp(centre), low=None, high=None, confidence=confidence)
    half = t_quantile(1 - (1 - confidence) / 2, n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return Interval(n=n, mean=math.exp(centre), low=math.exp(centre - half), high=math.exp(centre + half),
                    confidence=confidence)


def _expit(z: float) -> float:
    """1 / (1 + e^-z) without overflow at either end."""
    return 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))


def share_interval(values: Sequence[float], confidence: float = 0.95, min_n: int = MIN_RUNS) -> Interval:
    """Mean of shares in [0, 1] (idleness, accuracy) with an interval inside [0, 1]: a t
    interval on the values' logits mapped back when every value lies strictly inside,
    else Student's t interval clipped to [0, 1]. No bounds with fewer than `min_n` values."""
    if not values:
        raise ValueError("an interval needs at least one value")
    if min(values) < 0 or max(values) > 1:
        raise ValueError("shares must lie in [0, 1]")
    _check_confidence(confidence)
    n, mean = len(values), statistics.fmean(values)
    if n < max(2, min_n):
        return Interval(n=n, mean=mean, low=None, high=None, confidence=confidence)
    t = t_quantile(1 - (1 - confidence) / 2, n - 1)
    if 0 < min(values) and max(values) < 1:
        logits = [math.log(v / (1 - v)) for v in values]
        centre, half = statistics.fmean(logits), t * statistics.stdev(logits) / math.sqrt(n)
        low, high = (_expit(centre + d) for d in (-half, half))
    else:
        half = t * statistics.stdev(values) / math.sqrt(n)
        low, high = max(0.0, mean - half), min(1.0, mean + half)
    return Interval(n=n, mean=mean, low=min(low, mean), high=max(high, mean), confidence=confidence)


def geometric_mean(values: Sequence[float]) -> float:
    """The geometric mean of positive values (the centre of a ratio of throughputs)."""
    return statistics.geometric_mean(values)


def ratio_interval(numerator: Sequence[float], denominator: Sequence[float], confidence: float = 0.99,
                   scale: float = 1.0, min_n: int = 2) -> Interval:
    """The ratio of two samples' geometric means (divided by `scale`) with a Welch t interval
    on the difference of their mean logs, so both sides' spread counts; it is positive by
    construction. With fewer than `min_n` (at least 2) values on either side there is no
    interval, only the ratio (one value: its spread is unknown; reports ask for MIN_RUNS)."""
    if not numerator or not denominator or min(numerator) <= 0 or min(denominator) <= 0:
        raise ValueError("a ratio needs positive values on both sides")
    _check_confidence(confidence)
    logs = [[math.log(v) for v in side] for side in (numerator, denominator)]
    centre = statistics.fmean(logs[0]) - statistics.fmean(logs[1]) - math.log(scale)
    n = min(len(numerator), len(denominator))
    if n < max(2, min_n):
        return Interval(n=n, mean=math.exp(centre), low=None, high=None, confidence=confidence)
    terms = [(statistics.variance(side) / len(side), len(side) - 1) for side in logs]
    se2 = sum(v for v, _ in terms)
    if se2 == 0:
        return Interval(n=n, mean=math.exp(centre), low=math.exp(centre), high=math.exp(centre), confidence=confidence)
    df = se2 ** 2 / sum(v ** 2 / d for v, d in terms if v > 0)  # Welch-Satterthwaite
    half = t_quantile(1 - (1 - confidence) / 2, df) * math.sqrt(se2)
    return Interval(n=n, mean=math.exp(centre), low=math.exp(centre - half), high=math.exp(centre + half),
                    confidence=confidence)


def wilson_interval(k: int, n: int, confidence: float = 0.99) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials ((0, 1) when there were none)."""
    if n <= 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    phat = k / n
    denom = 1 + z * z / n
    centre = (phat + z * z / (2 * n)) / denom
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 3e-16
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        for aa in (m * (b - m) * x / ((a - 1 + 2 * m) * (a + 2 * m)),
                   -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1 + 2 * m))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def beta_cdf(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b): the Beta(a, b) distribution's CDF."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def _beta_quantile(q: float, a: float, b: float) -> float:
    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if beta_cdf(mid, a, b) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def clopper_pearson_interval(k: int, n: int, confidence: float = 0.99) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval for k successes in n trials ((0, 1) when there
    were none). Unlike Wilson's, it keeps its coverage for rare events: one ping lost of 50
    is consistent with a 0.2 % loss (Wilson's 99 % interval starts at 0.24 %)."""
    if n <= 0:
        return 0.0, 1.0
    alpha = 1 - confidence
    lo = 0.0 if k <= 0 else _beta_quantile(alpha / 2, k, n - k + 1)
    hi = 1.0 if k >= n else _beta_quantile(1 - alpha / 2, k + 1, n - k)
    return lo, hi


def tolerance(expected: float, floor: float, relative: float) -> float:
    """How far a measurement may stray from `expected`: `relative` of it, at least `floor`."""
    return max(floor, relative * expected)


# ---------------------------------------------------------------- precision of a window

PRECISION_CONFIDENCE = 0.95  # a window's precision: the 95 % interval of its mean step time
MIN_BATCHES = 4  # fewer batch means give no interval (t's tails are too wide to say anything)
# a precision's least window: this many batch means (least_steps says why) ...
LEAST_BATCHES = 8
LEAST_BATCH_STEPS = 4  # ... of at least this many steps each


@functools.lru_cache(maxsize=512)
def t_critical(confidence: float, df: int) -> float:
    """Two-sided Student's t critical value: P(|T| <= t) = confidence with df degrees of
    freedom. Pure (no scipy: workers need it): P(|T| > t) = I_x(df/2, 1/2) with
    x = df / (df + t^2), inverted by bisection; cached, as windows ask for few df."""
    _check_confidence(confidence)
    if df < 1:
        raise ValueError("t needs at least 1 degree of freedom")
    x = _beta_quantile(1 - confidence, df / 2, 0.5)
    return math.sqrt(df * (1 - x) / x)


def batch_count(n: int) -> int:
    """How many batch means n correlated values are cut into: as many batches of
    LEAST_BATCH_STEPS (4) values as fit, up to LEAST_BATCHES (8), and at least MIN_BATCHES (4);
    from 64 values on floor(sqrt(n)), so both the number of batches and their length grow with
    n (batches long enough to be nearly independent, enough of them for a t interval). 0 below
    MIN_BATCHES x 2 values. A precision's least window (least_steps) is 8 batches of 4."""
    if n < 2 * MIN_BATCHES:
        return 0
    return max(MIN_BATCHES, math.isqrt(n), min(LEAST_BATCHES, n // LEAST_BATCH_STEPS))


def batch_means_interval(values: Sequence[float], confidence: float = PRECISION_CONFIDENCE) -> Interval:
    """The mean of `values` (a series in order, e.g. step times) with a batch-means t
    interval: the series is cut into `batch_count(n)` consecutive batches (lengths differ by
    at most one), and the interval is the batch means' t interval around the overall mean.
    Steps that follow each other are correlated (a slow step is often followed by another),
    which makes the plain s/sqrt(n) too narrow; the means of long batches are nearly
    independent. No bounds with fewer than 2 x MIN_BATCHES values."""
    if not values:
        raise ValueError("an interval needs at least one value")
    _check_confidence(confidence)
    n, mean = len(values), statistics.fmean(values)
    b = batch_count(n)
    if b == 0:
        return Interval(n=n, mean=mean, low=None, high=None, confidence=confidence)
    edges = [i * n // b for i in range(b + 1)]
    means = [statistics.fmean(values[edges[i]:edges[i + 1]]) for i in range(b)]
    half = t_critical(confidence, b - 1) * statistics.stdev(means) / math.sqrt(b)
    return Interval(n=n, mean=mean, low=mean - half, high=mean + half, confidence=confidence)


def relative_half_width(interval: Interval) -> float | None:
    """An interval's half-width as a fraction of its mean (None without bounds)."""
    if interval.half_width is None or interval.mean <= 0:
        return None
    return interval.half_width / interval.mean


def steps_to_precision(durations: Sequence[float], precision: float, elapsed_s: float, max_seconds: float,
                       min_steps: int = 2) -> int:
    """How many more steps a measured window of `durations` (s, in order) needs for the 95 %
    batch-means interval of its mean to be within `precision` (a fraction) of the mean; 0 when
    it is, or when the window has lasted `max_seconds` (`elapsed_s` so far). The estimate
    assumes the half-width shrinks as 1/sqrt(n), asks for at least a tenth more steps (each
    check costs a little) and never for more than the time left allows."""
    if not 0 < precision < 1:
        raise ValueError("precision must be a fraction between 0 and 1")
    n = len(durations)
    if n < min_steps:
        return min_steps - n
    if elapsed_s >= max_seconds:
        return 0
    width = relative_half_width(batch_means_interval(durations))
    if width is not None and width <= precision:
        return 0
    if width is None:
        wanted = 2 * MIN_BATCHES - n
    else:
        wanted = math.ceil(n * (width / precision) ** 2) - n
    wanted = max(wanted, math.ceil(n / 10), 1)
    mean = statistics.fmean(durations)
    left = math.ceil((max_seconds - elapsed_s) / mean) if mean > 0 else wanted
    return max(1, min(wanted, left))


def steps_for_precision(cv: float, precision: float, confidence: float = PRECISION_CONFIDENCE) -> int:
    """The fewest steps whose batch-means interval (batch_means_interval) is expected within
    `precision` (a fraction) of the mean, for steps whose coefficient of variation is `cv`,
    widened for correlation (the standard deviation of the mean of n steps is cv / sqrt(n) of
    it): the least n with t(batch_count(n) - 1) x cv / sqrt(n) <= precision. An expectation for
    planning (a dry run's estimate), not a promise: a window's own interval decides."""
    if not 0 < precision < 1:
        raise ValueError("precision must be a fraction between 0 and 1")
    if not cv >= 0 or math.isinf(cv):
        raise ValueError("the coefficient of variation must be a finite number, 0 or more")

    def enough(n: int) -> bool:
        return t_critical(confidence, batch_count(n) - 1) * cv / math.sqrt(n) <= precision

    low = 2 * MIN_BATCHES
    if enough(low):
        return low
    high = low * 2
    while not enough(high):  # both t and 1/sqrt(n) fall with n: one crossing
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def least_steps(precision: float, cv: float | None = None, confidence: float = PRECISION_CONFIDENCE) -> int:
    """The fewest measured steps before a window's first precision check: its least window when
    no --steps is given. The floor is LEAST_BATCHES (8) batch means of LEAST_BATCH_STEPS (4)
    steps, 32 steps; for steps whose coefficient of variation `cv` is known (a dry run's
    estimate) it is what `precision` (a fraction) is expected to need (steps_for_precision)
    where that is more. Nonincreasing in the precision, nondecreasing in cv.

    Why a floor in batch means, and why 8. The interval is t(b-1) x s_b / sqrt(b), and s_b,
    the standard deviation of b batch means, is itself an estimate: its relative standard
    error is about 1/sqrt(2(b-1)), 0.41 with 4 batches, 0.35 with 5 (a fixed 30-step window
    cut into floor(sqrt(n)) batches), 0.27 with 8 and 0.24 with 10. A window stops at the
    first check whose interval lies within the precision, so it stops early exactly when s_b
    came out low by chance (optional stopping), and the fewer the batches the more often: s_b
    falls under 3/4 of its true value with probability 0.31 with 5 batches, 0.21 with 8, 0.17
    with 10. The first extension is sized from that same width (n x (width / precision)^2), so
    a noisy one overshoots too. t's price for estimating s_b shrinks alike: t(4) = 2.78,
    t(7) = 2.36, t(9) = 2.26 against 1.96 for a known one, i.e. 2.0x, 1.46x and 1.33x the
    steps. Past 8 batches both gain little (t(9) / t(7) = 0.96) for a longer floor; below 8
    both grow fast.

    Why 4 steps a batch: batch means must be nearly independent. Of 76 runs in this machine's
    results folders (bench/step_noise.py's acf1), 66 had lag-1 autocorrelations between -0.56
    and +0.23 (median about 0), for which means of 4 consecutive steps are; the rest (0.29-0.94)
    drifted (a schedule, 100 Mbit/s points, capped CPUs) and were mostly noisy, long windows,
    and from 64 steps batch_count lengthens the batches as floor(sqrt(n)). bench/least_window.py simulates
    the window's checks: against a fixed 30-step window under floor(sqrt(n)) this floor keeps
    the final interval's coverage (0.91-0.96 either way; 0.89 both at lag-1 correlation 0.5)
    and takes 15-25 % fewer steps where steps are noisy, 2 more where they are quiet. It guards
    the interval's own error only: a rare slow step (bbr's PROBE_RTT every ~10 s) that a short
    window never saw is in no interval, whatever its length in steps (coverage about 0.6 with
    3 % of steps 3x slow, 0.8 with a 64-step floor); the run-to-run spread shows it
    (bench/step_noise.py --coverage)."""
    if not 0 < precision < 1:
        raise ValueError("precision must be a fraction between 0 and 1")
    floor = LEAST_BATCHES * LEAST_BATCH_STEPS
    if cv is None:
        return floor
    return max(floor, steps_for_precision(cv, precision, confidence))
