"""--framework torch for real: the models against TensorFlow's, two ranks of the torch worker,
and one sweep over shaped namespaces. Skipped where torch is not installed (an optional extra:
make install adds it where its CPU build is on disk)."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from netbench.jobs import events as ev
from netbench.testbed import netns as local
from tests.conftest import NETBENCH, ROOT, netbench_processes

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch is not installed (pip install torch==2.13.0, the CPU build)")


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs TensorFlow too")
def test_torch_models_have_the_tensorflow_models_parameters():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    from netbench.jobs.harness import models as tf_models
    from netbench.jobs.torch_harness import models as torch_models

    for name, shape in (("mlp", (784,)), ("cnn", (32, 32, 3)), ("cnn", (28, 28, 1)), ("resnet18", (32, 32, 3))):
        tf_size = tf_models.model_size(tf_models.build_model(keras, name, shape, 10))
        torch_size = torch_models.model_size(torch_models.build_model(name, shape, 10))
        assert torch_size == tf_size, (name, shape)


def test_two_ranks_agree_on_a_seconds_window_and_calibrate(tmp_path):
    """allreduce-accum over loopback: both ranks run the same measured steps (--seconds), then
    calibration steps that split computation from communication."""
    cluster = ["127.0.0.1:29613", "127.0.0.1:29613"]
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "PYTHONPATH": str(ROOT),
               "TF_CONFIG": json.dumps({"cluster": {"worker": cluster}, "task": {"type": "worker", "index": rank}})}
        argv = [sys.executable, "-m", "netbench.jobs.torch_worker", "--strategy", "allreduce-accum", "--accum-steps",
                "2", "--batch-size", "16", "--warmup", "2", "--seconds", "0.5", "--calibration-steps", "2",
                "--startup-timeout", "60", "--collective-timeout", "60"]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()[-2000:]
            outputs.append([ev.parse_line(line) for line in out.decode().splitlines()])
    finally:
        for proc in procs:
            proc.kill()
    measured = []
    for rank, events in enumerate(outputs):
        start, done = events[0], events[-1]
        assert isinstance(start, ev.Start) and (start.task_index, start.num_workers, start.params) == (rank, 2, 669706)
        assert dict(start.extra)["framework"] == "torch" and isinstance(done, ev.Done)
        steps = [e for e in events if isinstance(e, ev.Step)]
        assert all(e.images == 16 * 2 * 2 for e in steps)
        measured.append(sum(e.measured for e in steps))
        calibration = [e for e in steps if e.calibration]
        assert len(calibration) == 2 and all(e.compute > 0 and e.comm > 0 for e in calibration)
    assert measured[0] == measured[1] >= 1


def test_sweep_torch_latency_end_to_end(clean_machine, tmp_path):
    out = tmp_path / "results"
    argv = [*NETBENCH, "sweep", "--framework", "torch", "--model", "mlp", "--latency", "1,20ms", "--workers", "2",
            "--warmup", "3", "--steps", "8", "--output", str(out)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    with open(out / "results.csv", newline="") as fh:
        rows = sorted(csv.DictReader(fh), key=lambda r: float(r["delay_ms"]))
    assert [r["delay_ms"] for r in rows] == ["1.0", "20.0"]
    for row in rows:
        assert (row["status"], row["framework"], row["strategy"], row["steps"]) == ("ok", "torch", "allreduce", "8")
        assert row["params"] == "669706" and row["step"] == "fused"
    fast, slow = (float(r["images_per_sec"]) for r in rows)
    # each step's all-reduce crosses the link: a 40 ms round trip costs far more than a 2 ms one
    assert slow < fast / 2, (fast, slow)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["job"]["framework"] == "torch" and manifest["torch"]
    # the sweep brought the testbed up, so it took it down, and no process is left
    assert local.list_netbench_netns() == []
    assert netbench_processes() == []


def test_the_buckets_the_worker_reports_are_those_ddp_all_reduces_in_its_measured_steps():
    # DDP rebuilds its buckets after the first step, while its logging data keeps the first
    # assignment (the mlp: one bucket, where every later step all-reduces two): the worker
    # reports the rebuilt ones, which a communication hook sees
    code = r"""
import socket, torch, torch.distributed as dist
from torch import nn
from netbench.jobs.torch_harness.loop import _buckets
from netbench.jobs.torch_harness.models import build_model
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
for name in ("mlp", "cnn"):
    model = build_model(name, (784,) if name == "mlp" else (32, 32, 3), 10)
    net = nn.parallel.DistributedDataParallel(model)
    seen = []
    def hook(state, bucket):
        seen.append(bucket.buffer().numel() * bucket.buffer().element_size())
        future = torch.futures.Future(); future.set_result(bucket.buffer()); return future
    net.register_comm_hook(None, hook)
    reported = dict(_buckets(net, object()))["ddp_bucket_bytes"]
    x = torch.randn(8, *((784,) if name == "mlp" else (32, 32, 3)))  # channels last, as the harness feeds it
    for _ in range(3):
        seen.clear()
        nn.CrossEntropyLoss()(net(x), torch.randint(0, 10, (8,))).backward()
    print(name, reported, ",".join(map(str, seen)), net._get_ddp_logging_data().get("bucket_sizes"))
dist.destroy_process_group()
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith(("mlp ", "cnn "))]
    assert [r[0] for r in rows] == ["mlp", "cnn"], result.stdout
    for name, reported, seen, logged in rows:
        assert reported == seen, (name, reported, seen)
    assert rows[0][1] == "1071144,1607680" and rows[0][3] == "2678824"  # what DDP's own log says
