"""Node capacity over time and inside ranks: schedule steps that change a node's cpus or step
delay, the step-delay file a rank polls (the harness's and netbench.track's), a child started in
its node's group, and results.csv's per-node columns."""

from __future__ import annotations

import csv
import importlib
import os
import subprocess
import sys
import time

import pytest

from netbench import proc
from netbench.errors import UsageError
from netbench.experiment.schedule import run_schedule
from netbench.experiment.store import CSV_COLUMNS, ResultStore
from netbench.jobs.harness import step_delay
from netbench.model import compute as cm
from netbench.model.profile import Profile
from netbench.model.schedule import compute_at, schedule_from_mapping, timeline
from tests.unit.test_results import result
from tests.unit.test_schedule_runner import FakeClock

STRAGGLER = {"name": "straggler", "steps": [{"at": "2s", "node": "n2", "cpus": 0.25},
                                           {"at": "7s", "node": "n2", "cpus": "max", "step_delay": "40ms"}]}


def test_a_schedule_slows_a_node_and_puts_it_back():
    schedule = schedule_from_mapping(STRAGGLER, "straggler.yaml")
    entries = timeline(schedule, Profile(name="base", delay_us=1000))
    assert [e.at_s for e in entries] == [2.0, 7.0] and all(e.profile.delay_us == 1000 for e in entries)
    start = cm.NONE.set("n1", step_delay_s=0.01)
    assert compute_at(start, entries[0]).cpus_of("n2") == 0.25
    later = compute_at(start, entries[1])
    assert later.cpus_of("n2") is None and later.delay_of("n2") == 0.04 and later.delay_of("n1") == 0.01
    assert compute_at(start, None) == start
    assert ("n2 cpus", "0.25") in entries[0].changes and ("n2 step_delay", "40ms") in entries[1].changes


@pytest.mark.parametrize("step, message", [
    ({"at": "1s", "cpus": 0.5}, "node: missing"), ({"at": "1s", "node": "n2"}, "says its cpus or step_delay"),
    ({"at": "1s", "node": "n2", "cpus": 0.5, "ramp": "1s"}, "not in a ramp"),
    ({"at": "1s", "node": "n2", "cpus": "fast"}, "cpus: 'fast' is not a number of CPUs")])
def test_bad_compute_steps_name_the_step_and_key(step, message):
    with pytest.raises(UsageError) as err:
        schedule_from_mapping({"steps": [step]}, "s.yaml")
    assert err.value.message.startswith("s.yaml: step 1") and message in err.value.message


def test_a_capacity_change_is_made_even_where_the_link_stays_the_same():
    entries = timeline(schedule_from_mapping(STRAGGLER, "straggler.yaml"), Profile(name="base"))
    clock = FakeClock()
    applied = []
    run_schedule(entries, applied.append, clock=clock, sleep=clock.sleep, base=Profile(name="base"))
    assert [p.name for p in applied] == ["base", "straggler@2s", "straggler@7s"]


def test_step_delay_reads_the_file_when_it_changes(tmp_path):
    path = tmp_path / "delay"
    delay = step_delay.StepDelay({step_delay.ENV_SECONDS: "0.02", step_delay.ENV_FILE: str(path)})
    assert delay.current() == 0.02  # no file yet: the start's
    step_delay.write(str(path), 0.04)
    assert delay.current() == 0.04
    step_delay.write(str(path), 0.0)
    assert delay.current() == 0.0 and delay.pause() == 0.0
    step_delay.write(str(path), 0.03)
    began = time.monotonic()
    assert delay.pause() == 0.03 and time.monotonic() - began >= 0.03


def test_track_adds_the_step_delay_inside_the_step(tmp_path, monkeypatch):
    path = tmp_path / "delay"
    step_delay.write(str(path), 0.05)
    monkeypatch.setenv("NETBENCH_STEP_DELAY_FILE", str(path))
    monkeypatch.delenv("NETBENCH_RANK", raising=False)
    import netbench.track as track

    track = importlib.reload(track)
    try:
        began = time.monotonic()
        with track.step():
            pass
        assert time.monotonic() - began >= 0.05
    finally:
        monkeypatch.delenv("NETBENCH_STEP_DELAY_FILE")
        importlib.reload(track)


def test_a_child_joins_its_group_before_its_command_runs(tmp_path):
    procs = tmp_path / "cgroup.procs"
    argv = proc.child_argv(["sh", "-c", "echo $$"], None, False, cgroup=str(procs))
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    assert procs.read_text().strip() == out  # the command's own pid, written before it ran
    failing = proc.child_argv(["true"], None, False, cgroup=str(tmp_path / "missing" / "cgroup.procs"))
    assert subprocess.run(failing, capture_output=True).returncode != 0  # never runs outside its group


def test_results_csv_gets_a_column_per_limited_node(tmp_path):
    store = ResultStore(tmp_path / "out")
    store.create()
    store.add(result("r000"))
    store.add(result("r001", compute=cm.NONE.set("n2", cpus=0.2).set("n2", step_delay_s=0.04).to_record()))
    store.add(result("r002", compute=cm.NONE.set("n3", cpus=0.5).to_record()))
    with open(store.csv_path, newline="") as fh:
        rows = list(csv.DictReader(fh))
        fh.seek(0)
        header = next(csv.reader(fh))
    assert header == list(CSV_COLUMNS) + ["cpus_n2", "cpus_n3", "step_delay_s_n2"]
    assert [(r["run_id"], r["cpus_n2"], r["cpus_n3"], r["step_delay_s_n2"]) for r in rows] == [
        ("r000", "", "", ""), ("r001", "0.2", "", "0.04"), ("r002", "", "0.5", "")]
    again = ResultStore(tmp_path / "out")
    again.create()  # a folder with node columns is resumed, not refused
    again.add(result("r003", compute=cm.NONE.set("n2", cpus=0.3).to_record()))
    assert [r["cpus_n2"] for r in again.read_rows()] == ["", "0.2", "", "0.3"]


def test_sweep_flags_cross_node_capacity_and_the_dry_run_prints_it(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from netbench.cli import app

    monkeypatch.setenv("NETBENCH_STATE_DIR", str(tmp_path))
    result = CliRunner().invoke(app.main, ["sweep", "--latency", "1ms", "--cpus", "n2=max,0.5", "--step-delay",
                                           "n2=0,40ms", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "d1ms+n2c0.5-n2s40ms" in result.output and "compute: n2 0.5 CPU, n2 +40ms/step" in result.output
    for args, message in ((["--cpus", "n2=64"], "n2 at 64 CPUs: this machine gives a node"),
                          (["--cpus", "n2=0.5", "--topology", "profiles/topologies/two-regions.yaml"],
                           "flag --cpus: not with --topology")):
        refused = CliRunner().invoke(app.main, ["sweep", *args, "--dry-run"])
        assert refused.exit_code == 2 and message in refused.output, refused.output
