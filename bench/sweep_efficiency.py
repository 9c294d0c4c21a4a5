#!/usr/bin/env python3
"""How much of a sweep's wall time is measurement? One launch per point against launches.

For a results folder: the sum of its runs' measured windows (per ok run, the chief's first
measured step's start to its last measured step's end) over the sweep's wall time (the
manifest's started..ended; without them, the first run's start to the last run's end), as a
share. Everything else is start-up, warm-up, settling, calibration and the controller.

Usage::

    .venv/bin/python bench/sweep_efficiency.py RESULTS [RESULTS ...] [--json PATH]
    .venv/bin/python bench/sweep_efficiency.py --run [--latency 1,10,50ms --bandwidth 100mbit,1gbit]

With --run (root, TensorFlow; what ``make bench`` does) it runs the sweep twice on the
embedded testbed, ``--isolate`` (a launch per point, the default) and then ``--launch`` (a launch per job
configuration), into a fresh folder each, and reports both. Exit status: 0 done, 2 could not
run, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def measured_window(record: dict) -> float:
    """Seconds from the chief's first measured step's start to its last one's end (0 if none)."""
    role = "coordinator" if record.get("strategy") == "ps" else "worker"
    steps = [e for e in record.get("events", ()) if e.get("event") == "step" and e.get("phase") == "measured"
             and e.get("role", "worker") == role and e.get("worker", 0) == 0]
    if not steps:
        return 0.0
    return max(e["end"] for e in steps) - min(e["start"] for e in steps)


def efficiency(results: Path) -> dict:
    """The folder's wall time, measured time and their ratio, with its points and launches."""
    records = [json.loads(p.read_text()) for p in sorted((results / "runs").glob("*.json"))]
    manifest_path = results / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    started, ended = manifest.get("started"), manifest.get("ended")
    if not started or not ended:
        started = min(r["started"] for r in records)
        ended = max(r["ended"] for r in records)
    wall = ended - started
    measured = sum(measured_window(r) for r in records if r.get("status") == "ok")
    launches = {r.get("launch") for r in records}
    return {"results": str(results), "points": len(records), "ok": sum(r.get("status") == "ok" for r in records),
            "launches": len(records) if launches == {None} else len(launches),
            "wall_s": round(wall, 2), "measured_s": round(measured, 2),
            "share": round(measured / wall, 4) if wall > 0 else None}


def run_sweeps(args) -> list[Path]:
    """The sweep with --isolate, then with --launch, each into its own fresh folder."""
    out = Path(tempfile.mkdtemp(prefix="netbench-sweep-efficiency-"))
    folders = []
    for name, extra in [("isolate", ["--isolate"]), ("launch", ["--launch"])]:
        folder = out / name
        cmd = [sys.executable, "-m", "netbench.cli", "sweep", "--latency", args.latency,
               "--bandwidth", args.bandwidth, "--output", str(folder), *extra]
        print("$", " ".join(cmd), flush=True)
        started = time.monotonic()
        subprocess.run(cmd, check=True, cwd=ROOT)
        print(f"  {time.monotonic() - started:.1f} s", flush=True)
        folders.append(folder)
    return folders


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="*", type=Path, help="results folders")
    parser.add_argument("--run", action="store_true", help="run the sweep with --isolate and --launch, then report")
    parser.add_argument("--latency", default="1,10,50ms")
    parser.add_argument("--bandwidth", default="100mbit,1gbit")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    try:
        if args.run:
            if os.geteuid() != 0:
                print("--run needs root (it brings up the embedded testbed)", file=sys.stderr)
                return 2
            args.results += run_sweeps(args)
        if not args.results:
            parser.error("give a results folder, or --run")
        rows = [efficiency(folder) for folder in args.results]
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError, subprocess.CalledProcessError) as exc:
        print(f"could not run: {exc}", file=sys.stderr)
        return 2
    print(f"{'results':50} {'points':>6} {'launches':>8} {'wall s':>8} {'measured s':>10} {'share':>6}")
    for row in rows:
        share = "-" if row["share"] is None else f"{row['share']:.0%}"
        print(f"{row['results'][-50:]:50} {row['points']:>6} {row['launches']:>8} {row['wall_s']:>8.1f} "
              f"{row['measured_s']:>10.1f} {share:>6}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
