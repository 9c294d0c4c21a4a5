"""End-to-end tier: a sweep whose link follows a schedule during training (root, TensorFlow)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from netbench.testbed import netns as local
from tests.conftest import NETBENCH, netbench_processes

pytestmark = [pytest.mark.root, pytest.mark.tf]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*NETBENCH, *args], capture_output=True, text=True, timeout=600)


def test_sweep_with_a_step_schedule_lands_its_change_and_leaves_nothing(clean_machine, tmp_path: Path):
    """The change adds a delay to a rate-only link and changes its rate: real netlink and a
    delay engine started from the schedule's thread, which returns right after (its last
    change). Before, the netlink part failed ("calling #use_socket from another thread") and an
    engine started there died with the thread, its rule dropping the node's traffic."""
    schedule = tmp_path / "bump.yaml"
    schedule.write_text("name: bump\nsteps:\n  - {at_step: 0, rate: 200mbit}\n"
                        "  - {at_step: 3, delay: 20ms, rate: 100mbit}\n")
    out = tmp_path / "results"
    result = cli("sweep", "--schedule", str(schedule), "--workers", "2", "--warmup", "2", "--steps", "8", "--precision", "off",
                 "--batch-size", "16", "--output", str(out))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    record = json.loads((out / "runs" / "r000.json").read_text())
    assert record["status"] == "ok", record["error"]
    assert record["profile"]["name"] == "bump" and record["profile"]["rate_bps"] == 200_000_000
    assert record["profile"]["delay_us"] == 0
    section = record["schedule"]
    assert section["name"] == "bump" and section["error"] is None
    (change,) = section["changes"]
    assert change["at_step"] == 3 and change["profile"]["delay_us"] == 20000 and change["lateness_ms"] >= 0
    assert change["profile"]["rate_bps"] == 100_000_000
    assert section["lateness_ms"]["changes"] == 1
    assert "schedule bump" in result.stdout + result.stderr  # the live view printed the change
    # the sweep brought the testbed up and took it down: nothing is shown, nothing is left to reset
    assert json.loads(cli("show", "--json").stdout)["nodes"] == []
    assert "nothing to remove" in cli("reset").stdout
    assert local.list_netbench_netns() == [] and netbench_processes() == []
