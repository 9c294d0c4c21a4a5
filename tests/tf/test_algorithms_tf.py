"""End-to-end tier: every training algorithm on real namespaces with real TensorFlow, briefly,
on Fashion-MNIST: each run trains a fresh model to above-chance held-out accuracy, and the
bytes its workers' nodes send match what the algorithm says crosses the network per step
(root, slow: one playbook, eight short runs)."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest

from netbench.jobs.algorithms import model_transfers_per_step, pipeline_depth
from netbench.jobs.harness import data as datasets
from tests.conftest import NETBENCH

pytestmark = [pytest.mark.root, pytest.mark.tf]

STRATEGIES = ("ps", "ps-sync", "ps-async", "ps-ssp", "easgd", "gosgd", "adpsgd", "allreduce")
TRAIN_STEPS = 60

PLAYBOOK = f"""\
name: algorithms-e2e
factors:
  strategy: [{", ".join(STRATEGIES)}]
fixed:
  model: mlp
  batch: 64
  workers: 2
  data: fashion-mnist
  latency: 1ms
  tau: 4            # an algorithm's setting as a fixed setting (used by easgd alone)
seed: 3
warmup: 2
train_steps: {TRAIN_STEPS}
eval_every: 30
target_accuracy: 0.3
algorithm: {{gossip_p: 0.1}}
"""


def test_every_algorithm_trains_and_moves_the_bytes_it_should(clean_machine, tmp_path):
    if datasets.load_test(datasets.FASHION_MNIST) is None or not Path(datasets.FASHION_MNIST_DIR).is_dir():
        pytest.skip("needs Debian's dataset-fashion-mnist (make install)")
    book = tmp_path / "algorithms.yaml"
    book.write_text(PLAYBOOK)
    out = tmp_path / "results"
    result = subprocess.run([*NETBENCH, "run", str(book), "--output", str(out), "--sample-resources", "0.5",
                             "--predict"], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = {r["strategy"]: r for r in (json.loads(p.read_text()) for p in (out / "runs").glob("*.json"))}
    assert set(runs) == set(STRATEGIES)
    # each run records the settings its strategy used (fixed: tau, algorithm: gossip_p, ps-ssp's
    # default staleness, easgd's alpha 0.9 / 2, ps-sync's backup workers: none), and results.csv has them as columns
    assert {s: runs[s]["algorithm"] for s in ("ps-ssp", "easgd", "gosgd", "ps-sync")} == \
        {"ps-ssp": {"staleness": 3}, "easgd": {"tau": 4, "elastic_alpha": 0.45}, "gosgd": {"gossip_p": 0.1},
         "ps-sync": {"backup_workers": 0}}
    with open(out / "results.csv", newline="") as fh:
        rows = {r["strategy"]: r for r in csv.DictReader(fh)}
    assert (rows["easgd"]["tau"], rows["easgd"]["elastic_alpha"], rows["allreduce"]["tau"]) == ("4", "0.45", "")
    for strategy, run in runs.items():
        assert run["status"] == "ok", (strategy, run["error"])
        # trained from a fresh model: ten classes, so chance is 0.1
        assert run["test_accuracy"] is not None and run["test_accuracy"] > 0.3, (strategy, run["accuracy_curve"])
        assert [p["step"] for p in run["accuracy_curve"]] == [30, 60], strategy
        assert run["steps_to_target"] in (30, 60) and run["time_to_target_s"] > 0, strategy
        if strategy == "ps":
            continue  # TF's own protocol; its workers also read every variable each step
        # what the workers' nodes sent over the run, in models per worker-step; 1 model of slack
        # per worker for worker 0's initial weights and TCP/IP headers (a few %)
        workers = [u for u in run["resources"] if u["role"] == "worker"]
        assert len(workers) == 2, (strategy, run["resources"])
        sent = sum(u["tx_bytes"] for u in workers) / run["model_bytes"] / (2 * TRAIN_STEPS)
        expected = model_transfers_per_step(strategy, 2, gossip_p=0.1, tau=4)
        assert expected * 0.5 - 0.02 < sent < expected * 1.15 + 2 / TRAIN_STEPS, (strategy, sent, expected)
        if strategy == "easgd":  # the curve scores the centre variable, the spread the replicas
            centre = [e for e in run["events"] if e["event"] == "eval" and e.get("of") == "centre"]
            assert [(e["step"], e["accuracy"]) for e in centre] == \
                [(p["step"], p["accuracy"]) for p in run["accuracy_curve"]], (centre, run["accuracy_curve"])
            assert all(p["spread"] is not None for p in run["accuracy_curve"])
        if strategy in ("gosgd", "adpsgd"):
            assert all(p["spread"] is not None for p in run["accuracy_curve"]), strategy
        if strategy in ("ps-sync", "ps-async", "ps-ssp"):
            steps = [e for e in run["events"] if e["event"] == "step" and e.get("phase") == "measured"]
            assert all("wait" in e for e in steps), strategy
            if strategy == "ps-sync":  # one version per round, answered every step: every gradient was fresh
                assert {e.get("staleness") for e in steps} == {0}
            else:  # pushes in flight (ps-ssp: S = 3, ps-async: one, its pipeline 0): a step takes the answers
                # that came (none, one or more), to updates computed on older weights; a worker
                # with `depth` pushes unanswered blocks for one, so at least one step in depth + 1
                # of each worker's takes an answer (how many more depends on the replies' timing:
                # 63-91 % of steps in a 200-step run, under half in a short one on a busy machine)
                depth = pipeline_depth(strategy, 3)
                for worker in (0, 1):
                    mine = [e for e in steps if e.get("worker", 0) == worker]
                    answered = [e["staleness"] for e in mine if "staleness" in e]
                    assert len(mine) > 0 and len(answered) >= len(mine) // (depth + 1), (strategy, worker, answered)
                answered = [e["staleness"] for e in steps if "staleness" in e]
                assert max(answered) > 0, answered
            assert run["idle_ratio"] is not None and run["wait_time_mean_s"] is not None
    # the exchange protocol was calibrated before the first point (a request-reply per size
    # between two worker nodes, the nodes' TCP limits), briefly, and every run is predicted
    calibration = json.loads((out / "manifest.json").read_text())["calibration"]
    exchange = calibration["exchange"]
    assert [s["bytes"] for s in exchange["sizes"]] == [65536, 262144, 1048576, 4194304], exchange
    assert exchange["beta_s_per_byte_moved"] > 0 and exchange["window_bytes"] > 0 and exchange["seconds"] < 10
    assert exchange["tcp_limits"]["tcp_wmem"][2] > 0 and not calibration["errors"]
    with open(out / "results.csv", newline="") as fh:
        assert all(float(r["predicted_step_s"]) > 0 for r in csv.DictReader(fh))
    # the synchronous algorithms' servers serve, on a node of their own (not a worker's)
    assert {u["role"] for u in runs["ps-sync"]["resources"]} == {"worker", "ps"}
    assert {u["role"] for u in runs["gosgd"]["resources"]} == {"worker"}
