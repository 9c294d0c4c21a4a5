"""bench/loss_placement.py's pure parts: the topologies it writes load as netbench's own, the
rounds rotate the placements, and the table takes each placement's ratio to no loss."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

from netbench.model.pairs_file import load_pair_topology

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load():
    spec = importlib.util.spec_from_file_location("loss_placement", BENCH / "loss_placement.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["loss_placement"] = module
    spec.loader.exec_module(module)
    return module


lp = _load()


def args(**kw) -> argparse.Namespace:
    base = dict(congestion_control="cubic,bbr", batch_sizes="32", loss="1%", repeat=3, warmup=20, seconds="15s",
                placements="none,every,worker,server")
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize("placement, lossy", [("none", set()), ("every", {"n1", "n2", "n3"}),
                                              ("worker", {"n1"}), ("server", {"n2"})])
def test_each_placement_loses_on_its_nodes_egress_only(tmp_path, placement, lossy):
    path = tmp_path / f"{placement}.yaml"
    path.write_text(lp.topology(placement, "1%"))
    topology = load_pair_topology(path)
    assert topology.nodes == ("n1", "n2", "n3")
    assert len(topology.links) == 6  # every ordered pair, each at 1 ms and 1 Gbit/s
    for link in topology.links:
        assert (link.profile.delay_us, link.profile.rate_bps) == (1_000, 1_000_000_000)
        assert link.profile.loss == (0.01 if link.src in lossy else 0.0), (link.src, link.dst)


def test_rounds_rotate_the_placements_and_write_one_topology_each(tmp_path):
    plan = lp.sweeps(args(congestion_control="cubic"), tmp_path)
    assert [name for name, _ in plan] == [
        "none-cubic-b32/r0", "every-cubic-b32/r0", "worker-cubic-b32/r0", "server-cubic-b32/r0",
        "every-cubic-b32/r1", "worker-cubic-b32/r1", "server-cubic-b32/r1", "none-cubic-b32/r1",
        "worker-cubic-b32/r2", "server-cubic-b32/r2", "none-cubic-b32/r2", "every-cubic-b32/r2"]
    argv = dict(plan)["worker-cubic-b32/r0"]
    assert argv[argv.index("--topology") + 1] == str(tmp_path / "loss-worker.yaml")
    assert argv[argv.index("--congestion-control") + 1] == "cubic" and "--repeat" not in argv
    assert sorted(p.name for p in tmp_path.glob("*.yaml")) == [f"loss-{p}.yaml" for p in sorted(lp.PLACEMENTS)]
    # a subset keeps the baseline
    assert {n.split("-")[0] for n, _ in lp.sweeps(args(placements="worker", repeat=1), tmp_path)} == {"none", "worker"}
    with pytest.raises(SystemExit, match="--placements: unknown nowhere"):
        lp.sweeps(args(placements="nowhere"), tmp_path)


def test_the_table_gives_each_placement_its_ratio_to_no_loss(tmp_path):
    def results(folder: str, rates: list[float], status: str = "ok") -> None:
        for k, rate in enumerate(rates):
            path = tmp_path / folder / f"r{k}" / "results.csv"
            path.parent.mkdir(parents=True)
            path.write_text(f"run_id,images_per_sec,status\nr000,{rate},{status}\n")

    results("none-cubic-b32", [390.0, 394.0, 387.0])
    results("every-cubic-b32", [126.0, 115.0, 132.0])
    results("worker-cubic-b32", [195.0, 195.0, 195.0])
    results("server-cubic-b32", [1.0], status="failed")  # a failed run counts for nothing
    row = next(line for line in lp.table(tmp_path, args(congestion_control="cubic")).splitlines()
               if line.startswith("| cubic"))
    assert row == ("| cubic | 32 | 390 (387-394) | 126 (115-132) | 0.32 | 195 (195-195) | 0.50 | - | - |")
