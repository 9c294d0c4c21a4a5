"""What makes a point's mean step uncertain: per run of a results folder, the step times'
spread, their correlation, the batch-means interval at several batch counts, slow steps and
how regularly they come, and how the level drifts over the window; with --coverage, whether
each run's interval covered the next repetition's mean.

    .venv/bin/python bench/step_noise.py RESULTS_DIR [--slow 1.5] [--block 10]
    .venv/bin/python bench/step_noise.py RESULTS_DIR --coverage

Reads runs/*.json (and results.csv) only (no root, no testbed). Columns: n (the chief's
measured steps), mean step, cv (sd / mean of single steps), acf1-3 (autocorrelation at lags
1-3), ±batches (the 95 % batch-means half-width with stats.batch_count(n) batches: what
--precision judges), ±10 and ±5 (with 10 and 5 longer batches: wider than ±batches when the
level drifts slowly), slow (steps over
--slow x the median) and their median spacing in seconds (about 10.3 s under bbr: its
PROBE_RTT), drift (the range of --block-second means, % of the mean) and the step_cv that the
run's interval implies (what --dry-run's estimate assumes, experiment.estimate.row_cv).

--coverage (a folder whose points were repeated, --repeat N; report.coverage): per point, of
the pairs of consecutive repetitions, how many times run i's 95 % interval (its recorded
step_time_ci_pct) covered run i+1's mean step, with a 95 % Wilson interval of that fraction;
the run-to-run sd of the mean step and the runs' mean half-width (% of the mean step), and
their ratio; then all points together. An honest interval covers the next run's mean 83 % of
the time (two runs' means differ by sqrt(2) standard errors) with a ratio of 0.51.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netbench import stats  # noqa: E402
from netbench.report import coverage as cover  # noqa: E402


def chief_steps(record: dict) -> list[dict]:
    """The chief's measured step events (worker 0; ps: the coordinator), in order."""
    role = "coordinator" if record.get("strategy") == "ps" else "worker"
    steps = [e for e in record.get("events", ()) if e.get("event") == "step" and e.get("phase") == "measured"
             and e.get("role", "worker") == role and e.get("worker", 0) == 0]
    return sorted(steps, key=lambda e: e["start"])


def acf(values: list[float], lag: int) -> float:
    mean, n = statistics.fmean(values), len(values)
    c0 = sum((v - mean) ** 2 for v in values) / n
    if c0 == 0 or lag >= n:
        return 0.0
    return sum((values[i] - mean) * (values[i + lag] - mean) for i in range(n - lag)) / n / c0


def batch_width(values: list[float], batches: int) -> float | None:
    """The 95 % t half-width over `batches` equal consecutive batch means, % of the mean."""
    n = len(values)
    if batches < 2 or n < 2 * batches:
        return None
    edges = [i * n // batches for i in range(batches + 1)]
    means = [statistics.fmean(values[edges[i]:edges[i + 1]]) for i in range(batches)]
    t = stats.t_critical(0.95, batches - 1)
    return 100 * t * statistics.stdev(means) / math.sqrt(batches) / statistics.fmean(values)


def describe(record: dict, slow_factor: float, block_s: float) -> dict | None:
    steps = chief_steps(record)
    durations = [e["duration"] for e in steps]
    if len(durations) < 2 * stats.MIN_BATCHES:
        return None
    n, mean = len(durations), statistics.fmean(durations)
    median = statistics.median(durations)
    slow = [e["start"] for e in steps if e["duration"] > slow_factor * median]
    gaps = [b - a for a, b in zip(slow, slow[1:])]
    blocks: dict[int, list[float]] = {}
    for e in steps:
        blocks.setdefault(int((e["start"] - steps[0]["start"]) // block_s), []).append(e["duration"])
    block_means = [statistics.fmean(v) for k, v in sorted(blocks.items()) if len(v) >= 3]
    width = stats.relative_half_width(stats.batch_means_interval(durations))
    cv_eff = None if width is None else width * math.sqrt(n) / stats.t_critical(0.95, stats.batch_count(n) - 1)
    return {"run_id": record.get("run_id"), "profile": (record.get("profile") or {}).get("name", "?"), "n": n,
            "mean_ms": 1000 * mean, "cv": statistics.stdev(durations) / mean,
            "acf": [acf(durations, k) for k in (1, 2, 3)],
            "ci_sqrt_pct": None if width is None else 100 * width,
            "ci_10_pct": batch_width(durations, 10), "ci_5_pct": batch_width(durations, 5),
            "slow": len(slow), "slow_gap_s": statistics.median(gaps) if gaps else None,
            "drift_pct": 100 * (max(block_means) - min(block_means)) / mean if len(block_means) > 1 else None,
            "step_cv": cv_eff, "precision_reached": record.get("precision_reached")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--slow", type=float, default=1.5, help="a slow step: over this x the median")
    parser.add_argument("--block", type=float, default=10.0, help="seconds per block of the drift column")
    parser.add_argument("--json", action="store_true", help="one JSON object per run instead of the table")
    parser.add_argument("--coverage", action="store_true",
                        help="per repeated point: how often a run's interval covered the next run's mean")
    args = parser.parse_args(argv)
    paths = sorted((args.results_dir / "runs").glob("*.json"))
    if not paths:
        print(f"{args.results_dir}: no runs/*.json", file=sys.stderr)
        return 2
    if args.coverage:
        return print_coverage(args.results_dir, paths, args.json)

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}%"

    print("run    profile               n   mean ms    cv   acf1  acf2  acf3 ±batches   ±10      ±5 slow  gap s"
          "  drift step_cv reached")
    for path in paths:
        try:
            row = describe(json.loads(path.read_text(encoding="utf-8")), args.slow, args.block)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"{path}: not a run record: {exc}", file=sys.stderr)
            return 2
        if row is None:
            continue
        if args.json:
            print(json.dumps(row))
            continue
        gap = "-" if row["slow_gap_s"] is None else f"{row['slow_gap_s']:.2f}"
        print(f"{row['run_id']:<6} {row['profile'][:20]:<20} {row['n']:>4} {row['mean_ms']:>8.1f} {row['cv']:>6.3f} "
              + " ".join(f"{a:+.2f}" for a in row["acf"])
              + f" {pct(row['ci_sqrt_pct']):>7} {pct(row['ci_10_pct']):>7} {pct(row['ci_5_pct']):>7} {row['slow']:>4}"
              f" {gap:>6} {pct(row['drift_pct']):>7} "
              + ("-" if row["step_cv"] is None else f"{row['step_cv']:.3f}").rjust(7)
              + f" {row['precision_reached']}")
    return 0


def read_rows(results_dir: Path) -> dict[str, dict]:
    """results.csv's rows by run id ({} without the file)."""
    try:
        with open(results_dir / "results.csv", newline="", encoding="utf-8") as f:
            return {row.get("run_id", ""): row for row in csv.DictReader(f)}
    except FileNotFoundError:
        return {}


def print_coverage(results_dir: Path, paths: list[Path], as_json: bool) -> int:
    """The coverage study (report.coverage) of a folder's repeated points."""
    rows, runs = read_rows(results_dir), []
    for path in paths:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            run = cover.run_mean(record, rows.get(str(record.get("run_id"))))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            print(f"{path}: not a run record: {exc}", file=sys.stderr)
            return 2
        if run is not None:
            runs.append(run)
    points = cover.coverage(runs)
    if not points:
        print(f"{results_dir}: no point with two ok runs or more (sweep with --repeat N)", file=sys.stderr)
        return 2

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}%"

    if not as_json:
        print("point                          runs pairs covered  fraction (95 % Wilson)"
              "   run-to-run sd  within ±  ratio")
    for p in [*points, cover.overall(points)]:
        low, high = stats.wilson_interval(p.covered, p.pairs, 0.95)
        if as_json:
            print(json.dumps({"point": p.point, "runs": p.runs, "pairs": p.pairs, "covered": p.covered,
                              "fraction": p.fraction, "fraction_low": low, "fraction_high": high,
                              "run_to_run_pct": p.run_to_run_pct, "within_pct": p.within_pct, "ratio": p.ratio}))
            continue
        fraction = "-" if p.fraction is None else f"{p.fraction:.2f} ({low:.2f}-{high:.2f})"
        ratio = "-" if p.ratio is None else f"{p.ratio:.2f}"
        print(f"{p.point[:30]:<30} {p.runs:>4} {p.pairs:>5} {p.covered:>7}  {fraction:<22} {pct(p.run_to_run_pct):>13}"
              f" {pct(p.within_pct):>9} {ratio:>6}")
    if not as_json:
        print(f"an honest interval covers the next run's mean {cover.EXPECTED_COVERAGE:.0%} of the time "
              f"(ratio {cover.EXPECTED_RATIO:.2f}); overall: the pairs summed, the points' sd as their "
              "root mean square")
    return 0


if __name__ == "__main__":
    sys.exit(main())
