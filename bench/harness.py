"""Is netbench's measured step the step users run? netbench's worker beside a bare loop.

On a 2-node embedded testbed (``netbench testbed up --nodes 2``), at each one-way delay
(``netbench apply --latency``; default 1ms and 10ms), runs in turn, for ``--rounds`` rounds:

* bare: bench/bare_mwms.py, a plain MultiWorkerMirroredStrategy custom loop with one
  compiled step (MLP 784-512-512-10, batch 64 per worker, synthetic data, SGD 0.01);
* fused: ``netbench sweep --latency D`` itself, the path a user's sweep takes: its own
  testbed, the controller reading every step event, the live view drawing on a terminal (a
  pseudo-terminal here, so rich refreshes it as on a user's), one launch with the default
  fused step, ``--precision off`` so its window is the bare loop's step count;
* split: the worker alone with ``--step split`` (two compiled functions per step, as before
  the fused step) started as the runner starts it, unless ``--no-split``.

bare and split are 2 processes started in the testbed's namespaces as netbench's runner
starts them (netbench.proc.spawn with TF_CONFIG of both nodes' addresses, a fresh port each
run); the testbed is brought up for them and taken down before the sweep (which brings up its
own, at the same delay). All have the same warm-up and measured step counts. The figure of a
run is worker 0's mean measured step times (netbench: its measured step events; bare: what it
prints). Reported per
delay: mean step time of each over the rounds, and netbench/bare of each round's mean step
(mean and min-max over rounds), with the same of each round's median step beside it (less
moved by load from elsewhere on the machine; the load average is printed too).

It refuses to run if a netbench testbed is already up (someone else's); ``netbench
reset`` removes everything in ``finally``. Run as root, under the shared lock:

    flock /tmp/netbench-root.lock .venv/bin/python bench/harness.py [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NETBENCH = Path(os.environ.get("NETBENCH", REPO / ".venv" / "bin" / "netbench"))  # NETBENCH=...: another install
BARE = Path(__file__).resolve().parent / "bare_mwms.py"
TARGET = 0.02  # netbench within 2 % of the bare loop


def run(*args: str) -> str:
    done = subprocess.run([str(NETBENCH), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"netbench {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    return done.stdout


def nodes() -> list[dict]:
    return json.loads(run("testbed", "show", "--json"))["nodes"]


def argv_of(variant: str, args: argparse.Namespace) -> list[str]:
    window = ["--batch-size", str(args.batch_size), "--warmup", str(args.warmup), "--steps", str(args.steps)]
    if variant == "bare":
        return [sys.executable, str(BARE), *window]
    from netbench.model.job import JobSpec, worker_argv
    job = JobSpec(strategy="allreduce", model="mlp", batch_size=args.batch_size, warmup=args.warmup,
                  steps=args.steps)
    return [*worker_argv(job, sys.executable), *(["--step", "split"] if variant == "split" else [])]


def step_times(variant: str, stdout: str) -> list[float]:
    """Worker 0's measured step times (seconds) from its stdout."""
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if variant == "bare":
        return [float(d) for d in lines[-1]["durations_s"]]
    steps = [e["duration"] for e in lines if e.get("event") == "step" and e.get("phase") == "measured"]
    if not steps:
        raise RuntimeError(f"no measured steps: {stdout[-500:]}")
    return steps


def sweep_run(delay: str, args: argparse.Namespace, log: Path) -> list[float]:
    """`netbench sweep --latency DELAY` with its live view on a pseudo-terminal; the chief's
    measured step times (s) from its run record."""
    import pty
    import tempfile
    import threading

    out = Path(tempfile.mkdtemp(prefix="netbench-harness-")) / "results"
    argv = [str(NETBENCH), "sweep", "--latency", delay, "--workers", "2", "--batch-size", str(args.batch_size),
            "--warmup", str(args.warmup), "--steps", str(args.steps), "--precision", "off", "--output", str(out)]
    master, slave = pty.openpty()
    sink = open(log, "ab")

    def drain() -> None:  # what a terminal would show, kept in the log
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            sink.write(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, timeout=args.timeout,
                              env={**os.environ, "COLUMNS": "160", "TERM": "xterm"})
    finally:
        os.close(slave)
        reader.join(timeout=5)
        os.close(master)
        sink.close()
    if done.returncode != 0:
        raise RuntimeError(f"netbench sweep exited with {done.returncode} (log: {log})")
    try:
        record = json.loads((out / "runs" / "r000.json").read_text())
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)
    steps = sorted((e for e in record["events"] if e.get("event") == "step" and e.get("phase") == "measured"
                    and e.get("worker", 0) == 0 and e.get("role", "worker") == "worker"), key=lambda e: e["step"])
    if not steps:
        raise RuntimeError(f"netbench sweep measured no steps (log: {log})")
    return [float(e["duration"]) for e in steps]


def one_run(variant: str, bed: list[dict], args: argparse.Namespace, log: Path) -> list[float]:
    """Start both tasks in their namespaces with TF_CONFIG; worker 0's measured steps in seconds."""
    from netbench import proc
    port = random.randint(20000, 40000)
    cluster = [f"{n['address']}:{port}" for n in bed]
    argv = argv_of(variant, args)
    procs = []
    try:
        for index, node in enumerate(bed):
            tf_config = json.dumps({"cluster": {"worker": cluster}, "task": {"type": "worker", "index": index}})
            env = {"TF_CONFIG": tf_config, "PYTHONUNBUFFERED": "1", "PYTHONPATH": proc.child_pythonpath()}
            with open(log, "ab") as err:
                procs.append(proc.spawn(argv, netns=node["netns"], env=env, stdout=subprocess.PIPE, stderr=err))
        outs = [p.communicate(timeout=args.timeout)[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    for p in procs:
        if p.returncode != 0:
            raise RuntimeError(f"{variant} exited with {p.returncode} (log: {log})")
    return step_times(variant, outs[0])


def on_sigterm(*_: object) -> None:
    raise KeyboardInterrupt


def summarise(runs: dict[str, list[list[float]]]) -> dict:
    """Per variant: mean step over all rounds, each round's mean and median (ms), and against
    bare, per round: the ratio of means (the figure) and of medians (less moved by a burst of
    load from elsewhere on the machine)."""
    means = {v: [statistics.mean(r) for r in rs] for v, rs in runs.items()}
    medians = {v: [statistics.median(r) for r in rs] for v, rs in runs.items()}
    out: dict = {v: {"mean_step_ms": 1000 * statistics.mean(means[v]),
                     "rounds_mean_ms": [1000 * x for x in means[v]],
                     "rounds_median_ms": [1000 * x for x in medians[v]]} for v in runs}
    for v in runs:
        if v != "bare":
            for key, per in (("ratio", means), ("median_ratio", medians)):
                ratios = [a / b for a, b in zip(per[v], per["bare"])]
                out[v][key] = {"mean": statistics.mean(ratios), "min": min(ratios), "max": max(ratios),
                               "rounds": ratios}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delays", default="1ms,10ms", help="one-way delays [1ms,10ms]")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of bare, fused, split [3]")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64, help="per worker [64]")
    parser.add_argument("--no-split", action="store_true", help="leave out netbench's --step split")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run [300]")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("error: run as root (namespaces): flock /tmp/netbench-root.lock .venv/bin/python bench/harness.py",
              file=sys.stderr)
        return 2
    if nodes():
        print("error: a netbench testbed is already up (someone else's?); not touching it", file=sys.stderr)
        return 2
    variants = ["bare", "fused"] + ([] if args.no_split else ["split"])
    signal.signal(signal.SIGTERM, on_sigterm)
    log = Path(f"/tmp/netbench-bench-harness-{os.getpid()}.log")
    results: dict = {"workers": 2, "model": "mlp", "batch_size": args.batch_size, "warmup": args.warmup,
                     "steps": args.steps, "rounds": args.rounds, "delays": {}}
    started = time.monotonic()
    results["load_before"] = os.getloadavg()
    try:
        for delay in args.delays.split(","):
            times: dict[str, list[list[float]]] = {v: [] for v in variants}
            for r in range(args.rounds):
                for v in variants:
                    if v == "fused":
                        times[v].append(sweep_run(delay, args, log))
                    else:
                        run("testbed", "up", "--nodes", "2")
                        run("apply", "--latency", delay)
                        try:
                            times[v].append(one_run(v, nodes(), args, log))
                        finally:
                            run("reset")
                    print(f"{delay} round {r + 1}: {v} mean {1000 * statistics.mean(times[v][-1]):.2f} ms, "
                          f"median {1000 * statistics.median(times[v][-1]):.2f} ms", file=sys.stderr, flush=True)
            results["delays"][delay] = summarise(times)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        subprocess.run([str(NETBENCH), "reset"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results["runtime_s"] = round(time.monotonic() - started, 1)
    results["load_after"] = os.getloadavg()
    print(f"2 workers, mlp, batch {args.batch_size}/worker, {args.warmup} warm-up + {args.steps} measured steps, "
          f"{args.rounds} rounds ({', '.join(variants)} in turn); mean step of worker 0")
    print(f"{'delay':>6} {'variant':>7} {'step ms':>9} {'netbench/bare':>14} {'min-max':>13} "
          f"{'medians':>8} {'min-max':>13}")
    for delay, figures in results["delays"].items():
        for v in variants:
            f = figures[v]
            cells = ""
            if "ratio" in f:
                r, m = f["ratio"], f["median_ratio"]
                cells = (f"{r['mean']:>14.3f} {r['min']:>6.3f}-{r['max']:.3f} "
                         f"{m['mean']:>8.3f} {m['min']:>6.3f}-{m['max']:.3f}")
            print(f"{delay:>6} {v:>7} {f['mean_step_ms']:>9.2f} {cells}")
    print(f"load average before {results['load_before'][0]:.2f}, after {results['load_after'][0]:.2f} "
          f"({os.cpu_count()} CPUs)")
    fused = [f["fused"]["ratio"]["mean"] for f in results["delays"].values()]
    print(f"target: fused within {100 * TARGET:.0f} % of bare: "
          + ("met" if all(abs(r - 1) <= TARGET for r in fused) else "NOT met"))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
