"""Fixture campaigns for the campaign tests: a design's campaign.json and its shards' folders
with run records as a shard's runner writes them (ResultStore.add), each run's provenance
included. Pure: files in a folder the test gives."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from netbench.experiment import campaign
from netbench.experiment.store import ResultStore, RunResult
from netbench.model import design
from netbench.model.playbook import playbook_from_mapping

ROOT = Path(__file__).resolve().parents[2]


def book(**data):
    data.setdefault("fixed", {"model": "mlp", "workers": 2, "strategy": "allreduce"})
    data.setdefault("seed", 11)
    data.setdefault("order", "random")
    return playbook_from_mapping(data, "pb.yaml", base_dir=ROOT / "playbooks")


def four_points(repeat: int = 2):
    """latency x bandwidth, 2 x 2, `repeat` repetitions, seeded."""
    return book(factors={"latency": ["1ms", "20ms"], "bandwidth": ["100mbit", "1gbit"]}, repeat=repeat,
                warmup=1, steps=3, precision="off")


def make(folder: Path, b, shards: int) -> tuple[dict, tuple]:
    """The campaign's record, written; (record, the design's runs)."""
    runs = design.expand(b, b.seed)
    record, _ = campaign.create_once(folder, campaign.plan(b, b.seed, runs, shards))
    return record, runs


def host_of(shard: int) -> str:
    return f"node{shard + 1}"


def record_run(folder: Path, record: dict, runs, run_id: str, status: str = "ok", ips: float | None = None,
               took_s: float = 10.0, host: Callable[[int], str] = host_of, error: str = "",
               congestion: Callable[[int], str] = lambda shard: "cubic") -> RunResult:
    """A run's record in its shard's folder, as the runner writes it (`ips`: images/s, default
    from its point: lower with latency, higher with bandwidth)."""
    entry = next(e for e in record["runs"] if e["run_id"] == run_id)
    shard = entry["shard"]
    run = next((r for r in runs if r.run_id == run_id), None)
    if run is None:  # an extra run of the reference point
        from netbench.model.shard import shard_runs

        run = next(r for r in shard_runs(runs, campaign.split_of(record), shard) if r.run_id == run_id)
    if ips is None:
        ips = 1000.0 / (1 + run.profile.delay_us / 5000) * (1.5 if (run.profile.rate_bps or 0) > 1e8 else 1.0)
    where = {"host": host(shard), "cpu_model": "Test CPU", "cores": 8, "kernel": "6.1.0", "privilege": "rootless",
             "netbench_version": "0.1.0", "shard": f"{shard}/{record['shards']}"}
    result = RunResult(run_id=run_id, profile=run.profile.to_record(), backend="netem", strategy=run.job.strategy,
                       model=run.job.model, batch_size=run.job.batch_size, workers=run.workers, repeat=run.repeat,
                       warmup_steps=1, status=status, error=error or ("" if status == "ok" else "no measured steps"),
                       stats={"images_per_sec": ips, "steps": 3, "mean_s": 64 / ips} if status == "ok" else None,
                       started=1000.0, ended=1000.0 + took_s, provenance=where,
                       congestion_control=congestion(shard))
    store = ResultStore(campaign.shard_dir(folder, shard))
    store.create()
    store.add(result)
    return result


def record_all(folder: Path, record: dict, runs, **kwargs) -> None:
    for entry in record["runs"]:
        record_run(folder, record, runs, entry["run_id"], **kwargs)
