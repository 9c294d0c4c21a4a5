"""A playbook's keys are the sweep's flag names (model/playbook_keys.py): `batch_size`, `repeat`,
`startup_timeout`, `step_timeout`, `order_seed`. The spellings before them (`batch`,
`repetitions`, `timeouts: {startup, step}`) load until the next release: the same playbook, the
same design digest (so results folders written before resume), and one note per old key naming
the file, the old key and the new one, which `netbench run` prints; both spellings at once are
refused in one line."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from netbench.cli import app as cli
from netbench.model import design, playbook_keys
from netbench.model.design import expand
from netbench.model.playbook import PlaybookError, load_playbook, playbook_from_mapping
from tests.unit.rootless_fakes import no_userns

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "playbooks").glob("*.yaml"))
BASE = {"name": "keys", "factors": {"latency": ["1ms", "10ms"]}, "fixed": {"model": "mlp", "workers": 2},
        "order": "random", "seed": 11}


def written(**parts) -> dict:
    """BASE with `parts` added (factors and fixed merged into BASE's)."""
    data = copy.deepcopy(BASE)
    for key, value in parts.items():
        if key in ("factors", "fixed"):
            data[key].update(value)
        else:
            data[key] = value
    return data


def note(old: str, new: str, source: str = "books/x.yaml") -> str:
    return f"{source}: '{old}' is now '{new}'; the old name works until the next release"


OLD_AND_NEW = [  # (the old spelling, today's, the keys renamed)
    (written(factors={"batch": [32, 64]}), written(factors={"batch_size": [32, 64]}), [("batch", "batch_size")]),
    (written(fixed={"batch": 16}), written(fixed={"batch_size": 16}), [("batch", "batch_size")]),
    (written(extra_runs=[{"strategy": "single", "workers": 1, "batch": 16}]),
     written(extra_runs=[{"strategy": "single", "workers": 1, "batch_size": 16}]), [("batch", "batch_size")]),
    (written(repetitions=3), written(repeat=3), [("repetitions", "repeat")]),
    (written(timeouts={"startup": "100s", "step": "30s"}), written(startup_timeout="100s", step_timeout="30s"),
     [("timeouts.startup", "startup_timeout"), ("timeouts.step", "step_timeout")]),
    (written(timeouts={"step": "30s"}), written(step_timeout="30s"), [("timeouts.step", "step_timeout")]),
]


@pytest.mark.parametrize("old, new, renamed", OLD_AND_NEW, ids=lambda v: str(v) if isinstance(v, list) else None)
def test_an_old_spelling_loads_as_the_same_playbook_with_a_note(old, new, renamed):
    was, now = playbook_from_mapping(old, "books/x.yaml"), playbook_from_mapping(new, "books/x.yaml")
    assert was == now
    assert was.notes == tuple(note(o, n) for o, n in renamed)
    assert now.notes == ()
    assert expand(was, 11) == expand(now, 11)
    assert design.design_digest(was, expand(was, 11)) == design.design_digest(now, expand(now, 11))


def test_the_digest_of_an_old_playbook_is_the_one_its_folder_recorded():
    """17949cff02c2ee76: this design's digest as the loader before the renaming computed it (the
    digest a results folder of it holds), from the old spellings and from today's keys alike."""
    old = written(factors={"batch": [32, 64]}, extra_runs=[{"strategy": "single", "workers": 1, "batch": 16}],
                  repetitions=2, timeouts={"startup": "100s", "step": "30s"})
    new = written(factors={"batch_size": [32, 64]}, repeat=2, startup_timeout="100s", step_timeout="30s",
                  extra_runs=[{"strategy": "single", "workers": 1, "batch_size": 16}])
    for data in (old, new):
        book = playbook_from_mapping({**data, "name": "old"}, "old.yaml")
        assert design.design_digest(book, expand(book, book.seed)) == "17949cff02c2ee76"


def test_an_old_key_gives_one_note_wherever_it_is_written():
    book = playbook_from_mapping(written(factors={"batch": [32, 64]}, fixed={"accum_steps": 4},
                                         extra_runs=[{"strategy": "single", "workers": 1, "batch": 16},
                                                     {"strategy": "single", "workers": 1, "batch": 8}],
                                         repetitions=2), "x.yaml")
    assert book.notes == (note("batch", "batch_size", "x.yaml"), note("repetitions", "repeat", "x.yaml"))


def _old_spellings(data: dict) -> dict:
    """A playbook in today's keys written back in the old spellings."""
    out = {}
    for key, value in data.items():
        if key in ("factors", "fixed"):
            out[key] = {("batch" if k == "batch_size" else k): v for k, v in value.items()}
        elif key == "extra_runs":
            out[key] = [{("batch" if k == "batch_size" else k): v for k, v in entry.items()} for entry in value]
        elif key == "repeat":
            out["repetitions"] = value
        elif key in ("startup_timeout", "step_timeout"):
            out.setdefault("timeouts", {})[key.split("_")[0]] = value
        else:
            out[key] = value
    return out


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_playbook_in_the_old_spellings_is_the_same_design(path):
    data = yaml.safe_load(path.read_text())
    old = _old_spellings(data)
    assert old != data  # each shipped playbook has a key that was renamed
    now, was = load_playbook(path), playbook_from_mapping(old, str(path), base_dir=path.parent)
    assert was == now and was.notes and not now.notes
    assert design.design_digest(was, expand(was, was.seed)) == design.design_digest(now, expand(now, now.seed))


@pytest.mark.parametrize("data, message", [
    (written(repetitions=2, repeat=2), "pb.yaml: repeat: both 'repetitions' and 'repeat' are given"),
    (written(timeouts={"step": "30s"}, step_timeout="30s"),
     "pb.yaml: step_timeout: both 'timeouts.step' and 'step_timeout' are given"),
    (written(startup_timeout="30s", timeouts={"startup": "30s"}),
     "pb.yaml: startup_timeout: both 'timeouts.startup' and 'startup_timeout' are given"),
    (written(fixed={"batch": 16, "batch_size": 16}), "pb.yaml: fixed: both 'batch' and 'batch_size' are given"),
    (written(factors={"batch_size": [8, 16], "batch": [8, 16]}),
     "pb.yaml: factors: both 'batch' and 'batch_size' are given"),
    (written(extra_runs=[{"workers": 1}, {"batch": 8, "batch_size": 8}]),
     "pb.yaml: extra_runs[1]: both 'batch' and 'batch_size' are given"),
    (written(factors={"batch": [8, 16]}, fixed={"batch_size": 16}), "pb.yaml: fixed.batch_size: is also a factor"),
    (written(timeouts={"stop": "30s"}), "pb.yaml: timeouts.stop: unknown key"),
])
def test_both_spellings_at_once_are_one_line_naming_the_file_and_both_keys(data, message):
    with pytest.raises(PlaybookError) as info:
        playbook_from_mapping(data, "pb.yaml")
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------- order_seed: the order's seed

def test_order_seed_orders_the_runs_and_seed_seeds_the_jobs():
    both = playbook_from_mapping(written(repeat=3, seed=5, order_seed=9), "x.yaml")
    nine = playbook_from_mapping(written(repeat=3, seed=9), "x.yaml")
    runs = expand(both, both.seed)
    key = lambda runs: [(r.point, r.repeat) for r in runs]  # noqa: E731
    assert key(runs) == key(expand(nine, 9)) != key(expand(nine, 5))
    assert {r.job.seed for r in runs} == {5}
    assert design.order_seed(both, 5) == 9 and design.order_seed(nine, 9) == 9
    assert design.plan_record(both, 5, runs)["order_seed"] == 9
    assert "order_seed" not in design.plan_record(nine, 9, expand(nine, 9))  # as before order_seed


def test_without_order_seed_the_seed_orders_as_before():
    seed_only = playbook_from_mapping(written(repeat=3, seed=5), "x.yaml")
    both = playbook_from_mapping(written(repeat=3, seed=5, order_seed=5), "x.yaml")
    assert expand(seed_only, 5) == expand(both, 5)
    assert design.design_digest(seed_only, expand(seed_only, 5)) == design.design_digest(both, expand(both, 5))


# ---------------------------------------------------------------- netbench run prints the notes

@pytest.fixture
def not_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    no_userns(monkeypatch)  # a host where a user gets no testbed: stops at the privilege check


def _dry_run(folder: Path, data: dict, monkeypatch):
    folder.mkdir()
    (folder / "p.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    monkeypatch.chdir(folder)
    return CliRunner().invoke(cli.main, ["run", "p.yaml", "--dry-run", "--output", "out"], terminal_width=200)


def test_run_prints_each_old_key_once_as_a_note_and_plans_the_same_runs(tmp_path, monkeypatch, not_root):
    old = written(factors={"batch": [32, 64]}, extra_runs=[{"strategy": "single", "workers": 1, "batch": 16}],
                  repetitions=2, timeouts={"startup": "100s", "step": "30s"})
    new = written(factors={"batch_size": [32, 64]}, extra_runs=[{"strategy": "single", "workers": 1, "batch_size": 16}],
                  repeat=2, startup_timeout="100s", step_timeout="30s")
    was, now = _dry_run(tmp_path / "old", old, monkeypatch), _dry_run(tmp_path / "new", new, monkeypatch)
    assert was.exit_code == now.exit_code == 0, was.output + now.output
    assert was.stdout == now.stdout  # the same plan, table and launches
    assert "batch_size" in now.stdout and "timeouts: startup 100s, step 30s" in now.stdout
    lines = was.stderr.splitlines()
    for old_key, new_key in [("batch", "batch_size"), ("repetitions", "repeat"),
                             ("timeouts.startup", "startup_timeout"), ("timeouts.step", "step_timeout")]:
        assert lines.count(f"note: {note(old_key, new_key, 'p.yaml')}") == 1, was.stderr
    assert len(lines) == 4 and now.stderr == ""


def test_run_refuses_both_spellings_in_one_line(tmp_path, monkeypatch, not_root):
    result = _dry_run(tmp_path / "both", written(repetitions=2, repeat=2), monkeypatch)
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == "error: p.yaml: repeat: both 'repetitions' and 'repeat' are given " \
                                            "('repetitions' is its old name)"
    assert "keep 'repeat' only" in result.stderr and "Traceback" not in result.output


def test_run_orders_launches_by_the_order_seed(tmp_path, monkeypatch, not_root):
    result = _dry_run(tmp_path / "seeds", written(seed=5, order_seed=9), monkeypatch)
    assert result.exit_code == 0, result.output
    assert "seed 5, order seed 9" in result.stdout and "order seed 9" in result.stdout.split("seed 5, order seed 9")[1]


def _yaml_playbooks():
    """(where, mapping) of every ```yaml block in README.md and docs/ that sets playbook keys."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for block in text.split("```yaml\n")[1:]:
            data = yaml.safe_load(block.split("```", 1)[0])
            if isinstance(data, dict) and {"factors", "fixed", "extra_runs"} & set(data):
                yield f"{page.relative_to(ROOT)}: {next(iter(data))}", data


def test_the_docs_examples_use_todays_keys():
    examples = list(_yaml_playbooks())
    assert len(examples) >= 5  # the playbooks guide's and the guides' designs
    assert not [where for where, data in examples if playbook_keys.current(data, where).notes]
