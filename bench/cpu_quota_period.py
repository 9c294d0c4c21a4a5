"""Which CPU-quota period keeps a throttled node's steps even? (the choice of model/compute.py PERIOD_US)

A node at 0.25 CPU runs a loop of CPU-bound "steps" (each a fixed amount of work that takes
about --work-ms on an idle core); for each period the step times' mean, spread (coefficient of
variation) and 10th/90th percentiles are printed. A long period lets a step run at full speed
inside its quota and then stall for the rest of the period, so step times split into fast and
stalled ones; a short period spreads the share evenly.

Run as root from the repository root:
    .venv/bin/python bench/cpu_quota_period.py [--cpus 0.25] [--work-ms 20] [--steps 60]

It makes one group under netbench's parent (emulation/cgroups.py, whichever version this
machine has) and removes it at the end. Timings depend on the machine's load: compare the
periods side by side, in one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from netbench import proc
from netbench.emulation import cgroups
from netbench.model.compute import Quota

CHILD = r"""
import json, sys, time
work, steps = int(sys.argv[1]), int(sys.argv[2])
times = []
for _ in range(steps):
    t0 = time.perf_counter()
    x = 0
    for i in range(work):
        x += i * i
    times.append(time.perf_counter() - t0)
print(json.dumps(times))
"""


def calibrate(work_ms: float) -> int:
    """Loop iterations that take about `work_ms` on this core, unthrottled."""
    n, t0 = 200_000, time.perf_counter()
    x = 0
    for i in range(n):
        x += i * i
    per = (time.perf_counter() - t0) / n
    return max(1, int(work_ms / 1000 / per))


def run(group: str, groups, quota: Quota, work: int, steps: int) -> list[float]:
    groups.set_quota(group, quota)
    child = proc.spawn([sys.executable, "-c", CHILD, str(work), str(steps)], stdout=subprocess.PIPE,
                       cgroup=str(groups.path(group) / "cgroup.procs"))
    out, _ = child.communicate(timeout=600)
    return json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", type=float, default=0.25)
    parser.add_argument("--work-ms", type=float, default=20.0)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--periods-ms", default="100,10,5")
    args = parser.parse_args()
    groups = cgroups.detect()
    group = f"netbench-bench-{__import__('os').getpid()}"
    groups.create(group)
    work = calibrate(args.work_ms)
    rows = []
    try:
        unlimited = run(group, groups, Quota(None, 100_000), work, args.steps)
        rows.append(("unlimited", unlimited))
        for period_ms in (float(p) for p in args.periods_ms.split(",")):
            period = int(period_ms * 1000)
            rows.append((f"{period_ms:g} ms", run(group, groups, Quota(round(args.cpus * period), period), work,
                                                  args.steps)))
    finally:
        groups.remove(group)
    print(f"cgroup v{groups.version}; {args.cpus:g} CPU; a step is {args.work_ms:g} ms of CPU work unthrottled; "
          f"{args.steps} steps each")
    print(f"{'period':>10} {'mean ms':>8} {'cv':>6} {'p10 ms':>8} {'p90 ms':>8} {'max ms':>8}")
    for name, times in rows:
        ms = sorted(t * 1000 for t in times[5:])  # the first steps warm the interpreter
        mean = statistics.fmean(ms)
        cv = statistics.pstdev(ms) / mean
        print(f"{name:>10} {mean:8.1f} {cv:6.2f} {ms[len(ms) // 10]:8.1f} {ms[9 * len(ms) // 10]:8.1f} {ms[-1]:8.1f}")


if __name__ == "__main__":
    main()
