"""Several ranks per node for real (root): two nodes of two torch ranks, the flat ring beside the
hierarchical all-reduce, with each node's link bytes per step checked against the collective's;
and a user's command whose ranks' own environments (/proc/PID/environ) carry the variables."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from netbench.jobs import link_check
from netbench.testbed import netns as local
from tests.conftest import NETBENCH

pytestmark = [pytest.mark.root, pytest.mark.tf]

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (pip install torch==2.13.0)")


def _sweep(out: Path, *flags: str) -> list[dict]:
    argv = [*NETBENCH, "sweep", "--workers", "4", "--ranks-per-node", "2", "--output", str(out), "--no-predict",
            *flags]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=500)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    with open(out / "results.csv", newline="") as fh:
        return list(csv.DictReader(fh))


@needs_torch
def test_two_nodes_of_two_torch_ranks_ring_beside_hierarchical(clean_machine, tmp_path):
    """Both collectives train (ok rows), each node's link carries the collective's inter-node
    bytes per step (ring 1.5x, hierarchical 1x the gradients: 2/3), and the traffic between a
    node's own ranks never reaches its link."""
    per_step, losses = {}, {}
    for collective in ("ring", "hierarchical"):
        out = tmp_path / collective
        (row,) = _sweep(out, "--framework", "torch", "--model", "mlp", "--collective", collective,
                        "--latency", "2ms", "--warmup", "3", "--steps", "12", "--sample-resources", "0.1")
        assert (row["status"], row["workers"]) == ("ok", "4"), row
        record = json.loads((out / "runs" / f"{row['run_id']}.json").read_text())
        found = link_check.node_bytes(record["events"], ranks_per_node=2)
        assert [n.node for n in found] == [0, 1], found
        expected = link_check.expected_per_step(collective, 2, 2, float(row["model_bytes"]))
        assert link_check.compare(found, expected, tolerance=0.15) == [], (collective, found, expected)
        per_step[collective] = sum(n.tx_per_step for n in found) / len(found)
        starts = [e for e in record["events"] if e.get("event") == "start"]
        assert {(e["local_world"], e["collective"]) for e in starts} == {(2, collective)}
        losses[collective] = [e["loss"] for e in record["events"]
                              if e.get("event") == "step" and e.get("worker") == 0][:10]
    ratio = per_step["hierarchical"] / per_step["ring"]
    assert 0.55 < ratio < 0.8, per_step  # 2/3 by the algorithms
    # the same seed, data and mean gradient: the same training, to float rounding
    assert losses["hierarchical"] == pytest.approx(losses["ring"], rel=1e-4) and len(losses["ring"]) == 10
    assert local.list_netbench_netns() == []


@needs_torch
def test_the_slow_node_of_two_ranks_is_named_as_the_straggler(clean_machine, tmp_path):
    """n2 (ranks 2 and 3) at 0.3 CPU: the others wait for n2, named by its node (it was "worker2":
    the node list, one entry a node, was indexed by rank); each rank's record names its node.
    --isolate: the split steps after the window give every rank's computation."""
    out = tmp_path / "slow"
    (row,) = _sweep(out, "--framework", "torch", "--model", "mlp", "--cpus", "n2=0.3", "--latency", "1ms",
                    "--warmup", "3", "--steps", "10", "--isolate")
    assert (row["status"], row["cpus_n2"], row["straggler"]) == ("ok", "0.3", "n2"), row
    record = json.loads((out / "runs" / f"{row['run_id']}.json").read_text())["stragglers"]
    assert [(r["rank"], r["node"]) for r in record["ranks"]] == [(0, "n1"), (1, "n1"), (2, "n2"), (3, "n2")]
    assert sum(r["last_share"] for r in record["ranks"] if r["node"] == "n2") > 0.5, record
    assert local.list_netbench_netns() == []


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs TensorFlow")
def test_tensorflow_mwms_with_two_ranks_per_node(clean_machine, tmp_path):
    """MultiWorkerMirroredStrategy with four tasks, two a node: it trains, and each node's link
    carries a node-major ring's bytes (an interleaved ring would carry twice as many)."""
    out = tmp_path / "tf"
    (row,) = _sweep(out, "--latency", "1ms", "--warmup", "3", "--steps", "10", "--sample-resources", "0.1")
    assert (row["status"], row["framework"], row["ranks_per_node"]) == ("ok", "tensorflow", "2"), row
    measured, expected = float(row["link_bytes_per_step"]), float(row["link_bytes_expected_per_step"])
    assert abs(measured / expected - 1) < 0.15, (measured, expected)
    assert local.list_netbench_netns() == []


STEPS = r"""
import os, sys, time
with open(sys.argv[1] + "/env-" + os.environ["RANK"], "wb") as fh:
    fh.write(open(f"/proc/{os.getpid()}/environ", "rb").read())
k = 0
while True:
    print(f"step {k} took 0.010 seconds", flush=True)
    k += 1
    time.sleep(0.01)
"""


def test_a_user_command_s_ranks_see_the_variables_in_their_own_environment(clean_machine, tmp_path):
    script = tmp_path / "steps.py"
    script.write_text(STEPS)
    seen = tmp_path / "seen"
    seen.mkdir()
    (row,) = _sweep(tmp_path / "out", "--latency", "1ms", "--warmup", "2", "--steps", "5", "--images-per-step", "8",
                    "--step-regex", r"step (?P<step>\d+) took (?P<seconds>[0-9.]+) seconds",
                    "--", "python", str(script), str(seen))
    assert row["status"] == "ok", row
    environs = {}
    for path in sorted(seen.iterdir()):
        pairs = [item.split(b"=", 1) for item in path.read_bytes().split(b"\0") if b"=" in item]
        environs[path.name] = {k.decode(): v.decode() for k, v in pairs}
    assert sorted(environs) == ["env-0", "env-1", "env-2", "env-3"]
    three = environs["env-3"]
    assert (three["LOCAL_RANK"], three["LOCAL_WORLD_SIZE"], three["NODE_RANK"], three["GROUP_RANK"]) == \
        ("1", "2", "1", "1")
    assert (three["PET_NNODES"], three["PET_NPROC_PER_NODE"], three["WORLD_SIZE"]) == ("2", "2", "4")
    assert three["NCCL_IB_DISABLE"] == "1" and three["NCCL_SOCKET_IFNAME"] == three["GLOO_SOCKET_IFNAME"]
    assert three["NCCL_HOSTID"] == environs["env-2"]["NCCL_HOSTID"] != environs["env-0"]["NCCL_HOSTID"]
    tasks = json.loads(three["TF_CONFIG"])["cluster"]["worker"]
    assert len(tasks) == 4 and len({t.rsplit(":", 1)[0] for t in tasks}) == 2  # two tasks on each node
    assert local.list_netbench_netns() == []


@needs_torch
def test_torchrun_starts_each_node_s_two_ranks_itself(clean_machine, tmp_path):
    """examples/torchrun.sh with no flags: netbench starts it once per node, torchrun starts the
    node's two processes (PET_NPROC_PER_NODE=2), and all four report their steps as ranks 0..3."""
    from tests.conftest import ROOT

    out = tmp_path / "out"
    (row,) = _sweep(out, "--latency", "1ms", "--warmup", "2", "--steps", "4", "--", "sh", f"{ROOT}/examples/torchrun.sh")
    assert (row["status"], row["source"], row["workers"]) == ("ok", "track", "4"), row
    ranks = json.loads((out / "logs" / "launch000" / "ranks.json").read_text())
    assert [(r["rank"], r["node"], r["env"]["PET_NPROC_PER_NODE"]) for r in ranks] == [(0, "n1", "2"), (2, "n2", "2")]
    record = json.loads((out / "runs" / f"{row['run_id']}.json").read_text())
    assert sorted({e["task_index"] for e in record["events"] if e.get("event") == "start"}) == [0, 1, 2, 3]
    assert local.list_netbench_netns() == []
