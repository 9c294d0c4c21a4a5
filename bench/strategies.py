"""Training modes against bandwidth: throughput, speed-up over single, scaling efficiency.

Runs `netbench sweep` once per strategy over the same bandwidth levels (each sweep brings
up and takes down its own testbed, so run it on an otherwise idle machine, under the
namespace lock), then prints one table from the results folders:

    flock /tmp/netbench-ns.lock .venv/bin/python bench/strategies.py --bandwidth 20,100,1000mbit

speed-up = images/sec / single's images/sec; scaling efficiency = images/sec /
(workers x single's images/sec). The ± column is the step-level standard error that
netbench records; confidence intervals over repetitions come from `netbench report`.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

STRATEGIES = (("single", ()), ("allreduce", ()), ("allreduce-accum", ("--accum-steps", "4")),
              ("ps", ("--ps", "1")))


def sweep(out: Path, strategy: str, extra: tuple[str, ...], args: argparse.Namespace) -> list[dict]:
    argv = [sys.executable, "-m", "netbench.cli", "sweep", "--strategy", strategy, *extra,
            "--model", args.model, "--batch-size", str(args.batch_size), "--warmup", str(args.warmup),
            "--steps", str(args.steps), "--output", str(out)]
    if strategy != "single":
        argv += ["--workers", str(args.workers), "--bandwidth", args.bandwidth]
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{strategy} sweep failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    with open(out / "results.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bandwidth", default="20,100,1000mbit", help="levels, as netbench sweep takes them")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="netbench-bench-") as tmp:
        rows = {name: sweep(Path(tmp) / name, name, extra, args) for name, extra in STRATEGIES}
    single = float(rows["single"][0]["images_per_sec"])
    print(f"model {args.model}, batch {args.batch_size}/worker, {args.workers} workers, "
          f"{args.warmup} warm-up + {args.steps} measured steps; single: {single:.1f} images/s")
    print(f"{'strategy':<16}{'rate':>10}{'images/s':>11}{'±':>8}{'idle':>7}{'speed-up':>10}{'efficiency':>12}  status")
    for name, _ in STRATEGIES[1:]:
        for row in rows[name]:
            ips = float(row["images_per_sec"] or 0)
            idle = f"{float(row['idle_ratio']):.2f}" if row["idle_ratio"] else "-"
            print(f"{name:<16}{row['rate_mbit'] + 'M':>10}{ips:>11.1f}{float(row['images_per_sec_stderr'] or 0):>8.1f}"
                  f"{idle:>7}{ips / single:>10.2f}{ips / (args.workers * single):>12.2f}  {row['status']}")


if __name__ == "__main__":
    main()
