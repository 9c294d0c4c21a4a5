#!/usr/bin/env python3
"""Controller memory and journal reads over a long sweep (no root, no TensorFlow).

Drives the real controller (runner.run_sweep -> launch.run_job -> results store, with the
metrics observer feeding a MetricsState) over a synthetic testbed (tests/fakes/sweep.py):
stand-in workers stream worker-format step events, and each run's profile is applied
through a real Executor and Journal on in-memory adapters. By default 200 runs of 500
measured steps (+10 warm-up) on 2 workers: a 100,000-step sweep, ~204,000 step events.

At checkpoints it reports the controller's Python heap (tracemalloc: current, and peak
since the previous checkpoint), its RSS, the bytes read while applying that run's profile
(the journal lookups), and the wall time per 1,000 steps (informational; tracemalloc slows
everything down). Memory and journal reads should stay flat as the sweep goes on.

Usage::

    .venv/bin/python bench/sweep_memory.py [--runs 200] [--steps 500] [--workers 2] [--json out.json]

Exit status: 0 flat, 1 the heap grew by more than --max-growth-mib from the first
checkpoint to the last.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from netbench.model.job import JobSpec  # noqa: E402
from netbench.state.journal import Journal  # noqa: E402
from netbench.metrics.state import MetricsObserver, MetricsState, ObserverTee  # noqa: E402
from netbench.model.design import RunPlan  # noqa: E402
from netbench.model.profile import Profile  # noqa: E402
from netbench.experiment.runner import SweepConfig, run_sweep  # noqa: E402
from tests.fakes.sweep import SyntheticTestbed  # noqa: E402

MIB = 2**20


def rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        return int(next(line for line in fh if line.startswith("VmRSS:")).split()[1]) * 1024


def bytes_read() -> int:
    with open("/proc/self/io") as fh:
        return int(next(line for line in fh if line.startswith("rchar:")).split()[1])


class Checkpoints:
    """runner.Observer that samples memory after chosen runs."""

    def __init__(self, at: set[int], steps_per_run: int) -> None:
        self.at, self.steps_per_run = at, steps_per_run
        self.rows: list[dict] = []
        self.done = 0
        self.apply_read = 0
        self._since = time.perf_counter()
        self._since_run = 0

    def run_finished(self, run, result) -> None:
        self.done += 1
        if self.done not in self.at:
            return
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        now = time.perf_counter()
        runs = self.done - self._since_run
        self.rows.append({"run": self.done, "steps": self.done * self.steps_per_run,
                          "heap_mib": current / MIB, "heap_peak_mib": peak / MIB, "rss_mib": rss_bytes() / MIB,
                          "apply_read_kib": self.apply_read / 1024,
                          "s_per_1k_steps": (now - self._since) / (runs * self.steps_per_run / 1000)})
        self._since, self._since_run = now, self.done

    def __getattr__(self, name):
        return lambda *args: None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=500, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-growth-mib", type=float, default=8.0)
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()

    at = sorted({1, 2, 5, 10, *range(max(1, args.runs // 8), args.runs + 1, max(1, args.runs // 8)), args.runs})
    checkpoints = Checkpoints(set(at), args.steps)
    with tempfile.TemporaryDirectory(prefix="netbench-bench-") as tmp:
        journal = Journal(Path(tmp) / "state")
        testbed = SyntheticTestbed(journal)
        apply = testbed.apply

        def measured_apply(run, seed):
            before = bytes_read()
            apply(run, seed)
            checkpoints.apply_read = bytes_read() - before

        testbed.apply = measured_apply
        runs = tuple(RunPlan(index=i, profile=Profile(name=f"d{i}", delay_us=1000 + i, jitter_us=100), repeat=1)
                     for i in range(args.runs))
        config = SweepConfig(sweep_id="bench", runs=runs, job=JobSpec(warmup=args.warmup, steps=args.steps),
                             workers=args.workers, output=Path(tmp) / "results")
        observer = ObserverTee(checkpoints, MetricsObserver(MetricsState()))
        tracemalloc.start()
        started = time.perf_counter()
        results = run_sweep(config, observer, testbed=testbed)
        wall = time.perf_counter() - started
        tracemalloc.stop()
        stored = sum(p.stat().st_size for p in (Path(tmp) / "results" / "runs").iterdir())
        journal_bytes = journal.path.stat().st_size if journal.path.exists() else 0
    ok = sum(r.status == "ok" for r in results)
    print(f"sweep: {args.runs} runs x ({args.warmup} warm-up + {args.steps} measured) steps x {args.workers} workers "
          f"= {args.runs * args.steps:,} measured steps, {args.runs * (args.warmup + args.steps) * args.workers:,} "
          f"step events; {ok}/{args.runs} ok in {wall:.1f} s (under tracemalloc); run records on disk "
          f"{stored / MIB:.1f} MiB; journal at the end {journal_bytes / 1024:.1f} KiB")
    print(f"{'after run':>9} {'steps':>9} {'heap MiB':>9} {'peak MiB':>9} {'RSS MiB':>8} {'apply read KiB':>15} "
          f"{'s/1k steps':>10}")
    for row in checkpoints.rows:
        print(f"{row['run']:>9} {row['steps']:>9,} {row['heap_mib']:>9.2f} {row['heap_peak_mib']:>9.2f} "
              f"{row['rss_mib']:>8.1f} {row['apply_read_kib']:>15.1f} {row['s_per_1k_steps']:>10.3f}")
    first, last = checkpoints.rows[0], checkpoints.rows[-1]
    growth = last["heap_mib"] - first["heap_mib"]
    flat = growth <= args.max_growth_mib
    print(f"heap after run {first['run']}: {first['heap_mib']:.2f} MiB, after run {last['run']}: "
          f"{last['heap_mib']:.2f} MiB ({growth:+.2f} MiB): " + ("flat" if flat else "GROWS"))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "wall_s": wall,
                                         "ok_runs": ok, "checkpoints": checkpoints.rows}, indent=2) + "\n")
    return 0 if flat else 1


if __name__ == "__main__":
    sys.exit(main())
