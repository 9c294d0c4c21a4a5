"""Fixture designs for the report's tests: results folders of run records as the runner
writes them (runs/<id>.json, plus results.csv columns where a test needs them), with
throughputs shaped like the real runs they stand for. Pure: files in a folder the test gives."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Iterable


def record(run_id: str, *, delay_ms: float = 0, rate_mbit: float | None = None, loss_pct: float = 0,
           strategy: str = "allreduce", model: str = "mlp", batch: int = 32, workers: int = 2, repeat: int = 0,
           ips: float | None = 100.0, status: str = "ok", **extra: Any) -> dict:
    """A runs/<id>.json record as the runner writes it (RunResult as a dict); `extra` keys
    are added at the top level (ps, idle_ratio, topology, ...)."""
    rec = {
        "run_id": run_id, "schema_version": 1, "backend": "userspace", "strategy": strategy, "model": model,
        "batch_size": batch, "workers": workers, "repeat": repeat, "warmup_steps": 2, "status": status,
        "error": "" if status == "ok" else "no next step within 1s",
        "profile": {"name": "p", "delay_us": int(delay_ms * 1000), "jitter_us": 0, "loss": loss_pct / 100,
                    "rate_bps": None if rate_mbit is None else int(rate_mbit * 1e6)},
        "stats": None if ips is None else {"images_per_sec": ips, "steps": 5, "mean_s": batch * workers / ips},
        "events": [], "per_worker_images_per_sec": [],
    }
    rec.update(extra)
    return rec


def write_results(directory: Path, records: Iterable[dict], csv_columns: dict[str, dict[str, Any]] | None = None) -> Path:
    """runs/<id>.json for every record; with `csv_columns` ({run_id: {column: value}}) a
    results.csv holding run_id and those columns, as a newer netbench may add them."""
    (directory / "runs").mkdir(parents=True)
    for rec in records:
        (directory / "runs" / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    if csv_columns:
        names = ["run_id", *dict.fromkeys(k for row in csv_columns.values() for k in row)]
        with open(directory / "results.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=names, restval="")
            writer.writeheader()
            writer.writerows({"run_id": rid, **row} for rid, row in csv_columns.items())
    return directory


def two_by_two(directory: Path, repetitions: int = 2) -> Path:
    """Issue 25's design: ps 1+1, mlp, batch 32/256 x loss 0/1 %, `repetitions` each; the
    batch-256 runs at 1 % loss spread widely (as on a shared 2-core machine)."""
    base = {(32, 0): (410.0, 396.0, 402.0), (32, 1): (380.0, 301.0, 352.0),
            (256, 0): (3050.0, 2890.0, 2960.0), (256, 1): (2900.0, 1150.0, 2100.0)}
    idle = {(32, 0): 0.18, (32, 1): 0.31, (256, 0): 0.05, (256, 1): 0.22}
    records, i = [], 0
    for (batch, loss), values in base.items():
        for rep in range(repetitions):
            records.append(record(f"r{i:03d}", strategy="ps", workers=1, batch=batch, loss_pct=loss, repeat=rep,
                                  ips=values[rep % 3] * (1 + rep // 3 * 0.01), ps=1,
                                  idle_ratio=idle[batch, loss] + rep * 0.03))
            i += 1
    return write_results(directory, records)


def demo_latency(directory: Path) -> Path:
    """`make demo`'s sweep: allreduce, 2 workers, mlp, latency 1/10/100 ms, one run each."""
    records = [record(f"r{i:03d}", delay_ms=d, batch=64, ips=v)
               for i, (d, v) in enumerate(((1, 2480.0), (10, 1390.0), (100, 212.0)))]
    return write_results(directory, records)


def topology_scale(directory: Path, repetitions: int = 3) -> Path:
    """A topology scale sweep: two-regions at scale 1/2/4, `repetitions` each, allreduce on 2 workers."""
    records, i = [], 0
    for scale, value in ((1.0, 900.0), (2.0, 520.0), (4.0, 280.0)):
        for rep in range(repetitions):
            topo = {"name": "two-regions", "scale": scale, "links": []}
            records.append({**record(f"r{i:03d}", ips=value * (1 + 0.04 * ((rep % 3) - 1)), repeat=rep,
                                     topology=topo), "profile": None})
            i += 1
    return write_results(directory, records)


def strategies(directory: Path, repetitions: int = 3) -> Path:
    """One network point, three strategies on 2 workers, `repetitions` each, with a newer
    netbench's test_accuracy column in results.csv (a categorical factor: grouped bars)."""
    records, columns, i = [], {}, 0
    for strategy, value, accuracy in (("allreduce", 1200.0, 0.91), ("allreduce-accum", 2600.0, 0.89),
                                      ("ps", 800.0, 0.86)):
        for rep in range(repetitions):
            extra = {"ps": 1} if strategy == "ps" else {"accum_steps": 4} if strategy == "allreduce-accum" else {}
            records.append(record(f"r{i:03d}", strategy=strategy, rate_mbit=100, repeat=rep,
                                  ips=value * (1 + 0.05 * ((rep % 3) - 1)), **extra))
            columns[f"r{i:03d}"] = {"test_accuracy": accuracy + 0.01 * (rep % 3)}
            i += 1
    return write_results(directory, records, columns)


def predicted_latency(directory: Path, repetitions: int = 3) -> Path:
    """Two models x latency 1/10/100 ms, `repetitions` each, results.csv with the step time a
    model predicted (predicted_step_s) and test_accuracy; one timeout at cnn 100 ms."""
    records, columns, i = [], {}, 0
    for model, compute_s in (("mlp", 0.02), ("cnn", 0.2)):
        for delay in (1, 10, 100):
            for rep in range(repetitions):
                step = compute_s + 4 * delay / 1000 * (1 + 0.03 * rep)
                timed_out = model == "cnn" and delay == 100 and rep == repetitions - 1
                records.append(record(f"r{i:03d}", model=model, delay_ms=delay, batch=64, repeat=rep,
                                      ips=None if timed_out else 128 / step, status="timeout" if timed_out else "ok"))
                columns[f"r{i:03d}"] = {"predicted_step_s": compute_s + 3.5 * delay / 1000,
                                        "test_accuracy": 0.9 - delay / 1000 - 0.01 * rep, "framework": "tensorflow"}
                i += 1
    return write_results(directory, records, columns)


def accuracy_curve(top: float, tau: float, step_s: float, steps: int = 60, every: int = 10,
                   eval_s: float = 0.4, spread: float | None = None) -> list[dict]:
    """A run's accuracy_curve as the runner records it: worker 0's held-out accuracy every
    `every` steps, rising from chance (10 %) towards `top` with time constant `tau` steps."""
    import math

    return [{"step": k, "wall_s": round(k * step_s + (k // every) * eval_s, 4), "train_s": round(k * step_s, 4),
             "accuracy": round(top - (top - 0.1) * math.exp(-k / tau), 4), "spread": spread}
            for k in range(every, steps + 1, every)]


def algorithms(directory: Path, repetitions: int = 3, target: float | None = 0.6) -> Path:
    """An accuracy sweep (issue 21): allreduce, ps-sync and gosgd on 2 workers x latency 1/20 ms,
    `repetitions` each, curves every 10 of 60 steps, a manifest with `target`; gosgd at 20 ms
    converges slowly: none of its runs reaches the target, and at 1 ms its last run does not."""
    shapes = {("allreduce", 1): (0.80, 12, 0.030), ("allreduce", 20): (0.80, 12, 0.090),
              ("ps-sync", 1): (0.78, 14, 0.040), ("ps-sync", 20): (0.78, 14, 0.120),
              ("gosgd", 1): (0.70, 30, 0.020), ("gosgd", 20): (0.55, 40, 0.025)}
    records, i = [], 0
    for (strategy, delay), (top, tau, step_s) in shapes.items():
        for rep in range(repetitions):
            slow = 1 + 0.05 * rep
            late = strategy == "gosgd" and delay == 1 and rep == repetitions - 1
            curve = accuracy_curve(top - (0.12 if late else 0.01 * rep), tau * slow, step_s * slow,
                                   spread=0.03 if strategy == "gosgd" else None)
            hit = next((p for p in curve if target is not None and p["accuracy"] >= target), None)
            records.append(record(f"r{i:03d}", strategy=strategy, delay_ms=delay, repeat=rep, batch=64,
                                  ips=128 / (step_s * slow), idle_ratio=min(0.9, 0.1 + step_s * 3),
                                  wait_time_mean_s=0.002, staleness_mean=0.0 if strategy != "gosgd" else 1.5,
                                  accuracy_curve=curve, test_accuracy=curve[-1]["accuracy"],
                                  steps_to_target=hit and hit["step"], time_to_target_s=hit and hit["train_s"]))
            i += 1
    write_results(directory, records)
    job = {"strategy": "allreduce", "train_steps": 60, "eval_every": 10, "target_accuracy": target}
    (directory / "manifest.json").write_text(json.dumps({"sweep_id": "algorithms", "job": job}))
    return directory
