"""End-to-end tier: a node's CPU limit and step delay slow real TensorFlow training (root,
TensorFlow): one launch moves through the unlimited point and n2 at 0.2 CPU; images/sec falls,
results.csv names the limit, and no group of netbench's is left."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import pytest

from netbench.emulation import cgroups as cg
from netbench.testbed import netns as local
from tests.conftest import NETBENCH, netbench_processes

pytestmark = [pytest.mark.root, pytest.mark.tf]


def test_a_node_at_a_fifth_of_a_cpu_slows_synchronous_training(clean_machine, tmp_path: Path):
    out = tmp_path / "results"
    result = subprocess.run([*NETBENCH, "sweep", "--latency", "1ms", "--cpus", "n2=max,0.2", "--workers", "2",
                             "--model", "mlp", "--warmup", "3", "--steps", "8", "--precision", "off",
                             "--batch-size", "32", "--output", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = {r["profile"]: r for r in csv.DictReader(open(out / "results.csv", newline=""))}
    assert set(rows) == {"d1ms", "d1ms+n2c0.2"} and all(r["status"] == "ok" for r in rows.values())
    free, limited = rows["d1ms"], rows["d1ms+n2c0.2"]
    assert free["cpus_n2"] == "" and limited["cpus_n2"] == "0.2"
    # a synchronous step waits for n2: a fifth of a core (TensorFlow uses several threads) cuts the rate
    assert float(limited["images_per_sec"]) < 0.7 * float(free["images_per_sec"]), (free, limited)
    groups = cg.detect()
    assert not list(groups.root.glob("netbench*/netbench-n*"))  # removed at the end of the sweep
    assert local.list_netbench_netns() == [] and netbench_processes() == []
