"""Sweeps and playbooks over a per-pair topology: `sweep --topology FILE --scale LIST`, a
playbook's `topology:` and `scale` factor, the launches' order by scale, and what results,
records, the manifest and reports hold (runner.run_sweep on tests/fakes/sweep.py)."""

from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner

from netbench.cli import common
from netbench.cli.app import main
from netbench.experiment.launch import Settle, plan_launches, run_follows
from netbench.experiment.runner import SweepConfig, run_sweep
from netbench.jobs.launch import Timeouts
from netbench.experiment.store import SCHEMA_VERSION
from netbench.model import design
from netbench.model import playbook as pb
from netbench.model.job import JobSpec
from netbench.model.pairs import scaled
from netbench.model.pairs_file import load_pair_topology, pair_topology_from_mapping
from netbench.report import group_observations, load_observations
from netbench.state.journal import Journal
from tests.fakes.sweep import SyntheticTestbed

JOB = JobSpec(warmup=2, steps=3)
TWO = "profiles/topologies/two-regions.yaml"
FAR = ("name: far\ngroups:\n  a: [n1]\n  b: [n2]\nlinks:\n  a-b: {delay: 20ms}\n")


@pytest.fixture
def regions():
    return load_pair_topology(TWO)


def _runs(pairs, scales=(1, 2, 4), repeat=1, workers=2):
    return design.topology_design(pairs, scales, repeat, JOB, workers).runs()


# ---------------------------------------------------------------- the design (pure)

def test_each_scale_is_a_point_with_the_topology_scaled_and_a_null_profile_named_after_it(regions):
    runs = _runs(regions, (1, 2, 0.5))
    assert [r.profile.name for r in runs] == ["two-regions", "two-regions-x2", "two-regions-x0.5"]
    assert all(r.profile.is_null for r in runs)
    assert [r.pairs.scale for r in runs] == [1, 2, 0.5]
    assert runs[1].pairs == scaled(regions, 2)
    assert runs[1].pairs.link("n1", "n3").delay_us == 50_000 and runs[1].pairs.link("n1", "n2").delay_us == 4_000
    assert runs[1].pairs.link("n1", "n3").rate_bps == regions.link("n1", "n3").rate_bps  # rates unchanged


def test_a_launch_goes_from_the_largest_scale_down(regions):
    runs = _runs(regions, (1, 4, 2, 0.5))
    for seed in range(5):
        (plan,) = plan_launches(runs, seed, "descending")
        assert [r.pairs.scale for r in plan.runs] == [4, 2, 1, 0.5]
    one, two = runs[0], runs[2]
    assert run_follows(two, one) and not run_follows(one, two)
    plain = design.plan_sweep(design.Profile(name="base"), design.SweepLevels(delay_us=(1000,)), job=JOB)[0]
    assert not run_follows(two, plain) and not run_follows(plain, two)  # a topology never chains with a profile


# ---------------------------------------------------------------- a whole sweep (synthetic testbed)

def _sweep(tmp_path, runs, pairs, order="descending"):
    testbed = SyntheticTestbed(Journal(tmp_path / "state"))
    config = SweepConfig(sweep_id="s", runs=tuple(runs), job=JOB, workers=2, output=tmp_path / "out",
                         settle=Settle(steps=1, seconds=0.0), order_seed=3, order=order, topology=pairs,
                         timeouts=Timeouts(startup_s=30, step_s=30))
    results = run_sweep(config, testbed=testbed)
    return testbed, results


def test_a_scale_sweep_applies_the_scaled_topologies_widest_first_and_records_them(tmp_path, regions):
    runs = _runs(regions, (1, 2, 4))
    testbed, results = _sweep(tmp_path, runs, regions)
    assert [r.status for r in results] == ["ok"] * 3
    assert [p.scale for p in testbed.applied_pairs] == [4, 2, 1]  # one launch, descending
    assert testbed.applied_pairs == [scaled(regions, 4), scaled(regions, 2), regions]
    assert len(testbed.topology.nodes) == 4  # every node the topology names, though 2 workers need 2
    out = tmp_path / "out"
    rows = {row["run_id"]: row for row in csv.DictReader(open(out / "results.csv", newline=""))}
    assert [(rows[r.run_id]["profile"], rows[r.run_id]["topology"], rows[r.run_id]["scale"]) for r in runs] == [
        ("two-regions", "two-regions", "1"), ("two-regions-x2", "two-regions", "2"),
        ("two-regions-x4", "two-regions", "4")]
    record = json.loads((out / "runs" / "r001.json").read_text())
    assert record["topology"] == scaled(regions, 2).to_json() and record["schema_version"] == SCHEMA_VERSION
    far = next(link for link in record["topology"]["links"] if link["src"] == "n1" and link["dst"] == "n3")
    assert far["profile"]["delay_us"] == 50_000
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["topology"] == regions.to_json() and manifest["topology"]["scale"] == 1


def test_a_sweep_without_a_topology_leaves_the_columns_empty(tmp_path):
    runs = design.plan_sweep(design.Profile(name="base"), design.SweepLevels(delay_us=(1000,)), job=JOB)
    testbed, _ = _sweep(tmp_path, runs, None)
    (row,) = csv.DictReader(open(tmp_path / "out" / "results.csv", newline=""))
    assert row["topology"] == "" and row["scale"] == ""
    assert json.loads((tmp_path / "out" / "runs" / "r000.json").read_text())["topology"] is None
    assert "topology" not in json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert testbed.applied_pairs == [None]


def test_the_report_has_one_point_per_scale(tmp_path, regions):
    _sweep(tmp_path, _runs(regions, (1, 2)), regions)
    groups = group_observations(load_observations(tmp_path / "out"))
    assert sorted((g.get("topology"), g.get("scale")) for g in groups) == [("two-regions", 1.0),
                                                                        ("two-regions", 2.0)]
    from netbench.report.summary import write_report

    written = write_report(tmp_path / "out", tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| scale | n | geo. mean images/s |" in text and "Throughput along scale" in text
    assert any(p.name == "throughput-scale.png" for p in written.files)


# ---------------------------------------------------------------- the sweep command

@pytest.fixture
def cli(monkeypatch, tmp_path):
    monkeypatch.setattr(common, "require_root", lambda: None)
    return tmp_path


def invoke(*args):
    return CliRunner().invoke(main, ["sweep", *args], terminal_width=300)


@pytest.mark.parametrize("args, message", [
    (["--scale", "1,2"], "flag --scale: only with --topology"),
    (["--topology", TWO, "--latency", "1,2ms"], "flag --topology: not with --latency:"),
    (["--topology", TWO, "--bandwidth", "1gbit", "--loss", "1%"], "flag --topology: not with --bandwidth, --loss:"),
    (["--topology", TWO, "--schedule", "x.yaml"], "not with --schedule"),
    (["--topology", TWO, "--profile", "profiles/lan.yaml"], "not with --profile"),
    (["--topology", TWO, "--inventory", "hosts.yaml"], "flag --topology: not with --inventory: a sweep over hosts "
                                                      "cannot apply a topology yet"),
    (["--topology", TWO, "--scale", "1,x"], "flag --scale: 'x' is not a number"),
    (["--topology", TWO, "--scale", "0,1"], "flag --scale: 0 is not a number above 0"),
    (["--topology", TWO, "--scale", "2,2"], "flag --scale: 2 is given twice"),
    (["--topology", TWO, "--scale", "100000"], "not a number above 0 (at most 1000)"),
    (["--topology", TWO, "--scale", "500"], "flag --scale:"),  # 12.5 s one-way: over the profile limits
    (["--topology", "nowhere.yaml"], "nowhere.yaml"),
])
def test_bad_topology_flags_are_one_line_errors(cli, args, message):
    result = invoke(*args, "--dry-run", "--output", str(cli / "out"))
    assert result.exit_code != 0
    assert message in result.output, result.output
    assert "Traceback" not in result.output


def test_a_topology_whose_nodes_the_testbed_lacks_is_refused(cli):
    (cli / "odd.yaml").write_text("name: odd\ngroups:\n  a: [x1]\n  b: [n2]\nlinks:\n  a-b: {delay: 5ms}\n")
    result = invoke("--topology", str(cli / "odd.yaml"), "--dry-run", "--output", str(cli / "out"))
    assert result.exit_code != 0 and "groups: a: no node x1 in the testbed" in result.output, result.output


def test_dry_run_prints_every_pairs_settings_for_each_scale(cli):
    (cli / "far.yaml").write_text(FAR)
    result = invoke("--topology", str(cli / "far.yaml"), "--scale", "1,2", "--dry-run", "--backend", "userspace",
                    "--output", str(cli / "out"), "--order-seed", "1")
    assert result.exit_code == 0, result.output
    text = result.output
    assert "r000  far  repeat 0" in text and "r001  far-x2  repeat 0" in text
    first, second = text.split("r001  far-x2")[0].split("r000  far")[1], text.split("r001  far-x2")[1]
    assert "20ms" in first and "40ms" in second and "40ms" not in first
    assert "launch 0 (job configuration 0): r001 r000" in text  # the larger scale first
    assert not (cli / "out").exists()


# ---------------------------------------------------------------- playbooks

def _book(tmp_path, text, topology=FAR):
    (tmp_path / "topo").mkdir(exist_ok=True)
    (tmp_path / "topo" / "far.yaml").write_text(topology)
    (tmp_path / "plays").mkdir(exist_ok=True)
    path = tmp_path / "plays" / "book.yaml"
    path.write_text(text)
    return pb.load_playbook(path)


def test_a_playbook_sweeps_a_topologys_scale(tmp_path):
    book = _book(tmp_path, "name: geo\ntopology: ../topo/far.yaml\norder: as-written\n"
                           "factors: {scale: [1, 2], workers: [2]}\nfixed: {model: mlp}\n")
    assert book.topology.name == "far" and book.topology_ref == "../topo/far.yaml"
    runs = design.expand(book, seed=1)
    assert [r.profile.name for r in runs] == ["far", "far-x2"]
    assert [r.pairs.link("n1", "n2").delay_us for r in runs] == [20_000, 40_000]
    assert design.describe_settings(runs[1].settings)["scale"] == "2"
    record = design.plan_record(book, 1, runs)
    assert record["topology"]["name"] == "far" and record["runs"][1]["scale"] == 2.0 and "scale" not in record["runs"][0]
    other = _book(tmp_path, "name: geo\ntopology: ../topo/far.yaml\norder: as-written\n"
                            "factors: {scale: [1, 2], workers: [2]}\nfixed: {model: mlp}\n",
                  topology=FAR.replace("20ms", "30ms"))
    assert design.design_digest(other, design.expand(other, 1)) != record["digest"]  # an edited topology


def test_scale_may_be_fixed(tmp_path):
    book = _book(tmp_path, "topology: ../topo/far.yaml\nfixed: {scale: 3}\nfactors: {batch: [32, 64]}\n")
    assert {r.pairs.scale for r in design.expand(book, 0)} == {3.0}
    assert {r.profile.name for r in design.expand(book, 0)} == {"far-x3"}


@pytest.mark.parametrize("text, message", [
    ("topology: ../topo/far.yaml\nfactors: {latency: [1ms, 2ms]}\n", "book.yaml: factors.latency: not with topology"),
    ("topology: ../topo/far.yaml\nfixed: {bandwidth: 1gbit}\nfactors: {scale: [1]}\n",
     "book.yaml: fixed.bandwidth: not with topology"),
    ("topology: ../topo/far.yaml\nfactors: {scale: [1]}\nextra_runs: [{loss: 1%}]\n",
     "book.yaml: extra_runs[0].loss: not with topology"),
    ("factors: {scale: [1, 2]}\n", "book.yaml: factors.scale: scale multiplies the delays of a topology"),
    ("topology: ../topo/far.yaml\nfactors: {scale: [0, 1]}\n", "book.yaml: factors.scale: must be a number above 0"),
    ("topology: ../topo/far.yaml\nfactors: {scale: [1, 1]}\n", "factors.scale: repeated level"),
    ("topology: ../topo/far.yaml\nfactors: {scale: [1, 900]}\n", "book.yaml: factors.scale: "),
    ("topology: ../topo/none.yaml\nfactors: {scale: [1]}\n", "book.yaml: topology: "),
    ("topology: 3\nfactors: {scale: [1]}\n", "book.yaml: topology: must be a path to a topology file"),
    ("topology: ../topo/far.yaml\nprofile: x.yaml\nfactors: {scale: [1]}\n", "book.yaml: profile: not with topology"),
])
def test_bad_topology_playbooks_are_one_line_errors(tmp_path, text, message):
    with pytest.raises(pb.PlaybookError) as info:
        _book(tmp_path, text)
    assert message in info.value.message and "\n" not in info.value.message


def test_a_playbook_topology_runs_in_a_sweep_in_descending_scale(tmp_path):
    book = _book(tmp_path, "name: geo\ntopology: ../topo/far.yaml\norder: as-written\nwarmup: 2\nsteps: 3\n"
                           "factors: {scale: [1, 2, 4]}\n")
    runs = design.expand(book, seed=0)
    testbed, results = _sweep(tmp_path, runs, book.topology)
    assert [r.status for r in results] == ["ok"] * 3
    assert [p.link("n1", "n2").delay_us for p in testbed.applied_pairs] == [80_000, 40_000, 20_000]


def test_playbook_dry_run_shows_the_scale_column(cli, monkeypatch):
    (cli / "far.yaml").write_text(FAR)
    (cli / "book.yaml").write_text("name: geo\ntopology: far.yaml\nfactors: {scale: [1, 2]}\nseed: 1\n")
    result = CliRunner().invoke(main, ["run", str(cli / "book.yaml"), "--dry-run", "--output", str(cli / "o")],
                                terminal_width=300)
    assert result.exit_code == 0, result.output
    assert "scale" in result.output and "far-x2" in result.output


def test_a_topology_playbook_is_refused_on_hosts(cli):
    (cli / "far.yaml").write_text(FAR)
    (cli / "hosts.yaml").write_text("hosts: []\n")
    (cli / "book.yaml").write_text("name: geo\ntopology: far.yaml\nfactors: {scale: [1, 2]}\nseed: 1\n")
    result = CliRunner().invoke(main, ["run", str(cli / "book.yaml"), "--inventory", str(cli / "hosts.yaml"),
                                       "--output", str(cli / "o")], terminal_width=300)
    assert result.exit_code != 0 and "topology: not with --inventory" in result.output, result.output


def test_pair_topology_from_mapping_matches_the_file(tmp_path):
    (tmp_path / "far.yaml").write_text(FAR)
    import yaml

    assert load_pair_topology(tmp_path / "far.yaml") == pair_topology_from_mapping(
        yaml.safe_load(FAR), str(tmp_path / "far.yaml"))
