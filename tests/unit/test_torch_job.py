"""--framework torch, pure parts: the job's plan and argv, each rank's rendezvous, refusals that
name their flag or key, the playbook key, the results column, the IDX reader and the worker's
options. No torch is imported here."""

from __future__ import annotations

import gzip
import json
import struct
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from netbench.cli.app import main
from netbench.experiment.store import CSV_COLUMNS, RunResult
from netbench.jobs import torch_worker
from netbench.jobs.harness import data as datasets
from netbench.jobs.harness import idx
from netbench.jobs.torch_harness import rendezvous
from netbench.model import design
from netbench.model.job import JobSpec, check_job, plan_job, worker_argv
from netbench.model.playbook import PlaybookError, playbook_from_mapping
from netbench.model.topology import Node

NODES = tuple(Node(name=f"n{i}", netns=f"netbench-n{i}", ifname="eth0", address=f"10.213.0.{i}", prefixlen=24,
                   port=f"nbp{i}")
              for i in (1, 2, 3))
TORCH = JobSpec(framework="torch", steps=5, warmup=2)


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


# ---------------------------------------------------------------- plan, argv, rendezvous

def test_a_torch_job_runs_the_torch_worker_with_the_tf_workers_options():
    torch_argv, tf_argv = worker_argv(TORCH, "py"), worker_argv(replace(TORCH, framework="tensorflow"), "py")
    assert torch_argv[:3] == ("py", "-m", "netbench.jobs.torch_worker")
    assert tf_argv[:3] == ("py", "-m", "netbench.jobs.worker")
    assert torch_argv[3:] == tf_argv[3:]
    # the options the controller gives parse in the torch worker as they are
    args = torch_worker.parse_args(list(worker_argv(replace(TORCH, strategy="allreduce-accum", accum_steps=3))[3:]))
    assert (args.strategy, args.accum_steps, args.steps, args.warmup) == ("allreduce-accum", 3, 5, 2)


def test_every_rank_meets_rank_0_on_its_node_address_and_pins_gloo():
    tasks = plan_job(TORCH, NODES, workers=3, port=29611)
    places = [rendezvous.from_tf_config(task.tf_config) for task in tasks]
    assert [(p.rank, p.world) for p in places] == [(0, 3), (1, 3), (2, 3)]
    assert {(p.master_addr, p.master_port) for p in places} == {("10.213.0.1", 29611)}
    assert [p.address for p in places] == ["10.213.0.1", "10.213.0.2", "10.213.0.3"]
    env = rendezvous.torch_env(places[2], "eth0")
    assert env == {"MASTER_ADDR": "10.213.0.1", "MASTER_PORT": "29611", "RANK": "2", "WORLD_SIZE": "3",
                   "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GLOO_SOCKET_IFNAME": "eth0"}
    assert "GLOO_SOCKET_IFNAME" not in rendezvous.torch_env(places[0], None)


def test_single_has_no_cluster_and_a_given_env_wins():
    (task,) = plan_job(replace(TORCH, strategy="single"), NODES, workers=1, port=1)
    assert rendezvous.from_tf_config(task.tf_config) is None
    given = rendezvous.from_environment({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.9"})
    assert given == rendezvous.Rendezvous(rank=1, world=2, master_addr="10.0.0.9", master_port=29500)
    assert rendezvous.from_environment({"RANK": "1"}) is None
    with pytest.raises(ValueError, match="not a worker cluster"):
        rendezvous.from_tf_config('{"cluster": {}}')
    with pytest.raises(ValueError, match="not one of 2 workers"):
        rendezvous.from_tf_config(json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "ps", "index": 0}}))


def test_the_interface_holding_an_address_is_found():
    assert rendezvous.interface_of("127.0.0.1") == "lo"
    assert rendezvous.interface_of("192.0.2.77") is None  # TEST-NET: no interface holds it


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("changes, setting", [({"strategy": "ps"}, "strategy"), ({"model": "vgg16"}, "model")])
def test_the_plan_refuses_what_torch_lacks(changes, setting):
    with pytest.raises(ValueError, match=f"^{setting}: .* framework torch"):
        check_job(replace(TORCH, **changes), 2)
    check_job(replace(TORCH, framework="tensorflow", **changes), 2)  # TensorFlow runs it


@pytest.mark.parametrize("args, flag", [(("--strategy", "ps"), "--strategy"), (("--model", "resnet50"), "--model")])
def test_sweep_refuses_in_one_line_naming_the_flag(args, flag):
    result = invoke("sweep", "--dry-run", "--framework", "torch", "--latency", "1ms", *args)
    assert result.exit_code != 0
    first = result.output.strip().splitlines()[0]
    assert first.startswith(f"error: flag {flag}:") and "--framework torch" in first, result.output


def test_sweep_dry_run_names_the_framework():
    result = invoke("sweep", "--dry-run", "--framework", "torch", "--model", "cnn", "--latency", "1,20ms")
    assert result.exit_code == 0, result.output
    assert "framework torch, strategy allreduce" in result.output and "worker1 on n2" in result.output
    assert "framework" not in invoke("sweep", "--dry-run", "--latency", "1ms").output.splitlines()[0]


def test_sweep_refuses_torch_where_it_is_not_installed(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    result = invoke("sweep", "--framework", "torch", "--latency", "1ms", "--output", "/nonexistent/out")
    assert result.exit_code != 0
    assert result.output.startswith("error: flag --framework: torch is not installed"), result.output


@pytest.mark.parametrize("argv, words", [(["--strategy", "ps"], "--strategy: ps"),
                                         (["--model", "mobilenetv2"], "--model: mobilenetv2")])
def test_the_worker_refuses_what_torch_lacks(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_:
        torch_worker.parse_args(argv)
    assert exit_.value.code == 2 and words in capsys.readouterr().err


# ---------------------------------------------------------------- playbooks and results

def test_playbook_framework_key_reaches_the_job_and_keeps_old_digests():
    tf_book = playbook_from_mapping({"factors": {"latency": ["1ms", "10ms"]}}, "pb.yaml")
    both = playbook_from_mapping({"factors": {"framework": ["tensorflow", "torch"], "latency": ["1ms"]}}, "pb.yaml")
    runs = design.expand(both, seed=1)
    assert sorted(run.job.framework for run in runs) == ["tensorflow", "torch"]
    assert all(design.describe_settings(run.settings)["framework"] == run.job.framework for run in runs)
    # a design without the key records what it recorded before frameworks (so folders resume)
    runs = design.expand(tf_book, seed=1)
    assert all("framework" not in design._settings_record(r.settings) for r in runs)


def test_playbook_refuses_torch_with_ps_naming_the_key():
    with pytest.raises(PlaybookError, match=r"pb.yaml: factors.strategy: ps is not available with framework torch"):
        playbook_from_mapping({"fixed": {"framework": "torch"}, "factors": {"strategy": ["allreduce", "ps"]}},
                              "pb.yaml")
    with pytest.raises(PlaybookError, match="framework: unknown value 'pytorch'"):
        playbook_from_mapping({"fixed": {"framework": "pytorch"}}, "pb.yaml")


def test_results_csv_records_the_framework():
    row = RunResult(run_id="r000", profile={}, backend="userspace", strategy="allreduce", model="mlp",
                    batch_size=64, workers=2, repeat=0, warmup_steps=3, status="ok", framework="torch").csv_row()
    assert list(row) == list(CSV_COLUMNS) and row["framework"] == "torch"


# ---------------------------------------------------------------- IDX files

def _idx(array: np.ndarray, code: int) -> bytes:
    head = bytes([0, 0, code, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    return head + array.astype(array.dtype.newbyteorder(">")).tobytes()


def test_idx_files_are_read_and_sharded(tmp_path):
    images = np.arange(5 * 2 * 3, dtype=np.uint8).reshape(5, 2, 3)
    labels = np.array([0, 1, 2, 1, 0], dtype=np.uint8)
    (tmp_path / idx.TRAIN_IMAGES).write_bytes(_idx(images, 0x08))
    (tmp_path / (idx.TRAIN_LABELS + ".gz")).write_bytes(gzip.compress(_idx(labels, 0x08)))
    assert idx.is_idx_folder(str(tmp_path)) and not idx.is_idx_folder(str(tmp_path / "nothing"))
    shard = idx.load_idx_folder(str(tmp_path), index=1, count=2)
    assert shard.x.shape == (2, 2, 3, 1) and shard.x.dtype == np.float32
    assert shard.y.tolist() == [1, 1] and np.allclose(shard.x[0, :, :, 0], images[1] / 255.0)
    floats = np.array([[1.5, -2.0]], dtype=np.float32)
    assert idx.parse_idx(_idx(floats, 0x0D), "f").tolist() == [[1.5, -2.0]]


@pytest.mark.parametrize("raw, words", [(b"\x01\x00\x08\x01", "bad magic"),
                                        (bytes([0, 0, 8, 1]) + struct.pack(">I", 4) + b"abc", "header says 4")])
def test_a_broken_idx_file_is_named(raw, words):
    with pytest.raises(datasets.DataError, match=words):
        idx.parse_idx(raw, "x.idx")
