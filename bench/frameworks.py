"""TensorFlow's MultiWorkerMirroredStrategy against PyTorch's DistributedDataParallel (gloo) on the
same grid and model: step time, images/sec and idleness, side by side.

Writes a playbook with ``framework`` as a factor crossed with the latency (and bandwidth)
levels and runs it with ``netbench run --isolate`` (each run its own launch, so each ends
with the calibration steps that split computation from communication: the idleness column).
The runs of both frameworks are interleaved in a random order (seeded), so load from
elsewhere on the machine falls on both alike; still, figures on a shared machine are noisy:
compare the ratio of one run, not figures of different runs. The playbook's runs bring up and
take down their own testbed: run it as root, under the namespace lock:

    flock /tmp/netbench-testbed.lock .venv/bin/python bench/frameworks.py --latency 1,20ms --steps 10

Columns per grid point and framework: mean step time (mean over repetitions of each run's mean
measured step), images/sec, idle (communication's share of a calibration step's time), then
torch/tf = torch's images/sec over TensorFlow's. Exit status 1 when a run did not end ok.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FRAMEWORKS = ("tensorflow", "torch")


def playbook(args: argparse.Namespace) -> dict:
    """The design: framework x the grid, as `netbench run` takes it."""
    factors: dict = {"framework": list(FRAMEWORKS), "latency": args.latency.split(",")}
    if args.bandwidth:
        factors["bandwidth"] = args.bandwidth.split(",")
    levels = factors["latency"]
    unit = "".join(c for c in levels[-1] if c.isalpha())  # "1,20ms": the unit of the last level
    factors["latency"] = [level if level[-1].isalpha() else level + unit for level in levels]
    return {"name": "frameworks-bench", "factors": factors,
            "fixed": {"strategy": "allreduce", "model": args.model, "batch": args.batch_size, "workers": 2},
            "repetitions": args.repeat, "order": "random", "seed": args.seed, "warmup": args.warmup,
            "steps": args.steps}


def run(args: argparse.Namespace, folder: Path) -> list[dict]:
    """Run the design; returns results.csv's rows."""
    path = folder / "frameworks.yaml"
    path.write_text(json.dumps(playbook(args)))  # JSON is YAML
    argv = [sys.executable, "-m", "netbench.cli", "run", str(path), "--isolate", "--output", str(folder / "out")]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
    if result.returncode != 0:
        raise SystemExit(f"netbench run failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    with open(folder / "out" / "results.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def summarise(rows: list[dict]) -> list[dict]:
    """One entry per grid point and framework: means over its ok repetitions."""
    points: dict[tuple, dict] = {}
    for row in rows:
        key = (float(row["delay_ms"]), row["rate_mbit"], row["framework"])
        entry = points.setdefault(key, {"delay_ms": key[0], "rate_mbit": key[1], "framework": key[2],
                                        "step_s": [], "images_per_sec": [], "idle": [], "failed": 0})
        if row["status"] != "ok":
            entry["failed"] += 1
            continue
        entry["step_s"].append(float(row["step_time_mean_s"]))
        entry["images_per_sec"].append(float(row["images_per_sec"]))
        if row["idle_ratio"]:
            entry["idle"].append(float(row["idle_ratio"]))
    out = []
    for key in sorted(points, key=lambda k: (k[0], k[1], k[2])):
        entry = points[key]
        out.append({**entry, **{name: statistics.fmean(entry[name]) if entry[name] else None
                                for name in ("step_s", "images_per_sec", "idle")}})
    return out


def table(summary: list[dict]) -> list[str]:
    def cell(value, fmt):
        return "-" if value is None else format(value, fmt)

    lines = [f"{'delay':>8}{'rate':>8}  {'framework':<11}{'step ms':>9}{'images/s':>10}{'idle':>6}{'torch/tf':>10}"]
    by_point: dict[tuple, dict] = {}
    for entry in summary:
        by_point.setdefault((entry["delay_ms"], entry["rate_mbit"]), {})[entry["framework"]] = entry
    for (delay, rate), frameworks in by_point.items():
        tf, torch = frameworks.get("tensorflow"), frameworks.get("torch")
        ratio = (torch["images_per_sec"] / tf["images_per_sec"]
                 if tf and torch and tf["images_per_sec"] and torch["images_per_sec"] else None)
        for name in FRAMEWORKS:
            entry = frameworks.get(name)
            if entry is None:
                continue
            step_ms = None if entry["step_s"] is None else entry["step_s"] * 1000
            last = cell(ratio, ".2f") if name == "torch" else ""
            failed = f"  ({entry['failed']} not ok)" if entry["failed"] else ""
            lines.append(f"{delay:>6g}ms{(rate + 'M') if rate else '-':>8}  {name:<11}{cell(step_ms, '.1f'):>9}"
                         f"{cell(entry['images_per_sec'], '.1f'):>10}{cell(entry['idle'], '.2f'):>6}{last:>10}{failed}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", default="1,10,50ms", help="one-way delays, as netbench sweep takes them")
    parser.add_argument("--bandwidth", default="", help="rates to cross with them, e.g. 100,1000mbit")
    parser.add_argument("--model", default="mlp", choices=("mlp", "cnn", "resnet18"))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=2, help="repetitions of each point and framework")
    parser.add_argument("--seed", type=int, default=22, help="seed of the interleaved run order")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="netbench-frameworks-") as tmp:
        rows = run(args, Path(tmp))
    summary = summarise(rows)
    print(f"model {args.model}, batch {args.batch_size}/worker, 2 workers, strategy allreduce, {args.warmup} warm-up + "
          f"{args.steps} measured steps, {args.repeat} repetition(s) per point, interleaved (seed {args.seed})")
    print("\n".join(table(summary)))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 1 if any(entry["failed"] for entry in summary) else 0


if __name__ == "__main__":
    sys.exit(main())
