"""End-to-end tier: `netbench collective` on real namespaces with real TensorFlow (root, slow)."""

from __future__ import annotations

import csv
import json
import subprocess

import pytest

from netbench.testbed import netns as local
from tests.conftest import NETBENCH, netbench_processes

pytestmark = [pytest.mark.root, pytest.mark.tf]


def test_collective_fits_a_latency_term_that_grows_with_the_delay(clean_machine, tmp_path):
    out = tmp_path / "collective"
    result = subprocess.run([*NETBENCH, "collective", "--latency", "1,10ms", "--sizes", "1KiB-256KiB",
                             "--ops", "allreduce,broadcast", "--framework", "tensorflow", "--warmup", "1", "--repeat", "3",
                             "--json", "--output", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    points = json.loads(result.stdout)["points"]
    assert [p["delay_ms"] for p in points] == [1, 10]
    for point in points:
        assert set(point) == {"delay_ms", "rate_mbit", "loss_pct", "workers", "alpha_s", "beta_s_per_byte", "sizes"}
        assert point["workers"] == 2 and point["rate_mbit"] is None and point["loss_pct"] == 0
        assert [s["bytes"] for s in point["sizes"]] == [2**k for k in range(10, 19)]
        for size in point["sizes"]:
            assert set(size) == {"bytes", "time_s", "algbw_gbps", "busbw_gbps"}
            # 2 workers: all-reduce's bus bandwidth is its algorithm bandwidth; 8 bits a byte
            assert size["busbw_gbps"] == pytest.approx(size["algbw_gbps"])
            assert size["algbw_gbps"] == pytest.approx(size["bytes"] * 8 / size["time_s"] / 1e9)
    near, far = points
    # each all-reduce waits on at least one more 18 ms round trip at 10 ms than at 1 ms
    assert far["alpha_s"] > near["alpha_s"] + 0.018, (near["alpha_s"], far["alpha_s"])
    with open(out / "collective.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["op"] for r in rows} == {"allreduce", "broadcast"} and len(rows) == 2 * 2 * 9
    assert json.loads((out / "manifest.json").read_text())["ended"]
    assert local.list_netbench_netns() == []
    assert netbench_processes() == []
