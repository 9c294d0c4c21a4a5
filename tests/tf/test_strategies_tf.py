"""Each training mode really runs: real TensorFlow processes on loopback, kept short.

allreduce-accum and ps run as clusters on 127.0.0.1; single runs with a generated .npz
and a generated folder of PNG images; every model is built once.
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from netbench.jobs.harness.loop import DEFAULT_CALIBRATION_STEPS
from tests.tf.test_worker_tf import _env, _free_ports, _parse_events, _run_cluster, _stderr_tail

pytestmark = pytest.mark.tf


def test_allreduce_accum_two_workers(tmp_path):
    # the split step (the fused one and its calibration: test_worker_tf.py)
    results = _run_cluster(2, ["--strategy", "allreduce-accum", "--step", "split", "--accum-steps", "3", "--warmup", "1",
                               "--steps", "3", "--batch-size", "8", "--startup-timeout", "120"], tmp_path, 240)
    for i, (rc, _) in enumerate(results):
        assert rc == 0, _stderr_tail(tmp_path, i)
    for _, events in results:
        start, steps, done = events[0], events[1:-1], events[-1]
        assert (start["strategy"], start["accum_steps"], start["num_workers"]) == ("allreduce-accum", 3, 2)
        assert start["model_bytes"] == 4 * start["params"] == 4 * 669706
        assert len(steps) == 4 and done["steps"] == 4
        for e in steps:
            assert e["images"] == 8 * 2 * 3  # 3 local batches on each of 2 workers per update
            assert e["compute"] > 0 and e["comm"] > 0
            assert e["compute"] + e["comm"] == pytest.approx(e["duration"], abs=1e-3)


def _run_ps(tmp_path: Path, workers: int, extra: list[str], timeout_s: float) -> dict[str, tuple[int, list]]:
    """A ps cluster on loopback: servers first, then the coordinator; servers killed at the end."""
    ports = _free_ports(workers + 2)
    addr = [f"127.0.0.1:{p}" for p in ports]
    cluster = {"worker": addr[:workers], "ps": [addr[workers]], "chief": [addr[workers + 1]]}
    roles = [("worker", i) for i in range(workers)] + [("ps", 0), ("chief", 0)]
    procs = {}
    try:
        for kind, index in roles:
            config = json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})
            with open(tmp_path / f"{kind}{index}.err", "w") as err:
                procs[f"{kind}{index}"] = subprocess.Popen(
                    [sys.executable, "-m", "netbench.jobs.worker", "--strategy", "ps", *extra],
                    stdout=subprocess.PIPE, stderr=err, env=_env(config), text=True)
        chief = procs["chief0"]
        out, _ = chief.communicate(timeout=timeout_s)
        results = {"chief0": (chief.returncode, _parse_events(out))}
        for name, proc in procs.items():
            if name != "chief0":
                assert proc.poll() is None, f"{name} exited early: {(tmp_path / f'{name}.err').read_text()[-2000:]}"
                proc.kill()
                out, _ = proc.communicate(timeout=30)
                results[name] = (proc.returncode, _parse_events(out))
        return results
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()


def test_ps_coordinator_streams_completed_steps(tmp_path):
    results = _run_ps(tmp_path, 2, ["--warmup", "2", "--steps", "8", "--batch-size", "16",
                                    "--startup-timeout", "120"], timeout_s=240)
    rc, events = results["chief0"]
    assert rc == 0, (tmp_path / "chief0.err").read_text()[-3000:]
    start, steps, done = events[0], events[1:-1], events[-1]
    assert (start["role"], start["strategy"], start["num_workers"]) == ("coordinator", "ps", 2)
    assert start["params"] == 669706
    assert [e["step"] for e in steps] == list(range(10)) and done["steps"] == 10
    assert [e["phase"] for e in steps] == ["warmup"] * 2 + ["measured"] * 8
    assert {e["executor"] for e in steps} == {0, 1}  # asynchronous: both workers took steps
    previous = start["time"]
    for e in steps:
        assert e["images"] == 16
        assert e["start"] >= previous - 1e-9 and e["end"] > e["start"]  # completions, back to back
        previous = e["end"]
        assert e["compute"] > 0 and e["comm"] > 0  # stamped on the worker that ran the step
        assert math.isfinite(e["loss"])
    for name in ("worker0", "worker1", "ps0"):
        server_events = results[name][1]
        assert [e["event"] for e in server_events] == ["start"]
        assert server_events[0]["role"] == name[:-1]


def _png(path: Path, pixels: np.ndarray) -> None:
    """Write a greyscale 8-bit PNG (no imaging library needed)."""
    height, width = pixels.shape
    raw = b"".join(b"\0" + pixels[row].astype(np.uint8).tobytes() for row in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def _run_single(args: list[str], tmp_path: Path) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "netbench.jobs.worker", "--strategy", "single", *args],
                          env=_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _parse_events(proc.stdout)


def test_single_trains_on_an_npz_archive(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "tiny.npz"
    np.savez(path, x_train=rng.integers(0, 256, (40, 8, 8), dtype=np.uint8),
             y_train=rng.integers(0, 5, (40, 1)))
    events = _run_single(["--data", str(path), "--warmup", "1", "--steps", "3", "--batch-size", "8"], tmp_path)
    start = events[0]
    assert (start["input_shape"], start["classes"], start["data"]) == ([8, 8, 1], 5, str(path))
    # the mlp flattens 8x8x1: 64*512+512 + 512*512+512 + 512*5+5
    assert start["params"] == 64 * 512 + 512 + 512 * 512 + 512 + 512 * 5 + 5
    assert (start["num_workers"], start["global_batch_size"]) == (1, 8)
    # 1 warm-up, 3 measured, then the calibration steps (the compute/comm split, outside the window)
    assert [(e["event"], e.get("phase")) for e in events[1:]] == [("step", "warmup")] + [("step", "measured")] * 3 + \
        [("step", "calibration")] * DEFAULT_CALIBRATION_STEPS + [("done", None)]


def test_single_trains_a_cnn_on_a_folder_of_images(tmp_path):
    rng = np.random.default_rng(1)
    for name in ("circle", "square", "triangle"):
        (tmp_path / "data" / name).mkdir(parents=True)
        for k in range(4):
            _png(tmp_path / "data" / name / f"{k}.png", rng.integers(0, 256, (10, 12)))
    events = _run_single(["--data", str(tmp_path / "data"), "--model", "cnn", "--input-shape", "16x16x3",
                          "--warmup", "1", "--steps", "2", "--batch-size", "4"], tmp_path)
    start = events[0]
    assert (start["input_shape"], start["classes"], start["model"]) == ([16, 16, 3], 3, "cnn")
    assert events[-1] == {"event": "done", "time": events[-1]["time"], "steps": 3 + DEFAULT_CALIBRATION_STEPS}


def test_bad_dataset_is_an_error_event(tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(path, x_train=np.zeros((4, 3)))
    proc = subprocess.run([sys.executable, "-m", "netbench.jobs.worker", "--strategy", "single", "--data", str(path)],
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    (event,) = _parse_events(proc.stdout)
    assert event["event"] == "error" and "missing y_train" in event["message"]


def test_every_model_builds_with_its_size(tmp_path):
    code = ("import json, keras; from netbench.jobs.harness.models import MODELS, DEFAULT_INPUT_SHAPES, build_model, "
            "model_size\nout = {}\nfor name in MODELS:\n"
            "    m = build_model(keras, name, DEFAULT_INPUT_SHAPES[name], 10)\n"
            "    out[name] = [*model_size(m), m.count_params(), list(m.outputs[0].shape)[1:]]\n"
            "print(json.dumps(out))")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sizes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(sizes) == {"mlp", "cnn", "resnet18", "mobilenetv2", "resnet50", "efficientnetb0", "vgg16"}
    for name, (params, size, counted, out_shape) in sizes.items():
        # float32 weights; EfficientNet's normalisation layer also keeps an int64 count
        assert params == counted and 4 * params <= size < 4 * params + 64 and out_shape == [10], name
    assert sizes["mlp"][:2] == [669706, 4 * 669706]
    # resnet18 (basic blocks) is about 11.2 M parameters, as in He et al.; resnet50 about 23.6 M
    assert 11.0e6 < sizes["resnet18"][0] < 11.3e6
    assert 23.4e6 < sizes["resnet50"][0] < 23.8e6
    assert time.monotonic() - started < 300
