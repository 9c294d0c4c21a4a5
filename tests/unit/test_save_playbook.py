"""`netbench sweep ... --save-playbook FILE`: the saved playbook's runs are the sweep's.

Each sweep command line below runs as a dry run (no root, nothing applied) with --save-playbook;
the sweep's planned runs (the SweepConfig its dry run prints) are captured, the saved file is
loaded as `netbench run` loads it, expanded with its seed, and compared run by run: id, point,
repetition, the network (profile values or the topology's pairs), the job, workers, node
capacity, schedule and its timeline (model.playbook_save.run_view)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from netbench.cli import app as cli
from netbench.cli import experiment
from netbench.model import design, playbook_save
from netbench.model.playbook import load_playbook
from netbench.yamlfile import read_yaml
from netbench.errors import UsageError

REPO = Path(__file__).resolve().parents[2]

SWEEPS = [
    ["--latency", "1,10,100ms", "--bandwidth", "100mbit,1gbit"],
    ["--latency", "5ms", "--loss", "0,1,10%", "--jitter", "0,1ms"],
    ["--bandwidth", "250,500,1000mbit", "--repeat", "3", "--seed", "7"],
    ["--latency", "1,20ms", "--order", "random", "--precision", "2%", "--max-seconds", "30"],
    ["--latency", "1,20ms", "--precision", "off", "--steps", "12", "--warmup", "3"],
    ["--latency", "1ms", "--cpus", "n2=max,0.5", "--step-delay", "n2=0,40ms"],
    ["--strategy", "ps-ssp", "--staleness", "5", "--workers", "3", "--latency", "1,50ms"],
    ["--strategy", "easgd", "--tau", "8", "--elastic-alpha", "0.3", "--bandwidth", "100mbit,1gbit"],
    ["--strategy", "ps", "--ps", "2", "--workers", "3", "--bandwidth", "100,1000mbit"],
    ["--strategy", "allreduce-accum", "--accum-steps", "8", "--batch-size", "32", "--latency", "1,10ms"],
    ["--strategy", "ps-sync", "--backup-workers", "1", "--workers", "3", "--train-steps", "40",
     "--eval-every", "10", "--target-accuracy", "0.5", "--latency", "1ms"],
    ["--framework", "torch", "--latency", "1,20ms", "--workers", "4", "--ranks-per-node", "2",
     "--collective", "hierarchical"],
    ["--latency", "1,20ms", "--seconds", "5", "--startup-timeout", "100", "--step-timeout", "30",
     "--congestion-control", "reno", "--backend", "userspace"],
    ["--latency", "1,20ms", "--workers", "2", "--images-per-step", "64", "--", "python", "train.py", "--lr", "0.1"],
    ["--schedule", str(REPO / "profiles/schedules/spike.yaml")],
    ["--topology", str(REPO / "profiles/topologies/world.yaml"), "--workers", "8", "--scale", "1,2"],
    ["--profile", str(REPO / "profiles/wan.yaml"), "--schedule", str(REPO / "profiles/schedules/spike.yaml"),
     "--cpus", "n1=max,0.5"],
    ["--profile", str(REPO / "profiles/lan.yaml"), "--loss", "0,1%", "--seed", "9", "--order-seed", "9"],
    ["--latency", "1,20ms", "--order", "random", "--seed", "4", "--order-seed", "3"],
    ["--strategy", "single", "--latency", "1,10ms"],
    ["--strategy", "ps-async", "--pipeline", "16", "--workers", "2", "--latency", "1ms"],
    ["--strategy", "gosgd", "--gossip-p", "0.5", "--workers", "3", "--latency", "1,10ms"],
    [],
]


def _saved(tmp_path: Path, monkeypatch, args: list[str], where: str = "grid.yaml"):
    """(the sweep's config, the saved playbook's path, the CLI result) of a dry run with --save-playbook."""
    seen = []
    original = experiment._print_sweep_plan
    monkeypatch.setattr(experiment, "_print_sweep_plan", lambda config: (seen.append(config), original(config)))
    monkeypatch.chdir(tmp_path)
    flags, dash, command = (args[:args.index("--")], ["--"], args[args.index("--") + 1:]) if "--" in args \
        else (args, [], [])
    result = CliRunner().invoke(cli.main, ["sweep", *flags, "--dry-run", "--save-playbook", where, *dash, *command],
                                terminal_width=200)
    return (seen[0] if seen else None), tmp_path / where, result


@pytest.mark.parametrize("args", SWEEPS, ids=lambda a: " ".join(a)[:60] or "defaults")
def test_saved_playbook_gives_the_sweeps_runs(tmp_path, monkeypatch, args):
    config, path, result = _saved(tmp_path, monkeypatch, args)
    assert result.exit_code == 0, result.output
    assert config is not None and path.is_file()
    book = load_playbook(path)
    runs = design.expand(book, book.seed)
    assert len(runs) == len(config.runs) > 0
    unswept = not any(a in args for a in ("--latency", "--bandwidth", "--loss", "--jitter"))
    assert playbook_save.first_difference(config.runs, runs, unswept=unswept) is None
    for mine, theirs in zip(config.runs, runs):  # the fields the dry runs print, directly
        assert (mine.run_id, mine.repeat, mine.workers, mine.compute) == \
            (theirs.run_id, theirs.repeat, theirs.workers, theirs.compute)
        assert (mine.profile.delay_us, mine.profile.rate_bps, mine.profile.loss, mine.profile.jitter_us) == \
            (theirs.profile.delay_us, theirs.profile.rate_bps, theirs.profile.loss, theirs.profile.jitter_us)
        assert mine.job.seed == theirs.job.seed and mine.job.precision == theirs.job.precision
    assert book.order == "as-written" and book.repetitions == config.runs[-1].repeat + 1
    if config.order_seed is not None:  # the launches' order too: the same seed orders the points within them
        assert design.order_seed(book, book.seed) == config.order_seed


def test_the_saved_keys_are_the_flags_names(tmp_path, monkeypatch):
    _, path, result = _saved(tmp_path, monkeypatch, ["--latency", "1,10,100ms", "--bandwidth", "1gbit",
                                                     "--repeat", "2", "--seed", "5", "--cpus", "n2=1,0.5",
                                                     "--batch-size", "16", "--order-seed", "7",
                                                     "--startup-timeout", "100", "--step-timeout", "30"])
    assert result.exit_code == 0, result.output
    data = read_yaml(path, "playbook", UsageError)
    assert data["factors"] == {"latency": ["1ms", "10ms", "100ms"], "cpus": {"n2": [1.0, 0.5]}}
    assert data["fixed"]["bandwidth"] == "1gbit" and data["fixed"]["batch_size"] == 16
    assert (data["repeat"], data["seed"], data["order_seed"], data["order"]) == (2, 5, 7, "as-written")
    assert (data["startup_timeout"], data["step_timeout"]) == ("100s", "30s")
    assert not {"repetitions", "timeouts"} & set(data) and "batch" not in data["fixed"]  # the old spellings
    assert not load_playbook(path).notes
    assert "saved playbook grid.yaml (12 runs)" in result.output


def test_files_are_referenced_relative_to_the_playbook(tmp_path, monkeypatch):
    profile = tmp_path / "profiles" / "base.yaml"
    profile.parent.mkdir()
    profile.write_text("name: mybase\ndelay: 3ms\nloss: 1%\n")
    (tmp_path / "books").mkdir()
    _, path, result = _saved(tmp_path, monkeypatch, ["--profile", "profiles/base.yaml", "--latency", "1,2ms"],
                             where="books/grid.yaml")
    assert result.exit_code == 0, result.output
    assert read_yaml(path, "playbook", UsageError)["profile"] == "../profiles/base.yaml"
    assert load_playbook(path).base_profile.loss == 0.01


def test_run_flags_are_named_as_flags_of_run(tmp_path, monkeypatch):
    _, _, result = _saved(tmp_path, monkeypatch, ["--latency", "1,20ms", "--order", "random", "--isolate"])
    assert result.exit_code == 0, result.output
    assert "netbench run grid.yaml" in result.output
    assert "--isolate/--launch, --order again" in result.output


@pytest.mark.parametrize("args, flag", [
    (["--cpus", "0.5"], "--cpus"),
    (["--latency", "1ms", "--input-shape", "28x28x1"], "--input-shape"),
    (["--latency", "1ms", "--classes", "5"], "--classes"),
    (["--latency", "1,10ms", "--schedule", str(REPO / "profiles/schedules/spike.yaml")], "--schedule"),
    (["--latency", "1ms", "--seconds", "0.5"], "--seconds"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_sweep_the_format_cannot_express_is_refused_naming_the_flag(tmp_path, monkeypatch, args, flag):
    _, path, result = _saved(tmp_path, monkeypatch, args)
    assert result.exit_code != 0
    assert f"flag {flag}" in result.output and "Traceback" not in result.output
    assert not path.exists()


def test_a_playbook_that_would_give_other_runs_is_not_written(tmp_path, monkeypatch):
    """The check before writing: a mapping that drops a factor is caught, naming the run."""
    real = playbook_save.playbook_mapping

    def lossy(spec, folder, name):
        book = real(spec, folder, name)
        book["factors"].pop("bandwidth")
        return book

    monkeypatch.setattr(playbook_save, "playbook_mapping", lossy)
    _, path, result = _saved(tmp_path, monkeypatch, ["--latency", "1,10ms", "--bandwidth", "100mbit,1gbit"])
    assert result.exit_code != 0
    assert "would not reproduce this sweep" in result.output
    assert not path.exists()


def test_first_difference_names_what_differs(tmp_path, monkeypatch):
    config, path, result = _saved(tmp_path, monkeypatch, ["--latency", "1,10ms"])
    assert result.exit_code == 0, result.output
    runs = list(design.expand(load_playbook(path), 0))
    assert playbook_save.first_difference(config.runs, runs) is None
    runs[1] = replace(runs[1], job=replace(runs[1].job, batch_size=32))
    assert "run r001: its job differs" in playbook_save.first_difference(config.runs, runs)
    assert "2 runs in the sweep, 1 in the playbook" in playbook_save.first_difference(config.runs, runs[:1])


@pytest.mark.parametrize("where", ["grid.txt", "no/such/folder/grid.yaml"])
def test_a_file_that_cannot_be_a_playbook_is_refused(tmp_path, monkeypatch, where):
    _, _, result = _saved(tmp_path, monkeypatch, ["--latency", "1ms"], where=where)
    assert result.exit_code != 0 and "flag --save-playbook" in result.output
    assert len(result.output.strip().splitlines()) <= 2  # one line, and its hint


def test_an_appended_sweep_saves_its_design_numbered_from_r000(tmp_path, monkeypatch):
    """--append numbers the sweep's runs after the folder's; the playbook's own folder starts at r000."""
    (tmp_path / "out" / "runs").mkdir(parents=True)
    (tmp_path / "out" / "runs" / "r004.json").write_text("{}")
    config, path, result = _saved(tmp_path, monkeypatch, ["--latency", "1,10ms", "--output", "out", "--append"])
    assert result.exit_code == 0, result.output
    assert [r.run_id for r in config.runs] == ["r005", "r006"]
    assert [r.run_id for r in design.expand(load_playbook(path), 0)] == ["r000", "r001"]
    assert "--output, --append again" in result.output
