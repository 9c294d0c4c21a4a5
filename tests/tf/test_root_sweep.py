"""End-to-end tier: real sweeps with real TensorFlow on real namespaces (root, slow)."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
from pathlib import Path

import pytest

from netbench.state.reset import reset
from netbench.testbed import netns as local
from tests.conftest import NETBENCH, netbench_processes, wait_for

pytestmark = [pytest.mark.root, pytest.mark.tf]

def sweep_argv(out: Path, *args: str) -> list[str]:
    return [*NETBENCH, "sweep", "--precision", "off", *args, "--output", str(out)]  # exact --steps


def run_sweep(out: Path, *args: str) -> list[dict]:
    """Run a sweep to completion; it must exit 0. Returns the rows of results.csv."""
    result = subprocess.run(sweep_argv(out, *args), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    with open(out / "results.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_sweep_latency_end_to_end(clean_machine, tmp_path):
    out = tmp_path / "results"
    rows = run_sweep(out, "--latency", "1,40ms", "--warmup", "3", "--steps", "8", "--batch-size", "32", "--verify",
                     "--predict")  # the suite's default is --no-predict (tests/conftest.py)
    assert [r["delay_ms"] for r in rows] == ["1.0", "40.0"]
    # --verify measured each point before training on it and recorded it beside the profile
    assert [r["verify_rtt_configured_ms"] for r in rows] == ["2.0", "80.0"]
    measured_rtt = [float(r["verify_rtt_measured_ms"]) for r in rows]
    assert 1.9 < measured_rtt[0] < 10 and 79 < measured_rtt[1] < 95, measured_rtt
    assert all(r["verify_loss_configured_pct"] == "0.0" and r["verify_ok"] in ("true", "false") for r in rows)
    assert all(r["status"] == "ok" and r["steps"] == "8" for r in rows), rows
    assert all(r["backend"] in ("netem", "userspace") for r in rows)
    fast, slow = (float(r["images_per_sec"]) for r in rows)
    # 40 ms one-way is an 80 ms round trip per all-reduce: far slower than 1 ms
    assert slow < fast / 2, (fast, slow)
    manifest = json.loads((out / "manifest.json").read_text())
    for key in ("netbench", "tensorflow", "python", "kernel", "backend", "command_line", "started", "ended"):
        assert manifest.get(key), key
    # the calibrations ran before the first point, timed, and every run has a predicted step
    assert manifest["calibration"]["collective"]["2"]["seconds"] > 0 and manifest["calibration"]["compute"]
    assert all(float(r["predicted_step_s"]) > 0 for r in rows), rows
    record = json.loads((out / "runs" / "r000.json").read_text())
    phases = [e["phase"] for e in record["events"] if e["event"] == "step" and e["worker"] == 0]
    assert phases.count("warmup") == 3 and phases.count("measured") == 8
    assert list((out / "logs" / "r000").glob("*.log"))
    # the sweep brought the testbed up, so it took it down, and no process is left
    assert local.list_netbench_netns() == []
    assert netbench_processes() == []
    # a second sweep of the same job on the same machine reuses both calibrations, and says so
    ids = {r["calibration_id"] for r in rows}
    assert len(ids) == 1 and ids != {""} and rows[0]["congestion_control"] == "cubic", rows
    again = subprocess.run(sweep_argv(tmp_path / "again", "--latency", "1ms", "--warmup", "3", "--steps", "4",
                                      "--batch-size", "32", "--predict"), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert again.stdout.count("calibration: ") == 2 and again.stdout.count(": reused ") == 2, again.stdout
    with open(tmp_path / "again" / "results.csv", newline="") as fh:
        assert [r["calibration_id"] for r in csv.DictReader(fh)] == list(ids)
    reused = json.loads((tmp_path / "again" / "manifest.json").read_text())["calibration"]
    assert reused["collective"]["2"]["reused"] is True and reused["collective"]["2"]["seconds"] > 0


def test_sweep_step_timeout_is_recorded(clean_machine, tmp_path):
    """A step slower than --step-timeout ends the run as `timeout`, and the sweep goes on. The
    step is slowed by a step delay, not by a long link delay: at 400 ms one-way TensorFlow's own
    start-up (its coordination service's heartbeats) could fail before any step was timed."""
    rows = run_sweep(tmp_path / "results", "--latency", "1ms", "--step-delay", "n2=2s", "--warmup", "1",
                     "--steps", "3", "--step-timeout", "1")
    assert rows[0]["status"] == "timeout" and "within 1s" in rows[0]["error"], rows
    assert netbench_processes() == []



@pytest.mark.parametrize("moment", ["testbed", "engines", "workers"])
def test_sweep_sigkill_then_reset_leaves_nothing(clean_machine, tmp_path, moment):
    controller = subprocess.Popen(
        sweep_argv(tmp_path / "results", "--latency", "5,10ms", "--warmup", "2", "--steps", "50"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if moment == "testbed":
            wait_for(lambda: "netbench-n2" in local.list_netbench_netns(), 60, "the testbed")
        elif moment == "engines":
            wait_for(lambda: sum("engine" in c for _, c in netbench_processes()) >= 1, 60, "an engine")
        else:
            wait_for(lambda: sum("worker" in c for _, c in netbench_processes()) >= 2, 120, "workers")
        controller.send_signal(signal.SIGKILL)
        controller.wait(timeout=10)
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait()
    reset(clean_machine)
    assert local.list_netbench_netns() == []
    wait_for(lambda: netbench_processes() == [], 10, "no engine or worker left")
    assert reset(clean_machine) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sweep_sigterm_resets_before_exit(clean_machine, tmp_path, signum):
    controller = subprocess.Popen(
        sweep_argv(tmp_path / "results", "--latency", "5ms", "--warmup", "2", "--steps", "500"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: sum("worker" in c for _, c in netbench_processes()) >= 2, 120, "workers")
        controller.send_signal(signum)
        _, err = controller.communicate(timeout=60)
    finally:
        if controller.poll() is None:
            controller.kill()
    assert controller.returncode == 130, err
    assert local.list_netbench_netns() == []
    assert netbench_processes() == []
