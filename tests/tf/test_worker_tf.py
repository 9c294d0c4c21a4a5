"""The worker as real TensorFlow processes on loopback (tier tf): event streams of one and two
workers, and a missing peer. Pure worker tests are in tests/unit/test_worker.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netbench.jobs import worker
from tests.conftest import free_ports as _free_ports  # noqa: F401 (other tf tests import it from here)
from tests.unit.test_worker import DONE_KEYS, START_KEYS, STEP_KEYS, _env  # noqa: F401 (_env for test_strategies_tf)

def _parse_events(stdout: str) -> list[dict]:
    """Every stdout line must be one JSON event."""
    return [json.loads(line) for line in stdout.splitlines()]


def _run_cluster(num_workers: int, extra_args: list[str], tmp_path: Path,
                 timeout_s: float) -> list[tuple[int, list[dict]]]:
    """Run workers on loopback; return (returncode, events) per worker.

    Every process is killed and reaped on any failure or timeout, so no
    worker is ever left behind.
    """
    if num_workers == 1:
        configs = [None]
    else:
        addrs = [f"127.0.0.1:{p}" for p in _free_ports(num_workers)]
        configs = [worker.make_tf_config(addrs, i) for i in range(num_workers)]
    procs: list[subprocess.Popen] = []
    results = []
    try:
        for i, cfg in enumerate(configs):
            # stderr to a file: TF logs could fill a pipe nobody reads yet.
            with open(tmp_path / f"worker{i}.err", "w") as err:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "netbench.jobs.worker", *extra_args],
                    stdout=subprocess.PIPE, stderr=err, env=_env(cfg), text=True))
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append((proc.returncode, _parse_events(out)))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
    return results


def _stderr_tail(tmp_path: Path, index: int) -> str:
    return (tmp_path / f"worker{index}.err").read_text()[-3000:]


def _check_run(events: list[dict], warmup: int, measured: int, num_workers: int,
               batch_size: int, step: str = "fused", calibration: int = 5, accum: int = 1,
               strategy: str = "allreduce") -> None:
    """Assert the event stream of one successful worker: warm-up and measured steps of the
    `step` kind, then (fused) `calibration` split steps after the measured window."""
    assert events[0]["event"] == "start"
    assert set(events[0]) == START_KEYS | {"step"}
    start = events[0]
    assert (start["step"], start["strategy"], start["accum_steps"]) == (step, strategy, accum)
    assert start["num_workers"] == num_workers
    assert start["batch_size"] == batch_size
    assert start["global_batch_size"] == batch_size * num_workers
    assert start["model"] == "mlp"
    assert start["params"] == 669706
    assert start["tf_version"].startswith("2.")

    if step == "split":
        calibration = 0
    steps = events[1:-1]
    total = warmup + measured + calibration
    assert [e["event"] for e in steps] == ["step"] * total
    assert [e["step"] for e in steps] == list(range(total))
    assert [e["phase"] for e in steps] == ["warmup"] * warmup + ["measured"] * measured + \
        ["calibration"] * calibration
    previous_end = start["time"]
    for e in steps:
        fused = not (step == "split" or e["phase"] == "calibration")
        assert set(e) == STEP_KEYS | ({"computed"} if fused else set())
        assert e["duration"] > 0
        assert e["duration"] == pytest.approx(e["end"] - e["start"])
        assert e["start"] >= previous_end  # monotonic, non-overlapping
        previous_end = e["end"]
        assert e["images"] == batch_size * num_workers * accum
        assert isinstance(e["loss"], float) and math.isfinite(e["loss"])
        if step == "split" or e["phase"] == "calibration":
            # computation, then the all-reduce + update, timed back to back
            assert e["compute"] > 0 and e["comm"] > 0
            assert e["compute"] + e["comm"] == pytest.approx(e["duration"], abs=1e-3)
        else:  # one compiled function: no split inside the measured window, but when its gradients were ready
            assert e["compute"] is None and e["comm"] is None
            assert 0 < e["computed"] <= e["duration"]

    assert events[-1]["event"] == "done"
    assert set(events[-1]) == DONE_KEYS
    assert events[-1]["steps"] == total
    assert events[-1]["time"] >= previous_end


@pytest.mark.tf
def test_single_worker_run(tmp_path):
    (rc, events), = _run_cluster(
        1, ["--warmup", "2", "--steps", "3", "--batch-size", "16"], tmp_path, timeout_s=180)
    assert rc == 0, _stderr_tail(tmp_path, 0)
    _check_run(events, warmup=2, measured=3, num_workers=1, batch_size=16)
    assert events[0]["task_index"] == 0


@pytest.mark.tf
@pytest.mark.parametrize("length_args", [["--steps", "3"], ["--seconds", "0.5"]],
                         ids=["steps", "seconds"])
def test_two_workers_on_loopback(tmp_path, length_args):
    results = _run_cluster(
        2, ["--warmup", "3", "--batch-size", "16", "--collective-timeout", "60",
            "--startup-timeout", "120", *length_args],
        tmp_path, timeout_s=240)
    for i, (rc, _) in enumerate(results):
        assert rc == 0, _stderr_tail(tmp_path, i)
    totals = [events[-1]["steps"] for _, events in results]
    assert totals[0] == totals[1]  # same step count on all workers, or MWMS deadlocks
    measured = totals[0] - 3 - 5  # warm-up and calibration steps
    if length_args[0] == "--steps":
        assert measured == 3
    for _, events in results:
        _check_run(events, warmup=3, measured=measured, num_workers=2, batch_size=16)
    assert sorted(events[0]["task_index"] for _, events in results) == [0, 1]
    assert results[0][1][0]["pid"] != results[1][1][0]["pid"]


@pytest.mark.tf
@pytest.mark.parametrize("strategy, accum, step", [("allreduce", 1, "fused"), ("allreduce-accum", 3, "fused"),
                                                   ("allreduce", 1, "split")])
def test_two_workers_fused_step_and_calibration(tmp_path, strategy, accum, step):
    """The fused step (one compiled function per update) on 2 workers: its measured steps carry
    no split; the calibration steps after them do, are not measured, and the controller's
    analysis reads the split from them. --step split: every step split, no calibration."""
    from netbench.jobs import analysis, events as ev
    from netbench.model.job import JobSpec

    results = _run_cluster(
        2, ["--strategy", strategy, "--accum-steps", str(accum), "--step", step, "--warmup", "2",
            "--steps", "4", "--calibration-steps", "3", "--batch-size", "8", "--collective-timeout", "60",
            "--startup-timeout", "120"], tmp_path, timeout_s=240)
    for i, (rc, _) in enumerate(results):
        assert rc == 0, _stderr_tail(tmp_path, i)
    typed = []
    for _, events in results:
        _check_run(events, warmup=2, measured=4, num_workers=2, batch_size=8, step=step, calibration=3,
                   accum=accum, strategy=strategy)
        typed += [ev.received(ev.from_record(e), events[0]["task_index"], "worker", 0.0) for e in events]
    job = JobSpec(strategy=strategy, batch_size=8, accum_steps=accum, warmup=2, steps=4)
    assert len(analysis.measured_durations(typed, job)) == 4  # calibration steps not counted
    assert len(analysis.per_worker_images_per_sec(typed, job, 2)) == 2
    times = analysis.phase_times(typed, job)
    assert times.source == ("calibration" if step == "fused" else "measured")
    assert times.compute_mean_s > 0 and times.comm_mean_s > 0 and 0 < times.idle_ratio < 1
    assert analysis.step_kind(typed, job) == step


@pytest.mark.tf
def test_missing_peer_hits_startup_timeout(tmp_path):
    """Worker 0 of a 2-worker cluster whose peer never starts must exit."""
    addrs = [f"127.0.0.1:{p}" for p in _free_ports(2)]
    err = tmp_path / "alone.err"
    with open(err, "w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "netbench.jobs.worker", "--startup-timeout", "4"],
            stdout=subprocess.PIPE, stderr=err_file, env=_env(worker.make_tf_config(addrs, 0)),
            text=True)
    try:
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == 1, err.read_text()[-3000:]
    assert [e["event"] for e in _parse_events(out)] == []  # never started
    assert "Timeout" in err.read_text()
