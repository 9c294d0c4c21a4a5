"""A campaign's one answer: the shards merged into merged/ (experiment/merge.py), the report
refusing an incomplete design unless --partial, every row naming where it ran, and the machines
compared (report/machines.py)."""

from __future__ import annotations

import csv
import math

import pytest
from click.testing import CliRunner

from netbench.cli import app as cli
from netbench.experiment.merge import merge
from netbench.report.load import Observation
from netbench.report.machines import machine_effects
from tests.unit import campaign_folders as cf


def rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def report(*args):
    return CliRunner().invoke(cli.main, ["report", *args])


def test_a_complete_campaign_merges_every_design_run_with_where_it_ran(tmp_path):
    record, runs = cf.make(tmp_path, cf.four_points(), 2)
    cf.record_all(tmp_path, record, runs)
    merged = merge(tmp_path)
    assert merged.complete and merged.runs == 8 and merged.folder == tmp_path / "merged"
    got = rows(merged.folder / "results.csv")
    assert sorted(r["run_id"] for r in got) == [r.run_id for r in runs]
    shard_of = {e["run_id"]: e["shard"] for e in record["runs"]}
    for row in got:
        shard = shard_of[row["run_id"]]
        assert (row["host"], row["shard"], row["privilege"], row["cores"], row["cpu_model"]) == \
            (f"node{shard + 1}", f"{shard}/2", "rootless", "8", "Test CPU")
    assert (merged.folder / "playbook.json").is_file() and (merged.folder / "runs" / "r000.json").is_file()
    merge(tmp_path)  # made anew: the same, nothing of the old one left beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["campaign.json", "merged", "shard-0", "shard-1"]


def test_the_report_of_a_campaign_names_its_machines(tmp_path):
    record, runs = cf.make(tmp_path, cf.four_points(repeat=3), 2)
    cf.record_all(tmp_path, record, runs)
    result = report(str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "merged 12 of 12 runs" in result.stdout
    text = (tmp_path / "report" / "report.md").read_text()
    assert text.startswith(f"# Report: {tmp_path.name}\n")
    assert "A campaign of 2 shards: all 12 runs of the design" in text
    machines = text[text.index("## Machines"):]
    assert "| 0 | node1 | Test CPU | 8 | 6.1.0 | rootless | cubic | 8 | 4 |" in machines  # reps 0 and 2 on shard 0
    assert "| 1 | node2 | Test CPU | 8 | 6.1.0 | rootless | cubic | 4 | 4 |" in machines
    assert "1.000x" in machines  # the same throughput on both: no machine effect
    assert "different TCP congestion controls" not in machines


def test_shards_whose_nodes_used_other_congestion_controls_are_said_to(tmp_path):
    # a shard without root on a host that does not allow cubic keeps the host's default (bbr)
    record, runs = cf.make(tmp_path, cf.four_points(repeat=2), 2)
    cf.record_all(tmp_path, record, runs, congestion=lambda shard: "bbr" if shard else "cubic")
    assert report(str(tmp_path)).exit_code == 0
    machines = (tmp_path / "report" / "report.md").read_text().split("## Machines", 1)[1]
    assert "| 1 | node2 | Test CPU | 8 | 6.1.0 | rootless | bbr |" in machines
    assert "different TCP congestion controls (bbr, cubic)" in " ".join(machines.split())


def test_an_incomplete_campaign_is_refused_naming_what_is_missing(tmp_path):
    record, runs = cf.make(tmp_path, cf.four_points(), 2)
    entries = record["runs"]
    for entry in entries[:-2]:
        cf.record_run(tmp_path, record, runs, entry["run_id"])
    cf.record_run(tmp_path, record, runs, entries[-2]["run_id"], status="failed", error="step timeout")
    result = report(str(tmp_path))
    assert result.exit_code == 2
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"error: {tmp_path}: the campaign is incomplete, 2 of the design's 8 runs missing: ")
    for entry in entries[-2:]:
        assert entry["run_id"] in first
    assert "(not run)" in first and "(failed: step timeout)" in first
    assert not (tmp_path / "report").exists()
    result = report(str(tmp_path), "--partial")
    assert result.exit_code == 0, result.output
    text = (tmp_path / "report" / "report.md").read_text()
    assert "**Incomplete: 2 of the design's 8 runs missing" in text and "the design is not complete" in text


def test_extra_reference_runs_compare_machines_but_stay_out_of_the_design(tmp_path):
    b = cf.four_points(repeat=1)  # 4 runs, 3 shards: by points, the reference point on every shard
    record, runs = cf.make(tmp_path, b, 3)
    assert record["by"] == "points"
    extras = [e for e in record["runs"] if e["reference"]]
    assert extras and all(e["point"] == 0 for e in extras)
    slower = {0: 1.0, 1: 1.0, 2: 0.8}  # shard 2's machine is 20 % slower
    for entry in record["runs"]:
        cf.record_run(tmp_path, record, runs, entry["run_id"], ips=500.0 * slower[entry["shard"]])
    merged = merge(tmp_path)
    assert merged.complete and sorted(r["run_id"] for r in rows(merged.folder / "results.csv")) == \
        [r.run_id for r in runs]
    result = report(str(tmp_path))
    assert result.exit_code == 0, result.output
    machines = (tmp_path / "report" / "report.md").read_text().split("## Machines")[1]
    assert "the reference point" in machines
    expected = 0.8 / (0.8 * 1.0 * 1.0) ** (1 / 3)  # shard 2 against every shard's reference runs
    assert f"{expected:.3f}x" in machines and "one point (the reference)" in machines


def obs(run_id: str, point: int, ips: float) -> Observation:
    return Observation(run_id=run_id, factors=(("latency_ms", point),), repeat=0, status="ok", images_per_sec=ips)


def test_a_machine_slower_at_every_point_has_an_effect_whose_interval_excludes_one():
    by_shard = {0: [obs(f"a{p}", p, 100.0 * (p + 1) * (1 + 0.01 * p)) for p in range(5)],
                1: [obs(f"b{p}", p, 90.0 * (p + 1) * (1 - 0.01 * p)) for p in range(5)]}
    fast, slow = machine_effects(by_shard, {0: {"host": "a"}, 1: {"host": "b"}})
    assert fast.facts == {"host": "a"} and len(fast.ratios) == 5 and fast.runs == 5
    assert slow.effect.mean == pytest.approx(math.sqrt(0.9), rel=0.02)
    assert slow.effect.high < 1 < fast.effect.low
    # a point only one machine measured compares nothing
    alone = machine_effects({0: [obs("a", 0, 100.0)], 1: [obs("b", 1, 50.0)]}, {})
    assert [m.effect for m in alone] == [None, None]
