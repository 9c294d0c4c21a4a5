"""End-to-end tier: a sweep over a per-pair topology's scale, training with TensorFlow (root)."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest

from netbench.testbed import netns as local
from tests.conftest import NETBENCH, netbench_processes

pytestmark = [pytest.mark.root, pytest.mark.tf]

# two nodes in two groups, so the two workers' traffic crosses the far link
FAR = "name: far\ngroups:\n  a: [n1]\n  b: [n2]\nlinks:\n  a-b: {delay: 20ms}\n"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*NETBENCH, *args], capture_output=True, text=True, timeout=600)


def test_a_scale_sweep_trains_over_the_topology_and_records_it(clean_machine, tmp_path: Path):
    topology = tmp_path / "far.yaml"
    topology.write_text(FAR)
    out = tmp_path / "results"
    result = cli("sweep", "--topology", str(topology), "--scale", "1,2", "--workers", "2", "--warmup", "2",
                 "--steps", "4", "--precision", "off", "--batch-size", "16", "--backend", "userspace", "--output", str(out))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    records = [json.loads((out / "runs" / f"r00{i}.json").read_text()) for i in (0, 1)]
    assert [r["status"] for r in records] == ["ok", "ok"], [r["error"] for r in records]
    assert [r["profile"]["name"] for r in records] == ["far", "far-x2"]
    assert [r["topology"]["scale"] for r in records] == [1, 2]
    assert [r["topology"]["links"][0]["profile"]["delay_us"] for r in records] == [20_000, 40_000]
    near, far = (r["stats"]["images_per_sec"] for r in records)
    assert far < near  # every step's all-reduce crosses a path twice as long
    rows = list(csv.DictReader(open(out / "results.csv", newline="")))
    assert sorted((row["topology"], row["scale"]) for row in rows) == [("far", "1"), ("far", "2")]
    assert json.loads((out / "manifest.json").read_text())["topology"]["name"] == "far"
    # the sweep brought the testbed up and took it down: nothing is left to reset
    assert json.loads(cli("show", "--json").stdout)["nodes"] == []
    assert local.list_netbench_netns() == [] and netbench_processes() == []
