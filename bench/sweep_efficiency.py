#!/usr/bin/env python3
"""How much of a sweep's wall time is measurement? One launch per point against launches.

For a results folder: the sum of its runs' measured windows (per ok run, the chief's first
measured step's start to its last measured step's end) over the sweep's wall time (the
manifest's started..ended; without them, the first run's start to the last run's end), as a
share. Everything else is start-up, warm-up, settling, calibration and the controller: a
second table gives those fixed costs per folder (`fixed_costs`: calibration, and whether it
was reused; start-ups; settles; least windows; precision extensions; and the windows that ran
to the --max-seconds cap short of their precision, with the cap's share of the wall time).

Usage::

    .venv/bin/python bench/sweep_efficiency.py RESULTS [RESULTS ...] [--json PATH]
    .venv/bin/python bench/sweep_efficiency.py --run [--latency 1,10,50ms --bandwidth 100mbit,1gbit]

With --run (root, TensorFlow; what ``make bench`` does) it runs the sweep on the embedded
testbed once per mode in --modes, into a fresh folder each: ``isolate`` (a launch per point),
``launch`` (the default: launches whose every change narrows the path, ``--order descending``)
and ``random`` (one launch per job configuration, points shuffled), and reports each folder's share of wall time
measured and, per point, each mode's images/sec against the first folder's (the bias a shared
launch may carry). Every sweep runs at the same ``--precision`` (default 2%: each point's window goes
on until its mean step time is known to 2 %), and the report gives each folder's wall time against
the first folder's and how many points reached the precision: the issue's figure is launches'
wall time over --isolate's at equal precision, with every point within 10 % of its --isolate value.
Exit status: 0 done, 2 could not run, 130 interrupted.
"""

from __future__ import annotations

import argparse
import csv
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
    costs = fixed_costs(records, manifest)
    reached = [r.get("precision_reached") for r in records if r.get("status") == "ok"]
    return {"results": str(results), "points": len(records), "ok": sum(r.get("status") == "ok" for r in records),
            "launches": len(records) if launches == {None} else len(launches),
            "wall_s": round(wall, 2), "measured_s": round(measured, 2),
            "share": round(measured / wall, 4) if wall > 0 else None,
            "precision_reached": sum(r is True for r in reached) if any(r is not None for r in reached) else None,
            "ci_pct_max": max((r["step_time_ci_pct"] for r in records if r.get("step_time_ci_pct") is not None),
                              default=None),
            **costs, "cap_share": round(costs["cap_s"] / wall, 4) if wall > 0 else None}


def _chief_steps(record: dict) -> list[dict]:
    role = "coordinator" if record.get("strategy") == "ps" else "worker"
    return sorted((e for e in record.get("events", ()) if e.get("event") == "step" and e.get("phase") == "measured"
                   and e.get("role", "worker") == role and e.get("worker", 0) == 0), key=lambda e: e["start"])


def fixed_costs(records: list[dict], manifest: dict) -> dict:
    """Where a folder's wall time went (seconds): the calibrations (0 when reused), the start-ups
    (a launch's first point, or a point of its own: its record's time before its measured
    window: processes, warm-up, the first settle), the settles of later points in a launch
    (settle_s), the least windows (each ok point's first --steps measured steps), the windows'
    precision extensions past them, and of those windows the ones that stopped at the cap short
    of their precision (`cap_s`, whole windows: what a lossy or noisy point costs). Step events
    carry the host's monotonic clock, records Unix time: only differences of each are used."""
    least_steps = int((manifest.get("job") or {}).get("steps") or 0)
    calibration = manifest.get("calibration") or {}
    reused = sum(bool(v.get("reused")) for kind in ("collective", "compute") for v in (calibration.get(kind) or {}).values())
    reused += bool((calibration.get("exchange") or {}).get("reused"))
    first_of: dict = {}
    for record in sorted(records, key=lambda r: r.get("started", 0)):
        if record.get("launch") is not None:
            first_of.setdefault(record["launch"], record["run_id"])
    startup = settle = least = extension = cap = 0.0
    for record in records:
        steps = _chief_steps(record)
        window = steps[-1]["end"] - steps[0]["start"] if steps else 0.0
        if record.get("launch") is None or first_of.get(record["launch"]) == record["run_id"]:
            startup += max(0.0, (record.get("ended") or 0.0) - (record.get("started") or 0.0) - window)
        else:
            settle += record.get("settle_s") or 0.0
        if record.get("status") != "ok" or not steps:
            continue
        head = steps[:least_steps] if least_steps else steps
        least_s = head[-1]["end"] - steps[0]["start"]
        least += least_s
        extension += window - least_s
        if record.get("precision_reached") is False:
            cap += window
    return {"calibration_s": round(float(calibration.get("seconds") or 0.0), 2), "calibrations_reused": reused,
            "startup_s": round(startup, 2), "settle_s": round(settle, 2), "least_window_s": round(least, 2),
            "extension_s": round(extension, 2), "cap_s": round(cap, 2)}


MODES = {"isolate": ["--isolate"], "launch": ["--launch"], "random": ["--launch", "--order", "random"]}


def per_point(results: Path) -> dict[str, float]:
    """images/sec of each ok point by profile name (a mean over its repetitions)."""
    rates: dict[str, list[float]] = {}
    with open(results / "results.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["status"] == "ok" and row["images_per_sec"]:
                rates.setdefault(row["profile"], []).append(float(row["images_per_sec"]))
    return {name: sum(v) / len(v) for name, v in rates.items()}


def run_sweeps(args) -> list[Path]:
    """The sweep once per mode in args.modes, each into its own fresh folder."""
    out = Path(tempfile.mkdtemp(prefix="netbench-sweep-efficiency-"))
    folders = []
    for name in args.modes.split(","):
        if name not in MODES:
            raise ValueError(f"--modes: unknown mode {name!r} (use {', '.join(MODES)})")
        extra = MODES[name]
        folder = out / name
        cmd = [sys.executable, "-m", "netbench.cli", "sweep", "--latency", args.latency,
               *(["--bandwidth", args.bandwidth] if args.bandwidth else []), "--output", str(folder), *extra,
               "--precision", args.precision, "--max-seconds", str(args.max_seconds)]
        print("$", " ".join(cmd), flush=True)
        started = time.monotonic()
        subprocess.run(cmd, check=True, cwd=ROOT)
        print(f"  {time.monotonic() - started:.1f} s", flush=True)
        folders.append(folder)
    return folders


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="*", type=Path, help="results folders")
    parser.add_argument("--run", action="store_true", help="run the sweep once per mode, then report")
    parser.add_argument("--modes", default="isolate,launch", help="with --run: modes in order, of "
                        + ", ".join(MODES))
    parser.add_argument("--latency", default="1,10,50ms")
    parser.add_argument("--bandwidth", default="100mbit,1gbit", help="'' for none (make demo's sweep: "
                        "--latency 1,10,100ms --bandwidth '')")
    parser.add_argument("--precision", default="2%", help="with --run: every sweep's --precision [2%%]")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="with --run: every sweep's --max-seconds [60]")
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
    print(f"{'results':40} {'points':>6} {'launches':>8} {'wall s':>8} {'x first':>7} {'measured s':>10} "
          f"{'share':>6} {'reached':>7} {'max ±%':>6}")
    for row in rows:
        share = "-" if row["share"] is None else f"{row['share']:.0%}"
        row["wall_vs_first"] = round(row["wall_s"] / rows[0]["wall_s"], 3) if rows[0]["wall_s"] else None
        reached = "-" if row["precision_reached"] is None else f"{row['precision_reached']}/{row['ok']}"
        widest = "-" if row["ci_pct_max"] is None else f"{row['ci_pct_max']:.1f}"
        print(f"{row['results'][-40:]:40} {row['points']:>6} {row['launches']:>8} {row['wall_s']:>8.1f} "
              f"{row['wall_vs_first'] or 0:>7.2f} {row['measured_s']:>10.1f} {share:>6} {reached:>7} {widest:>6}")
    print(f"\nfixed costs (s) beside the wall time; 'cap': windows that stopped at --max-seconds short of "
          f"their precision, and their share of the wall time:")
    print(f"{'results':40} {'wall':>7} {'calib':>6} {'reused':>6} {'start-ups':>9} {'settles':>7} "
          f"{'least win':>9} {'extension':>9} {'cap':>7} {'cap %':>6}")
    for row in rows:
        share = "-" if row["cap_share"] is None else f"{row['cap_share']:.0%}"
        print(f"{row['results'][-40:]:40} {row['wall_s']:>7.1f} {row['calibration_s']:>6.1f} "
              f"{row['calibrations_reused']:>6} {row['startup_s']:>9.1f} {row['settle_s']:>7.1f} "
              f"{row['least_window_s']:>9.1f} {row['extension_s']:>9.1f} {row['cap_s']:>7.1f} {share:>6}")
    points = [per_point(folder) for folder in args.results]
    names = sorted({n for p in points for n in p}, key=lambda n: [int("".join(c for c in part if c.isdigit()) or 0)
                                                                    for part in n.split("-")])
    if len(points) > 1 and names:
        print(f"\nimages/sec per point, and against {args.results[0].name}:")
        print(f"{'point':24}" + "".join(f" {folder.name[-12:]:>20}" for folder in args.results))
        for name in names:
            base = points[0].get(name)
            cells = []
            for p in points:
                value = p.get(name)
                ratio = f" ({value / base:.2f})" if value and base else ""
                cells.append(f" {('-' if value is None else f'{value:.1f}') + ratio:>20}")
            print(f"{name:24}" + "".join(cells))
    for row, p in zip(rows, points):
        row["images_per_sec"] = {n: round(v, 2) for n, v in p.items()}
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
