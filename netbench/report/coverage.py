"""Whether a run's own interval says where the next run of its point lands (pure).

For every design point run more than once (``--repeat N``), and each pair of consecutive
repetitions, whether run i's 95 % batch-means interval of its mean step time (as recorded:
``step_time_ci_pct``, else from the chief's measured steps) covered run i+1's mean step; and
the run-to-run standard deviation of the mean step against the runs' mean half-width.
bench/step_noise.py --coverage prints it for a results folder.

What an honest interval gives: two runs' means differ by sqrt(2) of one run's standard error,
so run i's 95 % interval (1.96 standard errors each side) covers run i+1's mean with
probability P(|Z| <= 1.96 / sqrt(2)) = 0.83 (EXPECTED_COVERAGE), and the run-to-run standard
deviation is about the half-width / 1.96 (ratio 0.51, EXPECTED_RATIO). Less coverage, or a
larger ratio, says the runs differ by more than their steps show (what a run's start-up, its
placement or its TCP state add), which no longer window takes away: repetitions do.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Iterable, Mapping, Sequence

from netbench import stats
from netbench.report.load import record_factors

EXPECTED_COVERAGE = 2 * NormalDist().cdf(NormalDist().inv_cdf(0.975) / math.sqrt(2)) - 1  # 0.834
EXPECTED_RATIO = 1 / NormalDist().inv_cdf(0.975)  # 0.510


@dataclass(frozen=True)
class RunMean:
    """One ok run's mean step (s) and its interval's half-width (s; None: it has none)."""

    run_id: str
    point: tuple[tuple[str, Any], ...]  # the profile's name and every factor's level
    repeat: int
    mean_s: float
    half_s: float | None


@dataclass(frozen=True)
class PointCoverage:
    """How a point's runs' intervals covered the next run's mean: `covered` of `pairs`."""

    point: str
    runs: int
    pairs: int  # consecutive repetitions whose first run has an interval
    covered: int
    run_to_run_pct: float | None  # sd of the runs' mean steps, % of their mean (None: one run)
    within_pct: float | None  # the runs' mean half-width, % of their mean step (None: no interval)

    @property
    def fraction(self) -> float | None:
        return self.covered / self.pairs if self.pairs else None

    @property
    def ratio(self) -> float | None:
        """Run-to-run sd over the mean within-run half-width (an honest interval: about 0.51)."""
        if self.run_to_run_pct is None or not self.within_pct:
            return None
        return self.run_to_run_pct / self.within_pct


def chief_durations(record: Mapping[str, Any]) -> list[float]:
    """The chief's measured step durations (worker 0; ps: the coordinator), in order."""
    role = "coordinator" if record.get("strategy") == "ps" else "worker"
    steps = [e for e in record.get("events", ()) if e.get("event") == "step" and e.get("phase") == "measured"
             and e.get("role", "worker") == role and e.get("worker", 0) == 0]
    return [float(e["duration"]) for e in sorted(steps, key=lambda e: e["start"])]


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def run_mean(record: Mapping[str, Any], row: Mapping[str, Any] | None = None) -> RunMean | None:
    """An ok run's mean step (its stats' mean_s, else its chief's measured steps') and its
    interval's half-width as recorded: step_time_ci_pct (the record's, else its results.csv
    `row`'s) of the mean, else the batch-means interval of the chief's measured steps. None
    for a run that is not ok or measured no step."""
    if record.get("status") != "ok":
        return None
    durations = None
    mean = _number((record.get("stats") or {}).get("mean_s"))
    if mean is None:
        durations = chief_durations(record)
        if not durations:
            return None
        mean = statistics.fmean(durations)
    pct = _number(record.get("step_time_ci_pct")) or _number((row or {}).get("step_time_ci_pct"))
    if pct is not None:
        half = pct / 100 * mean
    else:
        durations = chief_durations(record) if durations is None else durations
        half = stats.batch_means_interval(durations).half_width if durations else None
    point = (("profile", (record.get("profile") or {}).get("name", "")), *record_factors(record))
    return RunMean(run_id=str(record.get("run_id", "?")), point=point, repeat=int(record.get("repeat", 0)),
                   mean_s=mean, half_s=half)


def point_coverage(runs: Sequence[RunMean], label: str = "") -> PointCoverage:
    """One point's runs (any order): each consecutive pair of repetitions, whether the first's
    interval covered the second's mean; the spread of their means against their half-widths."""
    ordered = sorted(runs, key=lambda r: r.repeat)
    pairs = [(a, b) for a, b in zip(ordered, ordered[1:]) if a.half_s is not None]
    covered = sum(1 for a, b in pairs if abs(b.mean_s - a.mean_s) <= a.half_s)
    means = [r.mean_s for r in ordered]
    centre = statistics.fmean(means) if means else 0.0
    halves = [r.half_s for r in ordered if r.half_s is not None]
    spread = 100 * statistics.stdev(means) / centre if len(means) > 1 and centre > 0 else None
    within = 100 * statistics.fmean(halves) / centre if halves and centre > 0 else None
    return PointCoverage(point=label, runs=len(ordered), pairs=len(pairs), covered=covered,
                         run_to_run_pct=spread, within_pct=within)


def coverage(runs: Iterable[RunMean]) -> list[PointCoverage]:
    """Every point with two runs or more, in the order its first run comes; each labelled by its
    profile's name and the factors whose levels differ between the points."""
    by_point: dict[tuple, list[RunMean]] = {}
    for run in runs:
        by_point.setdefault(run.point, []).append(run)
    keys = list(by_point)
    varying = [i for i in range(len(keys[0]) if keys else 0) if len({k[i][1] for k in keys}) > 1 or i == 0]

    def label(key: tuple) -> str:
        parts = [str(key[i][1]) if i == 0 else f"{key[i][0]}={key[i][1]}" for i in varying]
        return " ".join(p for p in parts if p) or "-"

    return [point_coverage(group, label(key)) for key, group in by_point.items() if len(group) > 1]


def overall(points: Sequence[PointCoverage]) -> PointCoverage:
    """All points together: pairs and covered summed; the run-to-run sd and the half-width as
    root mean square and mean over the points that have them."""
    spreads = [p.run_to_run_pct for p in points if p.run_to_run_pct is not None]
    withins = [p.within_pct for p in points if p.within_pct is not None]
    return PointCoverage(point="overall", runs=sum(p.runs for p in points), pairs=sum(p.pairs for p in points),
                         covered=sum(p.covered for p in points),
                         run_to_run_pct=math.sqrt(statistics.fmean(s * s for s in spreads)) if spreads else None,
                         within_pct=statistics.fmean(withins) if withins else None)
