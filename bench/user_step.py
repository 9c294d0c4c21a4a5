#!/usr/bin/env python3
"""Does netbench measure a user's DDP loop as the loop measures itself?

A plain PyTorch DDP loop over gloo (the loop of examples/torch_ddp.py) reports its steps with
netbench.track and also times itself, independently, the way a user would: the wall time
from one iteration's start to the next (time.perf_counter, its step, netbench's bookkeeping
and the stop check included), written to its stderr log one line per step. One sweep
(``netbench sweep --latency LIST --workers 2 -- python <this loop>``) runs it; for each point
this compares, over the same measured step numbers, netbench's mean step time (results.csv
``step_time_mean_s``) with the loop's own mean, side by side. Done when they agree within 2 %.

Usage (root, torch installed; hold the shared testbed lock on a shared machine)::

    .venv/bin/python bench/user_step.py [--latency 1,20ms] [--steps 50] [--json PATH]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LOOP = '''
import os, sys, time
import torch, torch.distributed as dist
from torch import nn
from netbench import track

torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
ddp = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
step, last = 0, time.perf_counter()
while True:
    with track.step(images=64):
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    stop = track.stop_requested()
    now = time.perf_counter()
    print(f"own {step} {now - last:.9f}", file=sys.stderr, flush=True)
    step, last = step + 1, now
    if stop:
        break
dist.destroy_process_group()
sys.stderr.flush()
os._exit(0)  # as examples/torch_ddp.py ends: gloo's threads may abort a finalizing Python
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", default="1,20ms")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "ddp_loop.py", Path(tmp) / "out"
        job.write_text(LOOP)
        subprocess.run([sys.executable, "-m", "netbench.cli", "sweep", "--latency", args.latency, "--workers", "2",
                        "--warmup", "5", "--steps", str(args.steps), "--output", str(out), "--", sys.executable,
                        str(job)], check=True, cwd=ROOT)
        own = {}
        for log in out.glob("logs/launch*/n1-worker0.log"):
            for m in re.finditer(r"^own (\d+) ([\d.]+)$", log.read_text(), re.M):
                own[(log.parent.name, int(m.group(1)))] = float(m.group(2))
        rows = []
        for row in csv.DictReader(open(out / "results.csv", newline="")):
            record = json.loads((out / "runs" / f"{row['run_id']}.json").read_text())
            steps = [e["step"] for e in record["events"]
                     if e["event"] == "step" and e["phase"] == "measured" and e.get("worker") == 0]
            launch = f"launch{int(row['launch']):03d}"
            mine = [own[(launch, s)] for s in steps if (launch, s) in own]
            netbench_s = float(row["step_time_mean_s"])
            own_s = sum(mine) / len(mine)
            rows.append({"delay_ms": float(row["delay_ms"]), "steps": len(mine), "netbench_step_s": netbench_s,
                         "loop_own_step_s": own_s, "ratio": netbench_s / own_s})
    for r in rows:
        print(f"delay {r['delay_ms']:g} ms: netbench {r['netbench_step_s'] * 1000:.3f} ms, loop's own "
              f"{r['loop_own_step_s'] * 1000:.3f} ms over {r['steps']} steps, ratio {r['ratio']:.4f} "
              f"({'within' if abs(r['ratio'] - 1) <= 0.02 else 'OUTSIDE'} 2 %)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
