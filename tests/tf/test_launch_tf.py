"""A real sweep's launch: the workers start once and serve every point (root, TensorFlow)."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest

from netbench.testbed import netns as local
from tests.conftest import NETBENCH, netbench_processes

pytestmark = [pytest.mark.root, pytest.mark.tf]


def test_a_launch_sweep_starts_each_worker_once_and_records_every_point(clean_machine, tmp_path):
    out = tmp_path / "results"
    argv = [*NETBENCH, "sweep", "--latency", "1,5,20ms", "--workers", "2", "--batch-size", "16", "--warmup", "3",
            "--steps", "6", "--precision", "off", "--launch", "--settle", "0.3s", "--settle-steps", "2", "--order-seed", "11",
            "--output", str(out)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    with open(out / "results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(r["delay_ms"] for r in rows) == ["1.0", "20.0", "5.0"]
    assert all(r["status"] == "ok" and r["steps"] == "6" and r["launch"] == "0" for r in rows), rows
    pids, workers = set(), set()
    for row in rows:
        record = json.loads((out / "runs" / f"{row['run_id']}.json").read_text())
        pids |= {e["pid"] for e in record["events"] if e["event"] == "start"}
        steps = [e for e in record["events"] if e["event"] == "step"]
        for worker in (0, 1):
            assert sum(e["worker"] == worker and e["phase"] == "measured" for e in steps) == 6
        workers |= {e["worker"] for e in steps}
        assert int(row["settle_steps"]) == sum(e["worker"] == 0 and e["phase"] == "settle" for e in steps)
        # why it settled: the first point by its warm-up, the others once steady past their floor (at most --settle)
        assert row["settle_reason"].split(";")[0] in ("warm-up", "steady", "gave up"), row["settle_reason"]
    assert len(pids) == 2 and workers == {0, 1}  # each worker started once, for all three points
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["order_seed"] == 11 and len(manifest["launches"]) == 1
    assert manifest["launches"][0]["runs"] == [r["run_id"] for r in rows]  # stored in the order run
    available = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    congestion = manifest["tcp_congestion_control"]
    assert sorted(congestion) == ["n1", "n2"] and all(cc in available for cc in congestion.values()), congestion
    speed = {r["delay_ms"]: float(r["images_per_sec"]) for r in rows}
    assert speed["20.0"] < speed["1.0"], speed  # each point measured its own network
    assert local.list_netbench_netns() == [] and netbench_processes() == []


def _controller_starts(record: dict, worker: int) -> list[float]:
    """When each measured step of `worker` started, on the controller's clock."""
    return [e["recv"] - (e["end"] - e["start"]) for e in record["events"]
            if e["event"] == "step" and e["phase"] == "measured" and e.get("role", "worker") == "worker"
            and e["worker"] == worker]


def test_an_own_pace_launch_measures_a_slow_workers_steps_in_the_point_they_ran_in(clean_machine, tmp_path):
    # ps-async: each worker at its own pace, n2's at a quarter of a CPU; by step number, n2's steps
    # of one point's window ran while the next point was applied
    out = tmp_path / "results"
    argv = [*NETBENCH, "sweep", "--strategy", "ps-async", "--workers", "2", "--cpus", "n2=0.25",
            "--latency", "1,10ms", "--batch-size", "16", "--warmup", "3", "--steps", "8", "--precision", "off",
            "--settle", "0.3s", "--settle-steps", "2", "--order-seed", "5", "--output", str(out)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["launches"]) == 1
    order = manifest["launches"][0]["runs"]
    records = [json.loads((out / "runs" / f"{run_id}.json").read_text()) for run_id in order]
    assert all(r["status"] == "ok" for r in records)
    for record in records:
        starts = {w: _controller_starts(record, w) for w in (0, 1)}
        assert all(len(s) >= 2 for s in starts.values()), starts  # both workers' rates are the point's
        assert len(record["per_worker_images_per_sec"]) == 2
        # n2's measured steps ran inside the chief's window of the same point (its first measured
        # step's start to its last one's arrival)
        last = max(e["recv"] for e in record["events"] if e["event"] == "step" and e["phase"] == "measured"
                   and e["worker"] == 0)
        assert all(min(starts[0]) <= t <= last for t in starts[1]), (record["run_id"], starts, last)
    with open(out / "results.csv", newline="") as fh:
        rows = {r["run_id"]: r for r in csv.DictReader(fh)}
    for run_id in order:  # the cluster's rate is the workers' own rates summed; n2's is the lower
        rates = [float(v) for v in rows[run_id]["worker_images_per_sec"].split(";")]
        assert float(rows[run_id]["images_per_sec"]) == pytest.approx(sum(rates), rel=0.01)
        assert rates[1] < rates[0], rates
    assert local.list_netbench_netns() == [] and netbench_processes() == []
