"""Users' own training jobs, written as a user would, under `netbench sweep -- COMMAND` (root,
real frameworks): a PyTorch DDP loop with track.step, the same loop under torchrun with no
flags, and Keras model.fit (tf_keras) with the callback. Each is skipped, with the reason,
where its framework is not installed."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from netbench.testbed import netns as local
from tests.conftest import NETBENCH, ROOT

pytestmark = [pytest.mark.root, pytest.mark.tf]

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (pip install torch==2.13.0)")
needs_tf_keras = pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None,
                                    reason="tf_keras is not installed (make install adds tf-keras==2.21.0)")


def sweep(out: Path, latency: str, *command: str, steps: int = 6) -> list[dict]:
    argv = [*NETBENCH, "sweep", "--latency", latency, "--workers", "2", "--warmup", "3", "--steps", str(steps),
            "--output", str(out), "--", *command]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=500)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    with open(out / "results.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def left_running(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def check_job(out: Path, rows: list[dict], framework: str) -> None:
    """ok rows from track events, slower at 20 ms, one launch stopped on request, nothing left."""
    assert all(r["status"] == "ok" and r["source"] == "track" and r["framework"].startswith(framework)
               for r in rows), rows
    speed = {r["delay_ms"]: float(r["images_per_sec"]) for r in rows}
    assert speed["20.0"] < speed["1.0"], speed
    assert {r["launch"] for r in rows} == {"0"}  # it asks track.stop_requested(): one start served both
    ranks = json.loads((out / "logs" / "launch000" / "ranks.json").read_text())
    assert [r["ended"] for r in ranks] == ["exited 0", "exited 0"]  # both stopped after the same step
    assert local.list_netbench_netns() == []


@needs_torch
def test_a_ddp_loop_with_track_steps(clean_machine, tmp_path):
    rows = sweep(tmp_path / "out", "1,20ms", "python", f"{ROOT}/examples/torch_ddp.py")  # netbench's python
    check_job(tmp_path / "out", rows, "torch")
    assert left_running(f"{ROOT}/examples/torch_ddp.py") == []


@needs_torch
def test_torchrun_with_no_flags(clean_machine, tmp_path):
    rows = sweep(tmp_path / "out", "1ms", "sh", f"{ROOT}/examples/torchrun.sh", steps=4)
    assert [(r["status"], r["source"], r["framework"][:5]) for r in rows] == [("ok", "track", "torch")], rows
    assert left_running(f"{ROOT}/examples/torch_ddp.py") == []  # torchrun's workers ended with it
    assert local.list_netbench_netns() == []


@needs_tf_keras
def test_keras_fit_with_the_callback(clean_machine, tmp_path):
    rows = sweep(tmp_path / "out", "1,20ms", "python", f"{ROOT}/examples/keras_fit.py")
    check_job(tmp_path / "out", rows, "tf_keras")
    assert left_running(f"{ROOT}/examples/keras_fit.py") == []
