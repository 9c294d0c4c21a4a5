"""ps-sync with and without backup workers, one worker slowed: images/sec and test accuracy.

Two clusters run side by side on loopback (so both see the same load): a parameter server and
W workers each, worker W-1 slowed by SLOW seconds per gradient (a step delay, as `--step-delay`
gives a node: a slower accelerator), one with --backup-workers B and one
without. Each trains a fresh model on Fashion-MNIST and evaluates it on the held-out set.
images/sec is what results.csv reports: images a step applies (ps-sync: W batches; with B
backup workers W - B) over worker 0's mean measured step.

    .venv/bin/python bench/backup_workers.py --workers 3 --backup 1 --slow 0.08 --train-steps 200

No root, no namespaces: the processes talk over 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from netbench.jobs import accuracy, events as ev  # noqa: E402
from netbench.jobs import exchange, stragglers  # noqa: E402
from netbench.jobs.harness import step_delay  # noqa: E402
from netbench.model.job import JobSpec, images_per_step  # noqa: E402

def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def start(backup: int, args: argparse.Namespace, out: Path) -> list[subprocess.Popen]:
    ports = free_ports(args.workers + 1)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports[:-1]], "ps": [f"127.0.0.1:{ports[-1]}"]}
    argv = ["--strategy", "ps-sync", "--model", "mlp", "--batch-size", str(args.batch_size), "--warmup",
            str(args.warmup), "--train-steps", str(args.train_steps), "--eval-every", str(args.train_steps),
            "--data", "fashion-mnist", "--seed", "1", "--backup-workers", str(backup)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), exchange.TOKEN_ENV: f"backup-bench-{backup}"}  # the run's token
    procs = []
    roles = [("ps", 0)] + [("worker", i) for i in range(args.workers)]
    for role, index in roles:
        config = json.dumps({"cluster": cluster, "task": {"type": role, "index": index}})
        slow = (role, index) == ("worker", args.workers - 1)
        delay = {step_delay.ENV_SECONDS: str(args.slow)} if slow else {}  # a step delay, as --step-delay gives
        with open(out / f"b{backup}-{role}{index}.out", "w") as stdout, \
                open(out / f"b{backup}-{role}{index}.err", "w") as stderr:
            procs.append(subprocess.Popen([sys.executable, "-m", "netbench.jobs.worker", *argv], stdout=stdout,
                                          stderr=stderr, env={**env, **delay, "TF_CONFIG": config}, text=True))
    return procs


def summarise(backup: int, args: argparse.Namespace, out: Path) -> dict:
    events = []
    for index in range(args.workers):
        for line in (out / f"b{backup}-worker{index}.out").read_text().splitlines():
            event = ev.parse_line(line)
            if event is not None:
                events.append(ev.received(event, index, "worker", 0.0))
    job = JobSpec(strategy="ps-sync", batch_size=args.batch_size, backup_workers=backup, warmup=args.warmup,
                  train_steps=args.train_steps)
    durations = [e.duration for e in events if isinstance(e, ev.Step) and e.worker == 0 and e.measured]
    found = stragglers.attribute(events, job, [f"n{i + 1}" for i in range(args.workers)], backup_workers=backup)
    scored = accuracy.summarise(events, job)
    return {"backup_workers": backup, "images_per_sec": images_per_step(job, args.workers) * len(durations)
            / sum(durations), "step_mean_s": sum(durations) / len(durations), "test_accuracy": scored.test_accuracy,
            "straggler": found.straggler_node if found else None,
            "dropped": [r.dropped for r in found.ranks] if found else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--backup", type=int, default=1)
    parser.add_argument("--slow", type=float, default=0.08, help="seconds added to each gradient of the last worker")
    parser.add_argument("--train-steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="netbench-backup-"))
    runs = {b: start(b, args, out) for b in (0, args.backup)}
    try:
        for procs in runs.values():
            for proc in procs[1:]:
                if proc.wait(timeout=900) != 0:
                    print(f"a worker failed: see {out}", file=sys.stderr)
                    return 1
    finally:
        for procs in runs.values():
            for proc in procs:
                proc.kill()
                proc.wait()
    rows = [summarise(b, args, out) for b in (0, args.backup)]
    for row in rows:
        print(json.dumps(row))
    print(f"images/sec with {args.backup} backup worker(s) / without: "
          f"{rows[1]['images_per_sec'] / rows[0]['images_per_sec']:.2f}x (measured side by side, at "
          f"{time.strftime('%H:%M:%S')}, under whatever load the machine had)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
