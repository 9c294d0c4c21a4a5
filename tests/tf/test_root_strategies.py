"""End-to-end tier: each training mode as a real sweep in real namespaces (root, TensorFlow).

Kept short (tiny mlp, few steps). The last test checks the direction the studies report:
at low bandwidth, all-reducing every 4 batches beats all-reducing every batch.
"""

from __future__ import annotations

import json

import pytest

from netbench.experiment.store import SCHEMA_VERSION
from netbench.testbed import netns as local
from tests.conftest import netbench_processes
from tests.tf.test_root_sweep import run_sweep

pytestmark = [pytest.mark.root, pytest.mark.tf]

SHORT = ("--warmup", "2", "--steps", "5", "--batch-size", "32")


def test_ps_sweep_places_roles_and_records_the_coordinators_view(clean_machine, tmp_path):
    out = tmp_path / "results"
    rows = run_sweep(out, "--strategy", "ps", "--ps", "1", "--workers", "2", "--latency", "1ms", *SHORT,
                     "--steps", "8")
    (row,) = rows
    assert row["status"] == "ok", row
    assert (row["strategy"], row["ps"], row["workers"], row["steps"]) == ("ps", "1", "2", "8")
    assert float(row["images_per_sec"]) > 0
    assert 0 < float(row["idle_ratio"]) < 1
    assert float(row["compute_time_mean_s"]) > 0 and float(row["comm_time_mean_s"]) > 0
    assert row["params"] == "669706" and row["model_bytes"] == str(4 * 669706)
    record = json.loads((out / "runs" / "r000.json").read_text())
    assert record["schema_version"] == SCHEMA_VERSION and record["resources"] == []  # no --sample-resources: none
    starts = {(e["role"], e["worker"]) for e in record["events"] if e["event"] == "start"}
    assert starts == {("worker", 0), ("worker", 1), ("ps", 0), ("coordinator", 0)}
    manifest = json.loads((out / "manifest.json").read_text())
    assert [n["name"] for n in manifest["testbed"]["nodes"]] == ["n1", "n2", "n3", "n4"]  # 2 workers + ps + coordinator
    per_worker = [float(v) for v in row["worker_images_per_sec"].split(";")]
    # the workers' shares add up to the coordinator's throughput
    assert sum(per_worker) == pytest.approx(float(row["images_per_sec"]), rel=0.02)
    assert local.list_netbench_netns() == [] and netbench_processes() == []


def test_single_sweep_runs_one_process_on_one_node(clean_machine, tmp_path):
    out = tmp_path / "results"
    (row,) = run_sweep(out, "--strategy", "single", *SHORT)
    assert row["status"] == "ok", row
    assert (row["workers"], row["global_batch_size"], row["accum_steps"]) == ("1", "32", "1")
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["testbed"]["nodes"]) == 1


def test_accum_beats_per_step_allreduce_at_low_bandwidth(clean_machine, tmp_path):
    """50 mbit/s: the 2.7 MB gradient all-reduce dominates a step (~0.45 s), so 4 batches per
    all-reduce should give well over twice the images/sec (about 3.5x if compute were free)."""
    # --isolate: the compute/comm split comes from calibration steps, run only in a launch of its own
    common = ("--bandwidth", "50mbit", "--warmup", "2", "--steps", "4", "--batch-size", "32", "--isolate")
    (plain,) = run_sweep(tmp_path / "allreduce", "--strategy", "allreduce", *common)
    (accum,) = run_sweep(tmp_path / "accum", "--strategy", "allreduce-accum", "--accum-steps", "4", *common)
    assert plain["status"] == accum["status"] == "ok", (plain, accum)
    speedup = float(accum["images_per_sec"]) / float(plain["images_per_sec"])
    assert speedup > 2.0, (plain["images_per_sec"], accum["images_per_sec"])
    # per-step all-reduce spends most of each step communicating; accumulation much less of it
    assert float(plain["idle_ratio"]) > 0.7
    assert float(accum["idle_ratio"]) < float(plain["idle_ratio"])
