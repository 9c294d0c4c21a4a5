"""What makes a point's mean step uncertain: per run of a results folder, the step times'
spread, their correlation, the batch-means interval at several batch counts, slow steps and
how regularly they come, and how the level drifts over the window.

    .venv/bin/python bench/step_noise.py RESULTS_DIR [--slow 1.5] [--block 10]

Reads runs/*.json only (no root, no testbed). Columns: n (the chief's measured steps), mean
step, cv (sd / mean of single steps), acf1-3 (autocorrelation at lags 1-3), ±sqrt (the 95 %
batch-means half-width with floor(sqrt(n)) batches: what --precision judges), ±10 and ±5 (with
10 and 5 longer batches: wider than ±sqrt when the level drifts slowly), slow (steps over
--slow x the median) and their median spacing in seconds (about 10.3 s under bbr: its
PROBE_RTT), drift (the range of --block-second means, % of the mean) and the step_cv that the
run's interval implies (what --dry-run's estimate assumes, experiment.estimate.row_cv).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netbench import stats  # noqa: E402


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
    args = parser.parse_args(argv)
    paths = sorted((args.results_dir / "runs").glob("*.json"))
    if not paths:
        print(f"{args.results_dir}: no runs/*.json", file=sys.stderr)
        return 2

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}%"

    print("run    profile               n   mean ms    cv   acf1  acf2  acf3   ±sqrt     ±10      ±5 slow  gap s"
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


if __name__ == "__main__":
    sys.exit(main())
