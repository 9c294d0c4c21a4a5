"""netbench.model.playbook: loading, validation, factorial expansion, seeded order, resume selection."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from netbench.cli import app as cli
from netbench.model import playbook as pb
from netbench.model.job import JobSpec
from netbench.model import design
from netbench.model.design import expand, pending
from netbench.experiment.store import recorded_statuses
from netbench.model.playbook import PlaybookError, load_playbook, playbook_from_mapping
from tests.unit.rootless_fakes import no_userns

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "playbooks").glob("*.yaml"))


def book(**data):
    return playbook_from_mapping(data, "pb.yaml", base_dir=ROOT / "playbooks")


# ---------------------------------------------------------------- loading and validation

def test_levels_are_normalised_once():  # written with old key spellings: they load as today's keys
    b = book(factors={"latency": ["1ms", "10ms"], "bandwidth": ["250mbit", "1gbit", "unlimited"],
                      "loss": ["0%", "1%"], "batch": [32, 64]},
             fixed={"model": "mlp", "workers": 3}, timeouts={"startup": "120s", "step": "30s"}, seconds="20s")
    assert dict(b.factors) == {"latency": (1_000, 10_000), "bandwidth": (250_000_000, 1_000_000_000, None),
                               "loss": (0.0, 0.01), "batch_size": (32, 64)}
    assert (b.fixed.model, b.fixed.workers) == ("mlp", 3)
    assert (b.startup_timeout_s, b.step_timeout_s, b.seconds) == (120.0, 30.0, 20.0)
    assert b.order == "random" and b.seed is None and b.repetitions == 1


@pytest.mark.parametrize("data, message", [
    ({"factors": {"latncy": ["1ms"]}}, "pb.yaml: factors.latncy: unknown key"),
    ({"factors": {"latency": ["1ms"]}, "repetition": 2}, "pb.yaml: repetition: unknown key"),
    ({"factors": {"latency": "1ms"}}, "pb.yaml: factors.latency: must be a non-empty list of levels"),
    ({"factors": {"latency": ["10"]}}, "pb.yaml: factors.latency: duration '10' needs a unit"),
    ({"factors": {"loss": ["0%", "120%"]}}, "pb.yaml: factors.loss"),
    ({"factors": {"latency": ["1ms", "1ms"]}}, "pb.yaml: factors.latency: repeated level"),
    ({"factors": {"model": ["mlp", "resnet5"]}}, "pb.yaml: factors.model: unknown value 'resnet5' (did you mean 'resnet50'?)"),
    ({"factors": {"strategy": ["allreduce", "ring"]}}, "pb.yaml: factors.strategy: unknown value 'ring'"),
    ({"factors": {"batch": [0]}}, "pb.yaml: factors.batch: 0 is outside 1..65536"),
    ({"factors": {"batch_size": [0]}}, "pb.yaml: factors.batch_size: 0 is outside 1..65536"),
    ({"factors": {"workers": [1.5]}}, "pb.yaml: factors.workers: must be a whole number"),
    ({"factors": {"model": ["mlp"]}, "fixed": {"model": "cnn"}}, "pb.yaml: fixed.model: is also a factor"),
    ({"fixed": {"batch": [32, 64]}}, "pb.yaml: fixed.batch: a fixed setting takes one value"),
    ({"fixed": {"batch_size": [32, 64]}}, "pb.yaml: fixed.batch_size: a fixed setting takes one value"),
    ({"factors": {"latency": ["1ms"]}, "repetitions": 0}, "pb.yaml: repetitions: must be a whole number in 1..1000"),
    ({"factors": {"latency": ["1ms"]}, "repeat": 0}, "pb.yaml: repeat: must be a whole number in 1..1000"),
    ({"factors": {"latency": ["1ms"]}, "order": "shuffled"}, "pb.yaml: order: unknown order 'shuffled'"),
    ({"factors": {"latency": ["1ms"]}, "seed": -1}, "pb.yaml: seed: must be a whole number"),
    ({"factors": {"latency": ["1ms"]}, "timeouts": {"steps": "1s"}}, "pb.yaml: timeouts.steps: unknown key"),
    ({"factors": {"latency": ["1ms"]}, "timeouts": {"step": "100ms"}}, "pb.yaml: timeouts.step: '100ms' is under 1s"),
    ({"factors": {"latency": ["1ms"]}, "step_timeout": "100ms"}, "pb.yaml: step_timeout: '100ms' is under 1s"),
    ({"factors": {"latency": ["1ms"]}, "startup_timeout": "0s"}, "pb.yaml: startup_timeout: '0s' is under 1s"),
    ({"factors": {"latency": ["1ms"]}, "timeouts": "60s"}, "pb.yaml: timeouts: must be a mapping"),
    ({"factors": {"latency": ["1ms"]}, "order_seed": -1}, "pb.yaml: order_seed: must be a whole number in 0..2147483647"),
    ({"factors": {"latency": ["1ms"]}, "extra_runs": [{"batch": 0}]}, "pb.yaml: extra_runs[0].batch: 0 is outside"),
    ({"factors": {"latency": ["1ms"]}, "seconds": "10s", "warmup": 0}, "pb.yaml: warmup: a 'seconds' window"),
    ({"factors": {"latency": ["1ms"]}, "profile": "nope.yaml"}, "pb.yaml: profile:"),
    ({"factors": {"latency": ["1ms", "5ms"]}, "fixed": {"jitter": "2ms"}}, "pb.yaml: fixed.jitter: jitter 2ms exceeds delay 1ms"),
    ({"factors": {"strategy": ["single"], "workers": [1, 2]}}, "pb.yaml: factors.workers: strategy single runs one process"),
    ({"factors": {"strategy": ["ps", "allreduce"], "ps": [1, 2]}},
     "pb.yaml: factors.ps: strategy allreduce ignores ps, so its runs would repeat"),
    ({"factors": {"latency": ["1ms"]}, "extra_runs": [{"strategy": "single", "workers": 2}]},
     "pb.yaml: extra_runs[0]: strategy single runs one process"),
    ({"factors": {"latency": ["1ms"]}, "extra_runs": [{"stratgy": "single"}]}, "pb.yaml: extra_runs[0].stratgy: unknown key"),
    ([1, 2], "pb.yaml: a playbook must be a mapping"),
])
def test_bad_input_is_one_line_naming_file_and_key(data, message):
    with pytest.raises(PlaybookError) as info:
        playbook_from_mapping(data, "pb.yaml")
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("factors: {latency: [1ms\n")
    with pytest.raises(PlaybookError, match=r"bad.yaml: broken YAML at line 2"):
        load_playbook(bad)
    with pytest.raises(PlaybookError, match=r"missing.yaml: no such playbook file"):
        load_playbook(tmp_path / "missing.yaml")


def test_base_profile_is_relative_to_the_playbook_and_factors_override_it():
    b = book(profile="../profiles/wan.yaml", factors={"latency": ["1ms", "30ms"]})
    runs = expand(b, seed=0)
    assert {r.profile.delay_us for r in runs} == {1_000, 30_000}
    assert all(r.profile.rate_bps == b.base_profile.rate_bps and b.base_profile.rate_bps for r in runs)


# ---------------------------------------------------------------- expansion and order

def test_full_factorial_in_written_order_with_adjacent_repetitions():
    b = book(factors={"model": ["mlp", "cnn"], "latency": ["1ms", "10ms", "100ms"], "workers": [1, 2]},
             repeat=2, order="as-written")
    runs = expand(b, seed=1)
    assert len(runs) == 2 * 3 * 2 * 2
    got = [(r.settings.model, r.settings.delay_us, r.settings.workers) for r in runs[::2]]
    assert got == list(itertools.product(("mlp", "cnn"), (1_000, 10_000, 100_000), (1, 2)))
    assert [r.repeat for r in runs[:4]] == [0, 1, 0, 1]
    assert [r.run_id for r in runs[:3]] == ["r000", "r001", "r002"]
    assert runs[4].profile.name == "d10ms"


def test_random_order_is_a_permutation_fixed_by_the_seed():
    b = book(factors={"latency": ["1ms", "10ms", "100ms"], "batch_size": [32, 64]}, repeat=3)
    one, again, other = expand(b, 7), expand(b, 7), expand(b, 8)
    key = lambda runs: [(r.point, r.repeat) for r in runs]  # noqa: E731
    assert key(one) == key(again)
    assert key(one) != key(other)
    assert sorted(key(one)) == [(p, rep) for p in range(6) for rep in range(3)]
    assert key(one) != sorted(key(one))
    assert [r.index for r in one] == list(range(18))


def test_extra_runs_cross_the_factors_they_do_not_set():
    b = book(factors={"model": ["mlp", "cnn"], "workers": [1, 2, 3], "strategy": ["allreduce", "allreduce-accum"]},
             extra_runs=[{"strategy": "single", "workers": 1}], order="as-written")
    points = pb.design_points(b)
    singles = [p for p in points if p.strategy == "single"]
    assert [(p.model, p.workers) for p in singles] == [("mlp", 1), ("cnn", 1)]
    assert len(points) == 2 * 3 * 2 + 2


def test_an_extra_run_already_in_the_factorial_is_not_duplicated():
    b = book(factors={"workers": [1, 2]}, extra_runs=[{"workers": 1}])
    assert [p.workers for p in pb.design_points(b)] == [1, 2]


def test_ignored_settings_fall_back_to_defaults_and_nodes_count_servers():
    b = book(factors={"strategy": ["ps", "allreduce"]}, fixed={"ps": 2, "workers": 3, "accum_steps": 8})
    points = pb.design_points(b)
    assert [(p.strategy, p.ps, p.accum_steps, p.nodes) for p in points] == [("ps", 2, 4, 6), ("allreduce", 1, 4, 3)]


def test_job_fields_pass_through_and_refuse_what_the_job_cannot_carry():
    b = book(factors={"strategy": ["allreduce", "ps"]}, fixed={"batch_size": 16, "model": "cnn"}, steps=7)
    by_strategy = {r.settings.strategy: r.settings for r in expand(b, 0)}
    plain, ps_run = by_strategy["allreduce"], by_strategy["ps"]
    fields = design.fields_of(JobSpec)
    job = JobSpec(**design.job_fields(b, plain, fields))
    assert (job.strategy, job.model, job.batch_size, job.steps, job.warmup) == ("allreduce", "cnn", 16, 7, 10)
    without_ps = tuple(f for f in fields if f != "ps")
    with pytest.raises(PlaybookError, match=r"pb.yaml: ps: this netbench cannot run it yet: its job has no 'ps'"):
        design.job_fields(b, ps_run, without_ps)
    # a field JobSpec does have is passed through
    assert design.job_fields(b, ps_run, (*without_ps, "ps"))["ps"] == 1


def test_check_supported_names_the_key_of_a_missing_model():
    b = book(factors={"model": ["mlp", "resnet50"]})
    with pytest.raises(PlaybookError, match=r"pb.yaml: factors.model: model resnet50 is not available"):
        design.check_supported(b, expand(b, 0), ("allreduce",), ("mlp", "cnn"))
    design.check_supported(b, expand(b, 0), ("allreduce",), ("mlp", "resnet50"))


# ---------------------------------------------------------------- resume

def test_expanded_runs_carry_their_own_job_and_workers():
    b = book(factors={"strategy": ["allreduce", "ps"], "batch": [16, 32]}, fixed={"workers": 3},
             extra_runs=[{"strategy": "single", "workers": 1}], warmup=2, steps=5, order="as-written")
    runs = expand(b, 9, sample_resources_s=0.5)
    for run in runs:
        assert run.workers == run.settings.workers
        assert run.job == JobSpec(**design.job_fields(b, run.settings, design.fields_of(JobSpec)), seed=9,
                                  sample_resources_s=0.5)
    assert {(r.job.strategy, r.job.batch_size, r.workers) for r in runs} == {
        ("allreduce", 16, 3), ("allreduce", 32, 3), ("ps", 16, 3), ("ps", 32, 3), ("single", 16, 1),
        ("single", 32, 1)}
    assert all(r.job.warmup == 2 and r.job.steps == 5 for r in runs)


def test_pending_skips_ok_and_timeout_and_repeats_failed_or_missing():
    runs = expand(book(factors={"latency": ["1ms", "2ms", "3ms", "4ms"]}), 0)
    statuses = {"r000": "ok", "r001": "timeout", "r002": "failed"}
    assert [r.run_id for r in pending(runs, statuses)] == ["r002", "r003"]


def test_recorded_statuses_reads_run_records_and_ignores_torn_ones(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "r000.json").write_text(json.dumps({"run_id": "r000", "status": "ok"}))
    (tmp_path / "runs" / "r001.json").write_text('{"run_id": "r001", "sta')
    assert recorded_statuses(tmp_path) == {"r000": "ok"}
    assert recorded_statuses(tmp_path / "nothing") == {}


def test_resume_refuses_another_design(tmp_path):
    b = book(factors={"latency": ["1ms", "2ms"]}, repeat=2)
    runs = expand(b, 3)
    record = design.plan_record(b, 3, runs)
    design.check_resume(b, runs, record, tmp_path, has_runs=True)  # same design: fine
    with pytest.raises(PlaybookError, match="holds results of a different design"):
        design.check_resume(b, expand(b, 4), record, tmp_path, has_runs=True)  # another seed, another order
    changed = book(factors={"latency": ["1ms", "3ms"]}, repeat=2)
    with pytest.raises(PlaybookError, match="holds results of a different design"):
        design.check_resume(changed, expand(changed, 3), record, tmp_path, has_runs=True)
    with pytest.raises(PlaybookError, match="no playbook.json"):
        design.check_resume(b, runs, None, tmp_path, has_runs=True)


def test_a_playbook_measured_to_another_precision_is_another_design(tmp_path):
    base = dict(factors={"latency": ["1ms", "2ms"]})
    digest = {}
    for name, extra in {"default": {}, "two": {"precision": "2%"}, "off": {"precision": "off"},
                        "cap": {"max_seconds": "30s"}, "train": {"train_steps": 200},
                        "easgd": {"fixed": {"strategy": "easgd"}},
                        "tau": {"fixed": {"strategy": "easgd"}, "algorithm": {"tau": 8}},
                        "command": {"command": ["python", "train.py"]}}.items():
        b = book(**base, **extra)
        digest[name] = design.design_digest(b, expand(b, 3))
    assert len(set(digest.values())) == len(digest)  # each option makes its own design
    b = book(**base, precision="3%", max_seconds="60s")  # the defaults written out: the same design
    assert design.design_digest(b, expand(b, 3)) == digest["default"]
    b = book(**base, precision="off", max_seconds="30s")  # without a precision its cap does not matter
    assert design.design_digest(b, expand(b, 3)) == digest["off"]
    three, two = book(**base), book(**base, precision="2%")
    record = design.plan_record(three, 3, expand(three, 3))
    with pytest.raises(PlaybookError, match=r"its precision was 3 % within 60 s, now 2 % within 60 s"):
        design.check_resume(two, expand(two, 3), record, tmp_path, has_runs=True)
    with pytest.raises(PlaybookError, match=r"the playbook or its seed changed since"):  # an edited record
        design.check_resume(two, expand(two, 3), {**record, "precision": "3%"}, tmp_path, has_runs=True)


# ---------------------------------------------------------------- shipped playbooks and the CLI

@pytest.fixture
def not_root(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    no_userns(monkeypatch)  # a host where a user gets no testbed: stops at the privilege check
    monkeypatch.chdir(tmp_path)


def test_the_shipped_designs_are_there():
    assert {p.stem for p in SHIPPED} >= {"smoke", "network-grid", "accumulation", "ps-ratio"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_playbook_dry_runs(path, not_root, tmp_path):
    data = yaml.safe_load(path.read_text())
    if path.stem != "smoke":  # a study's design says what it reproduces and what was scaled down
        assert "Reproduces" in data["description"] and "Scaled down" in data["description"]
    result = CliRunner().invoke(cli.main, ["run", str(path), "--dry-run", "--output", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "note:" not in result.output  # written with today's keys
    b = load_playbook(path)
    assert not b.notes
    runs = expand(b, b.seed)
    assert f"{len(runs)} runs" in result.output and f"seed {b.seed}" in result.output
    assert result.output.count(" to run") >= len(runs)
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_shipped_designs_have_the_studies_levels():
    grid = load_playbook(ROOT / "playbooks" / "network-grid.yaml")
    f = dict(grid.factors)
    assert f["latency"] == (1_000, 10_000, 100_000) and f["loss"] == (0.0, 0.01, 0.1)
    assert f["bandwidth"] == (250_000_000, 500_000_000, 1_000_000_000) and f["workers"] == (1, 3)
    assert grid.fixed.strategy == "ps" and grid.fixed.ps == 1
    acc = load_playbook(ROOT / "playbooks" / "accumulation.yaml")
    f = dict(acc.factors)
    assert f["batch_size"] == (32, 64, 100) and f["workers"] == (1, 2, 3)
    assert f["strategy"] == ("allreduce", "allreduce-accum") and acc.repetitions == 5 and acc.order == "random"
    ratio = load_playbook(ROOT / "playbooks" / "ps-ratio.yaml")
    assert dict(ratio.factors)["latency"] == (10_000, 100_000, 200_000)


def test_dry_run_marks_runs_already_done(not_root, tmp_path):
    path = ROOT / "playbooks" / "smoke.yaml"
    b = load_playbook(path)
    runs = expand(b, b.seed)
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    (out / "playbook.json").write_text(json.dumps(design.plan_record(b, b.seed, runs)))
    (out / "runs" / f"{runs[0].run_id}.json").write_text(json.dumps({"run_id": runs[0].run_id, "status": "ok"}))
    result = CliRunner().invoke(cli.main, ["run", str(path), "--dry-run", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "(1 done, 1 to run)" in result.output


def test_run_without_root_stops_before_touching_anything(not_root, tmp_path):
    result = CliRunner().invoke(cli.main, ["run", str(ROOT / "playbooks" / "smoke.yaml"), "--output",
                                           str(tmp_path / "out")])
    assert result.exit_code == 3, result.output
    assert "needs root" in result.output


def test_run_bad_playbook_is_a_one_line_error(not_root, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("factors: {latency: [1ms]}\nrepetitons: 3\n")
    result = CliRunner().invoke(cli.main, ["run", str(bad), "--dry-run"])
    assert result.exit_code == 2
    assert f"{bad}: repetitons: unknown key" in result.output and "did you mean 'repeat'" in result.output


# ---------------------------------------------------------------- names that become folder names


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "a/b", "a\\b", "smoke\n", "", " x", "x" * 65, "x" * 100_000,
                                  "a b", "-rf", "é"])
def test_a_name_that_is_not_a_safe_folder_name_is_refused(name):
    # the name becomes results/<name>: '..' wrote into the current directory
    with pytest.raises(PlaybookError) as info:
        playbook_from_mapping({"name": name, "factors": {"latency": ["1ms"]}}, "pb.yaml")
    message = str(info.value)
    assert message.startswith("pb.yaml: name: must be letters, digits") and len(message) < 300, message[:300]
    assert "\n" not in message


def test_a_file_name_that_is_not_a_safe_folder_name_needs_a_name_key(tmp_path):
    path = tmp_path / "my study.yaml"
    path.write_text("factors: {latency: [1ms]}\n")
    with pytest.raises(PlaybookError, match=r"my study.yaml: name: the file name 'my study' must be letters") as info:
        load_playbook(path)
    assert "name:" in info.value.hint
    path.write_text("name: my-study\nfactors: {latency: [1ms]}\n")
    assert load_playbook(path).name == "my-study"


@pytest.mark.parametrize("name", ["smoke", "network-grid", "a.b_c-1", "A" * 64, "1"])
def test_safe_names_load(name):
    assert playbook_from_mapping({"name": name, "factors": {"latency": ["1ms"]}}, "pb.yaml").name == name


def test_run_with_a_dot_dot_name_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.yaml").write_text("name: '..'\nfactors: {latency: [1ms]}\n")
    result = CliRunner().invoke(cli.main, ["run", "p.yaml", "--dry-run"])
    assert result.exit_code == 2, result.output
    assert "name: must be letters, digits" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["p.yaml"]


def test_dry_run_prints_levels_with_brackets_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.yaml").write_text("name: b\nfactors: {data: [synthetic, '[/]data'], latency: [1ms]}\n")
    result = CliRunner().invoke(cli.main, ["run", "p.yaml", "--dry-run", "--output", "[/]out"], terminal_width=300)
    assert result.exit_code == 0, result.output
    assert "[/]data" in result.stdout and "[/]out" in result.stdout
