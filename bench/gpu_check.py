#!/usr/bin/env python3
"""Does the torch workload on GPUs feel the shaped links? A check for a machine with GPUs.

On a machine with at least 2 GPUs (torch.cuda.device_count()), one sweep of the built-in
torch workload, 2 nodes x 1 GPU each (``--device cuda --gpus-per-node 1``: NCCL, each node's
rank on its own GPU, ``NCCL_HOSTID`` per node so NCCL never uses shared memory or
peer-to-peer copies between the nodes, ``NCCL_IB_DISABLE=1``), at 1 and 20 ms with
``--sample-resources``. It checks that

* both runs are ok;
* images/sec fell from 1 to 20 ms (the all-reduce crossed the delayed link);
* the bytes each node sent over its link per step are within 25 % of the ring all-reduce's
  (model.ranks.internode_bytes of the model's gradient bytes), so NCCL's traffic took the
  shaped interface and not a path around it.

On fewer than 2 GPUs it says so and exits 0 without measuring.

Usage (root)::

    .venv/bin/python bench/gpu_check.py [--model resnet18] [--steps 30] [--output DIR]

Exit status: 0 passed or not measured (fewer than 2 GPUs), 1 a check failed, 2 could not run.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from netbench.jobs import link_check  # noqa: E402
from netbench.model import ranks  # noqa: E402


def gpu_count() -> int:
    """GPUs torch sees here (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def bytes_per_step(record: dict) -> float | None:
    """Bytes each node sent per measured step on its link (jobs/link_check.py), the mean over nodes."""
    found = link_check.node_bytes(record.get("events", []), ranks_per_node=1)
    return sum(n.tx_per_step for n in found) / len(found) if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    found = gpu_count()
    if found < 2:
        print(f"gpu_check: {found} GPU(s) here; the check needs at least 2 (2 nodes x 1 GPU). Not measured.")
        return 0
    out = args.output or Path(tempfile.mkdtemp(prefix="gpu-check-")) / "results"
    command = [sys.executable, "-m", "netbench.cli", "sweep", "--framework", "torch", "--model", args.model,
               "--device", "cuda", "--gpus-per-node", "1", "--workers", "2", "--latency", "1,20ms",
               "--warmup", "5", "--steps", str(args.steps), "--sample-resources", "0.2", "--output", str(out)]
    print("$", " ".join(command))
    result = subprocess.run(command, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if not (out / "results.csv").exists():
        print(f"gpu_check: the sweep wrote no results (exit {result.returncode})")
        return 2
    with open(out / "results.csv", newline="") as fh:
        rows = sorted(csv.DictReader(fh), key=lambda r: float(r["delay_ms"]))
    failures = []
    if [r["status"] for r in rows] != ["ok", "ok"]:
        failures.append(f"statuses {[r['status'] for r in rows]}, errors {[r.get('error') for r in rows]}")
    else:
        fast, slow = (float(r["images_per_sec"]) for r in rows)
        print(f"images/sec: {fast:.1f} at 1 ms, {slow:.1f} at 20 ms")
        if not slow < fast:
            failures.append("images/sec did not fall from 1 to 20 ms")
        for row in rows:
            record = json.loads((out / "runs" / f"{row['run_id']}.json").read_text())
            measured = bytes_per_step(record)
            model_bytes = float(row.get("model_bytes") or 0)
            expected = ranks.internode_bytes("ring", 2, 1, model_bytes)
            print(f"{row['delay_ms']} ms: {measured or 0:,.0f} bytes per node per step on the link, "
                  f"ring all-reduce {expected:,.0f}")
            if measured is None or not ranks.bytes_agree(measured, expected, tolerance=0.25):
                failures.append(f"{row['delay_ms']} ms: bytes on the links {measured} vs {expected:,.0f} expected")
    for failure in failures:
        print("FAILED:", failure)
    print("gpu_check:", "passed" if not failures else "failed", f"(results in {out})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
