#!/usr/bin/env python3
"""How long do the shipped designs take? --dry-run's estimate, checked on scaled-down runs.

For each big design (playbooks/network-grid.yaml, playbooks/accumulation.yaml) it writes a
scaled-down playbook (fewer levels, 1 repetition, fewer steps; `SCALED`) into a temporary
folder, estimates it (netbench.experiment.estimate, the figures `netbench run --dry-run`
prints), runs it for real with this checkout's netbench (with --lock FILE, under
``flock FILE``: a machine shared by several users serializes its testbeds so) and reports measured / estimated wall time. Then it
prints the full design's estimate in both modes, with the default costs and with costs
calibrated from the scaled-down run (Costs.from_results).

Usage::

    .venv/bin/python bench/design_time.py                    # both designs, --launch
    .venv/bin/python bench/design_time.py --lock /tmp/netbench-root.lock
    .venv/bin/python bench/design_time.py --mode isolate --design accumulation
    .venv/bin/python bench/design_time.py --estimate-only    # no run, no root

Exit status: 0 done, 2 could not run, 130 interrupted.
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

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from netbench.experiment.estimate import Costs, estimate_design  # noqa: E402
from netbench.experiment.launch import Settle  # noqa: E402
from netbench.model import design, playbook as pb  # noqa: E402

# What each design keeps in its scaled-down run: every kind of factor, fewer levels.
SCALED = {
    "network-grid": {"factors": {"latency": ["1ms", "10ms"], "bandwidth": ["1000mbit"], "loss": ["0%", "1%"],
                                 "workers": [1], "model": ["mlp", "mobilenetv2"], "batch_size": [8]},
                     "warmup": 2, "steps": 5},
    "accumulation": {"factors": {"model": ["mlp", "mobilenetv2"], "batch_size": [32], "workers": [1, 2],
                                 "strategy": ["allreduce", "allreduce-accum"]},
                     "warmup": 2, "steps": 5},
}


def scaled_playbook(source: Path, folder: Path) -> Path:
    """The design with SCALED's levels, 1 repetition and fewer steps, written into `folder`."""
    text = yaml.safe_load(source.read_text(encoding="utf-8"))
    scale = SCALED[text["name"]]
    text.update(name=text["name"] + "-scaled", repeat=1, factors=scale["factors"],
                warmup=scale["warmup"], steps=scale["steps"])
    text.pop("description", None)
    path = folder / f"{text['name']}.yaml"
    path.write_text(yaml.safe_dump(text, sort_keys=False), encoding="utf-8")
    return path


def estimate(path: Path, isolate: bool, costs: Costs):
    book = pb.load_playbook(path)
    runs = design.expand(book, book.seed or 0)
    return estimate_design(runs, isolate, Settle(), costs, book.step_timeout_s)


def figures(est) -> dict:
    return {"runs": est.runs, "launches": len(est.launches), "process_starts": est.process_starts,
            "wall_s": round(est.wall_s, 1), "startup_s": round(est.startup_s, 1), "settle_s": round(est.settle_s, 1),
            "measured_s": round(est.measured_s, 1), "other_s": round(est.other_s, 1),
            "measured_share": round(est.measured_share, 3), "timeouts": est.timeouts}


def run_for_real(path: Path, output: Path, mode: str, lock: Path | None) -> dict:
    """`netbench run` (under `lock`); the wall time of the command and of the manifest."""
    cmd = (["flock", str(lock)] if lock else []) + [sys.executable, "-m", "netbench.cli", "run", str(path), "--output", str(output),
           f"--{mode}"]
    print("$", " ".join(cmd), flush=True)
    started = time.monotonic()  # includes the wait for the lock: the manifest's figure does not
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - started
    manifest = json.loads((output / "manifest.json").read_text())
    return {"command_s": round(wall, 1), "sweep_s": round(manifest["ended"] - manifest["started"], 1)}


def reused(output: Path) -> dict:
    manifest = json.loads((output / "manifest.json").read_text())
    return {"command_s": None, "sweep_s": round(manifest["ended"] - manifest["started"], 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--design", choices=sorted(SCALED), action="append", help="default: both")
    parser.add_argument("--mode", choices=["launch", "isolate"], default="launch")
    parser.add_argument("--estimate-only", action="store_true", help="estimate the designs; run nothing")
    parser.add_argument("--reuse", type=Path, metavar="DIR",
                        help="take the measured figures from an earlier run's folder (DIR/<design>-results) "
                             "instead of running again")
    parser.add_argument("--lock", type=Path, help="run each scaled-down design under flock LOCK")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    out: dict = {}
    try:
        if not args.estimate_only and not args.reuse and os.geteuid() != 0:
            print("running the scaled-down designs needs root (or give --estimate-only)", file=sys.stderr)
            return 2
        folder = args.reuse or Path(tempfile.mkdtemp(prefix="netbench-design-time-"))
        for name in args.design or sorted(SCALED):
            source = ROOT / "playbooks" / f"{name}.yaml"
            scaled = folder / f"{name}-scaled.yaml" if args.reuse else scaled_playbook(source, folder)
            row = out[name] = {"mode": args.mode}
            row["scaled_estimate"] = figures(estimate(scaled, args.mode == "isolate", Costs()))
            costs = Costs()
            if not args.estimate_only:
                results = folder / f"{name}-results"
                row["scaled_measured"] = reused(results) if args.reuse else run_for_real(scaled, results, args.mode,
                                                                                          args.lock)
                row["ratio"] = round(row["scaled_measured"]["sweep_s"] / row["scaled_estimate"]["wall_s"], 3)
                costs = Costs.from_results(results)
                row["scaled_recalibrated"] = figures(estimate(scaled, args.mode == "isolate", costs))
            for isolate in (False, True):
                mode = "isolate" if isolate else "launch"
                row[f"full_{mode}"] = figures(estimate(source, isolate, Costs()))
                if not args.estimate_only:
                    row[f"full_{mode}_calibrated"] = figures(estimate(source, isolate, costs))
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError, subprocess.CalledProcessError, pb.PlaybookError) as exc:
        print(f"could not run: {exc}", file=sys.stderr)
        return 2
    report(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


def report(out: dict) -> None:
    for name, row in out.items():
        print(f"\n{name} (scaled-down, --{row['mode']}): estimated {row['scaled_estimate']['wall_s']:.1f} s "
              f"for {row['scaled_estimate']['runs']} runs in {row['scaled_estimate']['launches']} launch(es)")
        if "scaled_measured" in row:
            measured = row["scaled_measured"]
            print(f"  measured {measured['sweep_s']:.1f} s (the manifest's start to end); "
                  f"measured / estimated = {row['ratio']:.2f}; re-estimated from its own results: "
                  f"{row['scaled_recalibrated']['wall_s']:.1f} s")
        for key in ("full_launch", "full_isolate", "full_launch_calibrated", "full_isolate_calibrated"):
            if key in row:
                f = row[key]
                print(f"  {key:24} {f['wall_s'] / 3600:7.2f} h  {f['runs']} runs, {f['launches']} launches, "
                      f"start-up {f['startup_s'] / 3600:.2f} h, settle {f['settle_s'] / 3600:.2f} h, measured "
                      f"{f['measured_s'] / 3600:.2f} h ({f['measured_share']:.0%}), other {f['other_s'] / 3600:.2f} h, "
                      f"{f['timeouts']} timeouts")


if __name__ == "__main__":
    sys.exit(main())
