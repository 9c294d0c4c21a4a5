"""A precision's least window, simulated: how often a window's final 95 % interval covers the
true mean step, and how many steps it took, for step series of known mean under the window's
own checks (stats.steps_to_precision from the least window on, as a launch's PointWindow and
the workers' extend_for_precision run them), with netbench's least window (stats.least_steps:
8 batch means of 4 steps) against a fixed 30-step one cut into floor(sqrt(n)) batches, and
64 steps under floor(sqrt(n)).

    .venv/bin/python bench/least_window.py [--reps 500] [--seed 1]

Pure (no root, no testbed, no TensorFlow); about a minute at the default reps on one core.
Series: steps of mean 1 with coefficient of variation cv, lag-1 autocorrelation rho (AR(1)),
and optionally a share of slow steps (x3: a heavy tail, as a rare retransmission or bbr's
PROBE_RTT gives). Columns: coverage (final interval holds the true mean; 0.95 is nominal, and
stopping at the first narrow enough interval costs some), err>P (the window's mean is off by
more than the precision it claimed), mean and median steps.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netbench import stats  # noqa: E402

LONGEST = 3000  # steps: a window still short of its precision here counts as capped


def series(rng: random.Random, cv: float, rho: float, slow: float) -> tuple[list[float], float]:
    """LONGEST steps and their true mean."""
    out, x = [], rng.gauss(0, 1)
    scale = math.sqrt(1 - rho * rho)
    for _ in range(LONGEST):
        step = 1 + cv * x
        out.append(3 * step if slow and rng.random() < slow else step)
        x = rho * x + scale * rng.gauss(0, 1)
    return out, 1 + 2 * slow


def sqrt_batches(n: int) -> int:
    """floor(sqrt(n)) batches, at least 4 (netbench's rule before its least window)."""
    return 0 if n < 2 * stats.MIN_BATCHES else max(stats.MIN_BATCHES, math.isqrt(n))


@contextmanager
def batch_rule(rule):
    if rule is None:
        yield
        return
    with mock.patch.object(stats, "batch_count", rule):
        yield


def window(steps: list[float], least: int, precision: float) -> tuple[int, stats.Interval]:
    """The steps a window takes from `least` on, and its final interval."""
    n = least
    while n < len(steps):
        need = stats.steps_to_precision(steps[:n], precision, elapsed_s=0.0, max_seconds=1e12)
        if need == 0:
            break
        n = min(len(steps), n + need)
    return n, stats.batch_means_interval(steps[:n])


SCENARIOS = (  # name, cv, rho, share of slow steps, precision
    ("independent, cv 0.10, 2 %", 0.10, 0.0, 0.0, 0.02),
    ("rho 0.2, cv 0.10, 2 %", 0.10, 0.2, 0.0, 0.02),
    ("rho 0.5, cv 0.05, 2 %", 0.05, 0.5, 0.0, 0.02),
    ("rho -0.3, cv 0.10, 3 %", 0.10, -0.3, 0.0, 0.03),
    ("quiet, cv 0.04, 2 %", 0.04, 0.0, 0.0, 0.02),
    ("quieter, cv 0.02, 2 %", 0.02, 0.0, 0.0, 0.02),
    ("3 % slow steps x3, cv 0.05, 3 %", 0.05, 0.0, 0.03, 0.03),
)
CONFIGS = (  # name, least window, batch rule (None: netbench's batch_count)
    ("least_steps (8 x 4), batch_count", stats.least_steps(0.02), None),
    ("fixed 30, floor(sqrt(n))", 30, sqrt_batches),
    ("fixed 64, floor(sqrt(n))", 64, sqrt_batches),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=500, help="series per scenario")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    for name, cv, rho, slow, precision in SCENARIOS:
        print(f"== {name}")
        draws = [series(rng, cv, rho, slow) for _ in range(args.reps)]
        for config, least, rule in CONFIGS:
            covered = off = 0
            taken = []
            with batch_rule(rule):
                for steps, true_mean in draws:
                    n, interval = window(steps, least, precision)
                    taken.append(n)
                    covered += interval.low is not None and interval.low <= true_mean <= interval.high
                    off += abs(interval.mean - true_mean) > precision * true_mean
            print(f"  {config:<36} coverage {covered / args.reps:.3f}  err>P {off / args.reps:.3f}  "
                  f"mean {statistics.fmean(taken):6.1f}  median {statistics.median(taken):6.0f} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
