"""The training algorithms' own settings (staleness, tau, elastic_alpha, gossip_p) as a playbook's
factors and fixed settings: parsing and its errors, crossing, each run's job and launch, the
run record and results.csv, and the report's grouping and figures."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from netbench import report
from netbench.cli import app as cli
from netbench.experiment.launch import group_key, plan_launches
from netbench.experiment.runner import make_result
from netbench.experiment.store import CSV_COLUMNS, ResultStore, read_json
from netbench.jobs.launch import JobOutcome
from netbench.model import design
from netbench.model.design import expand
from netbench.model.job import JobSpec, algorithm_settings, worker_argv
from netbench.model.playbook import PlaybookError, playbook_from_mapping
from tests.unit.report_designs import record, write_results
from tests.unit.rootless_fakes import no_userns


@pytest.fixture
def not_root(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    no_userns(monkeypatch)  # a host where a user gets no testbed: stops at the privilege check
    monkeypatch.chdir(tmp_path)


def book(**data):
    return playbook_from_mapping({"seed": 1, "order": "as-written", **data}, "pb.yaml")


# ---------------------------------------------------------------- parsing and errors

def test_levels_are_parsed_and_reach_each_runs_job():
    b = book(factors={"strategy": ["ps-ssp"], "staleness": [0, 3, 10]})
    assert dict(b.factors)["staleness"] == (0, 3, 10)
    runs = expand(b, 1)
    assert [(r.settings.staleness, r.job.staleness) for r in runs] == [(0, 0), (3, 3), (10, 10)]
    assert [worker_argv(r.job)[worker_argv(r.job).index("--staleness") + 1] for r in runs] == ["0", "3", "10"]
    easgd = expand(book(factors={"strategy": ["easgd"], "tau": [1, 16]}, fixed={"elastic_alpha": 0.2}), 1)
    assert [(r.job.tau, r.job.elastic_alpha) for r in easgd] == [(1, 0.2), (16, 0.2)]
    gossip = expand(book(factors={"strategy": ["gosgd"], "gossip_p": [0, 0.5, 1]}), 1)
    assert [r.job.gossip_p for r in gossip] == [0.0, 0.5, 1.0]
    backup = expand(book(factors={"backup_workers": [0, 1]}, fixed={"strategy": "ps-sync", "workers": 3}), 1)
    assert [r.job.backup_workers for r in backup] == [0, 1]
    assert "--backup-workers" in worker_argv(backup[1].job) and "--backup-workers" not in worker_argv(backup[0].job)


@pytest.mark.parametrize("data, message", [
    ({"factors": {"strategy": ["ps-ssp"], "staleness": [-1]}}, "pb.yaml: factors.staleness: -1 is outside 0..10000"),
    ({"factors": {"strategy": ["ps-ssp"], "staleness": [1.5]}}, "pb.yaml: factors.staleness: must be a whole number"),
    ({"factors": {"strategy": ["easgd"], "tau": [0]}}, "pb.yaml: factors.tau: 0 is outside 1..100000"),
    ({"factors": {"strategy": ["easgd"], "elastic_alpha": [0]}},
     "pb.yaml: factors.elastic_alpha: must be a number in (0, 1], got 0"),
    ({"factors": {"strategy": ["gosgd"], "gossip_p": [0.1, 1.5]}},
     "pb.yaml: factors.gossip_p: must be a number in [0, 1], got 1.5"),
    ({"factors": {"strategy": ["gosgd"]}, "fixed": {"gossip_p": True}}, "pb.yaml: fixed.gossip_p: must be a number"),
    ({"factors": {"strategy": ["ps-ssp"], "staleness": [1, 1]}}, "pb.yaml: factors.staleness: repeated level"),
    ({"factors": {"strategy": ["ps-ssp"], "stalenes": [1]}}, "pb.yaml: factors.stalenes: unknown key"),
    # ps-sync's backup workers: fewer than the workers, wherever they are set
    ({"factors": {"backup_workers": [0, 3]}, "fixed": {"strategy": "ps-sync", "workers": 3}},
     "pb.yaml: factors.backup_workers: 3 backup workers with 3 workers: must be fewer than the workers"),
    ({"factors": {"workers": [2, 3]}, "fixed": {"strategy": "ps-sync"}, "algorithm": {"backup_workers": 2}},
     "pb.yaml: algorithm.backup_workers: 2 backup workers with 2 workers: must be fewer than the workers"),
    # the same key under algorithm: and as a setting: one value or many, never both
    ({"factors": {"strategy": ["ps-ssp"], "staleness": [0, 3]}, "algorithm": {"staleness": 2}},
     "pb.yaml: factors.staleness: staleness is set under algorithm: too"),
    ({"fixed": {"strategy": "gosgd", "gossip_p": 0.2}, "algorithm": {"gossip_p": 0.1}},
     "pb.yaml: fixed.gossip_p: gossip_p is set under algorithm: too"),
    ({"factors": {"strategy": ["ps-sync"]}, "extra_runs": [{"strategy": "ps-ssp", "staleness": 9}],
      "algorithm": {"staleness": 2}}, "pb.yaml: extra_runs[0].staleness: staleness is set under algorithm: too"),
    # a setting no run's strategy uses
    ({"factors": {"strategy": ["gosgd"], "staleness": [3]}},
     "pb.yaml: factors.staleness: no run uses it: staleness is strategy ps-ssp's setting, and no run is ps-ssp"),
    ({"factors": {"latency": ["1ms"]}, "fixed": {"strategy": "ps-sync", "tau": 4}},
     "pb.yaml: fixed.tau: no run uses it: tau is strategy easgd's setting"),
    # crossed with a strategy that ignores it, its runs would repeat
    ({"factors": {"strategy": ["ps-ssp", "gosgd"], "staleness": [0, 3]}},
     "pb.yaml: factors.staleness: strategy gosgd ignores staleness, so its runs would repeat"),
    # a user's command is its own job
    ({"factors": {"staleness": [0, 3]}, "command": ["python", "train.py"]}, "pb.yaml: factors.staleness: not with command:"),
])
def test_bad_settings_are_one_line_errors_naming_the_key(data, message):
    with pytest.raises(PlaybookError) as err:
        playbook_from_mapping(data, "pb.yaml")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_algorithm_values_alone_still_reach_the_job_and_the_record():
    b = book(factors={"strategy": ["ps-ssp", "gosgd"]}, algorithm={"staleness": 5, "gossip_p": 0.3})
    runs = expand(b, 1)
    assert [(r.job.strategy, r.job.staleness, r.job.gossip_p) for r in runs] == [("ps-ssp", 5, 0.3), ("gosgd", 5, 0.3)]
    assert [algorithm_settings(r.job, r.workers) for r in runs] == [{"staleness": 5}, {"gossip_p": 0.3}]
    assert all(r.settings.staleness is None for r in runs)  # not a design setting: the digest is as before


# ---------------------------------------------------------------- crossing

def test_a_strategy_that_ignores_the_setting_gets_one_point_through_extra_runs():
    b = book(factors={"strategy": ["ps-ssp"], "staleness": [0, 3, 10], "latency": ["1ms", "50ms"]},
             extra_runs=[{"strategy": "ps-sync"}])
    runs = expand(b, 1)
    points = [(r.settings.strategy, r.settings.staleness, r.settings.delay_us) for r in runs]
    assert points == [("ps-ssp", s, d) for s in (0, 3, 10) for d in (1000, 50_000)] + \
        [("ps-sync", None, 1000), ("ps-sync", None, 50_000)]  # ps-sync once per latency, not per staleness
    cells = [design.describe_settings(r.settings)["staleness"] for r in runs]
    assert cells == ["0", "0", "3", "3", "10", "10", "-", "-"]
    # a fixed setting applies to the runs whose strategy uses it only
    mixed = expand(book(factors={"strategy": ["ps-sync", "ps-ssp"]}, fixed={"staleness": 1}), 1)
    assert [(r.settings.staleness, r.job.staleness) for r in mixed] == [(None, 3), (1, 1)]


def test_the_settings_are_in_the_design_digest_and_unset_ones_leave_it_as_before():
    def digest(**data):
        b = book(**data)
        return design.design_digest(b, expand(b, 1))

    assert digest(factors={"strategy": ["ps-ssp"], "staleness": [0, 3]}) != \
        digest(factors={"strategy": ["ps-ssp"], "staleness": [0, 4]})
    b = book(factors={"strategy": ["ps-sync", "ps-ssp"]})
    record = design.plan_record(b, 1, expand(b, 1))
    assert all(not {"staleness", "tau", "elastic_alpha", "gossip_p"} & set(run) for run in record["runs"])
    b = book(factors={"strategy": ["ps-ssp"], "staleness": [0, 3]})
    assert [run["staleness"] for run in design.plan_record(b, 1, expand(b, 1))["runs"]] == [0, 3]


# ---------------------------------------------------------------- launches

def test_runs_of_different_settings_never_share_a_launch():
    b = book(factors={"strategy": ["ps-ssp"], "staleness": [0, 3], "latency": ["1ms", "10ms", "50ms"]})
    runs = expand(b, 1)
    plans = plan_launches(runs, seed=2)
    for plan in plans:
        assert len({r.job.staleness for r in plan.runs}) == 1
    assert {r.job.staleness for p in plans for r in p.runs} == {0, 3}
    # the latencies of one staleness do share a launch (the setting, not the network, restarts it)
    assert len({group_key(r) for r in runs}) == 2


# ---------------------------------------------------------------- record and results.csv

def test_the_record_and_results_csv_carry_the_setting_the_run_used(tmp_path):
    runs = expand(book(factors={"strategy": ["ps-ssp", "easgd", "ps-sync"]}, fixed={"workers": 3}), 1)
    store = ResultStore(tmp_path)
    store.create()
    for run in runs:
        store.add(make_result(run, "userspace", JobOutcome("failed", (), "x"), 0.0, 1.0))
    assert CSV_COLUMNS[-6:] == ("staleness", "tau", "elastic_alpha", "gossip_p", "backup_workers", "pipeline")
    with open(tmp_path / "results.csv", newline="") as fh:
        rows = {r["strategy"]: r for r in csv.DictReader(fh)}
    cells = {s: (r["staleness"], r["tau"], r["elastic_alpha"], r["gossip_p"], r["backup_workers"])
             for s, r in rows.items()}
    # easgd's alpha unset: the run used 0.9 / workers, and says so; ps-sync its backup workers (none)
    assert cells == {"ps-ssp": ("3", "", "", "", ""), "easgd": ("", "4", "0.3", "", ""),
                     "ps-sync": ("", "", "", "", "0")}
    records = {r["strategy"]: r for r in map(read_json, store.record_paths())}
    assert [records[s]["algorithm"] for s in ("ps-ssp", "easgd", "ps-sync")] == \
        [{"staleness": 3}, {"tau": 4, "elastic_alpha": 0.3}, {"backup_workers": 0}]


# ---------------------------------------------------------------- report

def _staleness_study(folder: Path, latencies=(10.0,)) -> Path:
    records, i = [], 0
    for staleness, ips in ((0, 400.0), (3, 700.0), (10, 900.0)):
        for delay in latencies:
            for rep in range(3):
                records.append(record(f"r{i:03d}", strategy="ps-ssp", delay_ms=delay, repeat=rep, ips=ips + rep,
                                      algorithm={"staleness": staleness}))
                i += 1
    for delay in latencies:
        for rep in range(3):
            records.append(record(f"r{i:03d}", strategy="ps-sync", delay_ms=delay, repeat=rep, ips=300.0 + rep))
            i += 1
    return write_results(folder, records)


def test_the_report_groups_by_the_setting():
    o = report.observation_from_record(record("r000", strategy="ps-ssp", algorithm={"staleness": 3}))
    assert (o.get("staleness"), o.get("tau"), o.get("gossip_p")) == (3, None, None)
    # the setting belongs to its strategy: another's record says nothing of it
    other = report.observation_from_record(record("r001", strategy="ps-sync", algorithm={"staleness": 3}))
    assert other.get("staleness") is None
    # an older record without `algorithm`: the playbook's setting for the run
    planned = report.observation_from_record(record("r002", strategy="gosgd"), {"gossip_p": 0.5})
    assert planned.get("gossip_p") == 0.5


def test_a_staleness_study_is_grouped_tabled_and_drawn_on_a_numeric_axis(tmp_path):
    pytest.importorskip("matplotlib")
    folder = _staleness_study(tmp_path / "results")
    groups = report.group_observations(report.load_observations(folder), 0.95)
    levels = sorted((g.get("strategy"), g.get("staleness") if g.get("staleness") is not None else -1) for g in groups)
    assert levels == [("ps-ssp", 0), ("ps-ssp", 3), ("ps-ssp", 10), ("ps-sync", -1)]
    assert "staleness" in report.varying(groups)
    written = report.write_report(folder, tmp_path / "report")
    names = {p.name for p in written.files}
    assert {"throughput-staleness.png", "throughput-strategy.png"} <= names, names
    fig = report.build_metric_figure(groups, report.THROUGHPUT, "staleness", 0.95)
    ax = fig.axes[0]
    assert not [p for p in ax.patches if p.get_gid() == "bar"]  # a numeric axis: a line, no bars
    centre = [line for line in ax.get_lines() if line.get_gid() == "centre"]
    assert [list(map(int, line.get_xdata())) for line in centre] == [[0, 3, 10]]  # at their values, not slots
    assert ax.get_xlabel() == "staleness bound (ps-ssp, steps)"
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| ps-ssp |" in text and "staleness" in text


def test_along_strategy_a_setting_is_part_of_the_strategys_level(tmp_path):
    pytest.importorskip("matplotlib")
    folder = _staleness_study(tmp_path / "results")
    groups = report.group_observations(report.load_observations(folder), 0.95)
    points = report.points_for(groups, report.THROUGHPUT, "strategy", 0.95)
    assert sorted({p.x for p in points}) == ["ps-ssp (s=0)", "ps-ssp (s=10)", "ps-ssp (s=3)", "ps-sync"]


def test_with_latency_varying_the_setting_is_a_series(tmp_path):
    pytest.importorskip("matplotlib")
    folder = _staleness_study(tmp_path / "results", latencies=(1.0, 50.0))
    groups = report.group_observations(report.load_observations(folder), 0.95)
    points = report.points_for(groups, report.THROUGHPUT, "latency_ms", 0.95)
    assert {p.series for p in points} == {"ps-ssp, staleness 0", "ps-ssp, staleness 3", "ps-ssp, staleness 10",
                                          "ps-sync"}


# ---------------------------------------------------------------- the real CLI

def test_dry_run_of_a_staleness_factor_through_the_cli(not_root, tmp_path):
    path = tmp_path / "ssp.yaml"
    path.write_text("name: ssp\nfactors: {strategy: [ps-ssp], staleness: [0, 3]}\nfixed: {workers: 2}\n"
                    "order: as-written\nseed: 1\n")
    result = CliRunner().invoke(cli.main, ["run", str(path), "--dry-run", "--output", str(tmp_path / "out")],
                                terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "2 runs" in result.output and "staleness" in result.output
    rows = [line.split() for line in result.output.splitlines() if line.strip().startswith("r00")]
    assert [row[:5] for row in rows] == [["r000", "0", "0", "ps-ssp", "0"], ["r001", "1", "0", "ps-ssp", "3"]]
    assert "staleness: strategy ps-ssp's setting" in result.output
    assert not (tmp_path / "out").exists()
    path.write_text("factors: {strategy: [ps-ssp], staleness: [0, 3]}\nalgorithm: {staleness: 1}\n")
    result = CliRunner().invoke(cli.main, ["run", str(path), "--dry-run"])
    assert result.exit_code == 2 and f"{path}: factors.staleness: staleness is set under algorithm: too" in result.output


def test_the_docs_staleness_example_dry_runs(not_root, tmp_path):
    text = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "algorithms.md").read_text(encoding="utf-8")
    section = text
    blocks = [b.split("```", 1)[0] for b in section.split("```yaml\n")[1:]]
    example = next(b for b in blocks if "staleness: [0, 3, 10]" in b)
    (tmp_path / "ssp.yaml").write_text(example)
    result = CliRunner().invoke(cli.main, ["run", "ssp.yaml", "--dry-run"], terminal_width=200)
    assert result.exit_code == 0, result.output
    # 3 staleness levels x 2 latencies of ps-ssp, and ps-sync once per latency
    assert "8 runs" in result.output and result.output.count("ps-sync") == 2


def test_the_algorithms_table_names_a_setting_with_its_algorithm(tmp_path):
    from netbench.report.accuracy import read_points, winners
    from tests.unit.report_designs import accuracy_curve

    records = []
    for i, (strategy, staleness, ips, top) in enumerate((("ps-ssp", 0, 500.0, 0.8), ("ps-ssp", 10, 900.0, 0.7),
                                                         ("ps-sync", None, 400.0, 0.82))):
        curve = accuracy_curve(top, 12, 128 / ips)
        extra = {"algorithm": {"staleness": staleness}} if staleness is not None else {}
        records.append(record(f"r{i:03d}", strategy=strategy, delay_ms=50, ips=ips, accuracy_curve=curve,
                              test_accuracy=curve[-1]["accuracy"], **extra))
    points, _ = read_points(write_results(tmp_path / "r", records))
    assert sorted((p.strategy, p.setting) for p in points) == [("ps-ssp (s=0)", ""), ("ps-ssp (s=10)", ""),
                                                              ("ps-sync", "")]
    lines = "\n".join(winners(points))
    # one line for the network point, comparing the three (the setting does not split them)
    assert "- At 50 ms: most accurate ps-sync (" in lines and "fastest ps-ssp (s=10) (900 images/s)" in lines
