"""Sweeps and playbooks with schedules: the link changes during a run once measuring begins.

The synthetic testbed (tests/fakes/sweep.py) stands in for the workers; `hold` paces the
chief's steps so each assertion is about order, never about time.
"""

from __future__ import annotations

import csv
import json
import threading
import time

import pytest
from click.testing import CliRunner

from netbench.cli import app as cli
from netbench.errors import UsageError
from netbench.experiment.runner import SweepConfig, run_sweep
from netbench.jobs import events as ev
from netbench.metrics.state import MetricsObserver, MetricsState, ObserverTee
from netbench.model import design
from netbench.model.job import JobSpec
from netbench.model.playbook import PlaybookError, load_playbook
from netbench.model.profile import Profile
from netbench.model.schedule import schedule_from_mapping
from netbench.state.journal import Journal
from tests.fakes.sweep import SyntheticTestbed

WARMUP, STEPS = 2, 8
WAIT_S = 20.0  # the longest a paced step waits for a change before the test goes on (and fails)


def wave(repeat: bool = False) -> object:
    data = {"name": "wave", "profile": {"delay": "5ms"},
            "steps": [{"at": "0s", "delay": "5ms"}, {"at": "20ms", "delay": "30ms"}, {"at": "40ms", "delay": "10ms"}]}
    if repeat:
        data.update(repeat=True, period="60ms")
    return schedule_from_mapping(data, "wave.yaml")


def by_steps() -> object:
    return schedule_from_mapping({"name": "stepper", "profile": {"delay": "1ms"},
                                  "steps": [{"at_step": 0, "delay": "1ms"}, {"at_step": 2, "delay": "20ms"},
                                            {"at_step": 5, "delay": "40ms"}]}, "stepper.yaml")


class Recorder:
    """An observer that logs, in order, the chief's measured steps and every profile applied."""

    def __init__(self, interrupt_at: int | None = None) -> None:
        self.log: list[tuple] = []
        self.notes: list[str] = []
        self.interrupt_at = interrupt_at

    def sweep_started(self, *a): pass
    def run_started(self, *a): pass
    def launch_point(self, *a): pass
    def window(self, *a): pass
    def run_finished(self, *a): pass

    def profile_applied(self, run) -> None:
        self.log.append(("profile", run.profile.delay_us))

    def step(self, run, event) -> None:
        if isinstance(event, ev.Step) and event.worker == 0 and event.measured:
            self.log.append(("step", event.step - WARMUP))
            if self.interrupt_at is not None and event.step - WARMUP == self.interrupt_at:
                raise KeyboardInterrupt

    def note(self, text: str) -> None:
        self.notes.append(text)


def wait_for(condition) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)


def sweep(tmp_path, schedule, hold_for=None, chief_stops_after=None, observer=None):
    """One run under `schedule`; hold_for(testbed, measured_step) may pace the chief's steps."""
    job = JobSpec(warmup=WARMUP, steps=STEPS)
    runs = design.sweep_runs((), 1, job, 2, schedules=(schedule,), base=Profile(name="base"))
    config = SweepConfig(sweep_id="s", runs=runs, job=job, workers=2, output=tmp_path / "out")
    box = {}

    def hold(task, k):
        if hold_for is not None and task.index == 0 and task.role == "worker" and k >= WARMUP:
            hold_for(box["testbed"], k - WARMUP)

    testbed = box["testbed"] = SyntheticTestbed(Journal(tmp_path / "state"), hold=hold,
                                                chief_stops_after=chief_stops_after)
    results = run_sweep(config, observer or Recorder(), testbed=testbed)
    return results, testbed


def no_schedule_thread() -> bool:
    return not any(t.name == "netbench-schedule" and t.is_alive() for t in threading.enumerate())


# ---------------------------------------------------------------- the design

def test_a_schedule_point_starts_on_its_first_entry_and_is_named_after_the_schedule():
    runs = design.sweep_runs((Profile(name="d1", delay_us=1000),), 2, JobSpec(), 2, schedules=(wave(),),
                             base=Profile(name="base"))
    assert [r.profile.name for r in runs] == ["d1", "d1", "wave", "wave"]  # the grid first, then each schedule
    assert runs[2].schedule.name == "wave" and runs[2].profile.delay_us == 5000 and len(runs[2].timeline) == 3
    assert runs[0].schedule is None and runs[0].timeline == ()


def test_a_schedule_whose_first_step_is_later_starts_on_its_base():
    late = schedule_from_mapping({"name": "late", "steps": [{"at": "1s", "delay": "50ms"}]}, "late.yaml")
    (run,) = design.sweep_runs((), 1, JobSpec(), 2, schedules=(late,), base=Profile(name="base", delay_us=2000))
    assert run.profile.delay_us == 2000 and run.profile.name == "late" and len(run.timeline) == 1


# ---------------------------------------------------------------- the runner

def test_a_time_schedule_makes_its_changes_in_order_after_measuring_starts(tmp_path):
    def hold(testbed, measured):  # the chief's last step waits until both changes landed
        if measured == STEPS - 1:
            wait_for(lambda: len(testbed.applied) >= 3)

    recorder = Recorder()
    state = MetricsState()
    results, testbed = sweep(tmp_path, wave(), hold, observer=ObserverTee(MetricsObserver(state), recorder))
    assert results[0].status == "ok", results[0].error
    assert [p.delay_us for p in testbed.applied] == [5000, 30000, 10000]
    first_step = recorder.log.index(("step", 0))
    changes = [i for i, item in enumerate(recorder.log) if item in (("profile", 30000), ("profile", 10000))]
    assert len(changes) == 2 and all(i > first_step for i in changes)
    # the metrics observer saw the start and each change, by the profiles' names
    snap = state.snapshot()
    assert snap.profile_applications == 3 and {"wave", "wave@0.02s", "wave@0.04s"} <= set(snap.profile_applied_at)
    assert any("schedule wave" in note and "wave@0.02s" in note for note in recorder.notes)
    assert no_schedule_thread()


def test_the_record_and_results_csv_carry_the_schedule(tmp_path):
    def hold(testbed, measured):
        if measured == STEPS - 1:
            wait_for(lambda: len(testbed.applied) >= 3)

    sweep(tmp_path, wave(), hold)
    record = json.loads((tmp_path / "out" / "runs" / "r000.json").read_text())
    section = record["schedule"]
    assert section["name"] == "wave" and section["source"] == "wave.yaml" and section["entries"] == 3
    assert [c["profile"]["delay_us"] for c in section["changes"]] == [30000, 10000]
    assert [c["index"] for c in section["changes"]] == [1, 2]
    # a change may start early by the last changes' duration (run_schedule's lead): lateness is signed
    assert all(c["landed_s"] >= c["started_s"] and c["lateness_ms"] == pytest.approx(
        (c["landed_s"] - c["scheduled_s"]) * 1000, abs=0.01) for c in section["changes"])
    assert section["changes"][0]["scheduled_s"] == pytest.approx(0.02)
    assert set(section["lateness_ms"]) == {"changes", "mean", "p99", "max"} and section["lateness_ms"]["changes"] == 2
    assert section["measuring_started"] is not None and section["error"] is None
    assert record["profile"]["name"] == "wave"
    with open(tmp_path / "out" / "results.csv", newline="") as fh:
        header, row = next(csv.reader(fh)), None
    at = header.index("status")  # appended after the columns before them, which are unchanged
    assert header[at:at + 5] == ["status", "error", "schedule", "step", "split_from"]
    with open(tmp_path / "out" / "results.csv", newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert row["schedule"] == "wave" and row["profile"] == "wave"


def test_at_step_changes_follow_the_chiefs_step_events(tmp_path):
    due = {2: 2, 5: 3}  # measured steps finished -> profiles applied by then (start included)

    def hold(testbed, measured):  # before step m the chief has finished m steps: what is due has landed
        need = max((n for m, n in due.items() if m <= measured), default=1)
        wait_for(lambda: len(testbed.applied) >= need)

    recorder = Recorder()
    results, testbed = sweep(tmp_path, by_steps(), hold, observer=recorder)
    assert results[0].status == "ok", results[0].error
    assert [p.delay_us for p in testbed.applied] == [1000, 20000, 40000]
    steps_before = {delay: sum(1 for item in recorder.log[:recorder.log.index(("profile", delay))]
                               if item[0] == "step") for delay in (20000, 40000)}
    assert steps_before == {20000: 2, 40000: 5}  # exactly when the chief had finished 2, then 5 steps
    record = json.loads((tmp_path / "out" / "runs" / "r000.json").read_text())
    assert [c["at_step"] for c in record["schedule"]["changes"]] == [2, 5]


def test_the_thread_stops_when_the_run_fails(tmp_path):
    results, testbed = sweep(tmp_path, wave(repeat=True), chief_stops_after=WARMUP + 3)
    assert results[0].status == "failed" and "exited with 1" in results[0].error
    assert no_schedule_thread() and testbed.finished
    applied = len(testbed.applied)
    record = json.loads((tmp_path / "out" / "runs" / "r000.json").read_text())
    assert len(record["schedule"]["changes"]) == applied - 1


def test_the_thread_stops_when_the_run_is_interrupted(tmp_path):
    def hold(testbed, measured):
        if measured == 3:
            wait_for(lambda: len(testbed.applied) >= 3)  # a repeating schedule is running

    with pytest.raises(KeyboardInterrupt):
        sweep(tmp_path, wave(repeat=True), hold, observer=Recorder(interrupt_at=3))
    assert no_schedule_thread()


def test_a_schedule_that_fails_mid_run_fails_the_run_and_says_why(tmp_path):
    class Broken(SyntheticTestbed):
        raised = False

        def apply(self, run, seed):
            if self.applied:
                self.raised = True
                raise UsageError("the link went away")
            super().apply(run, seed)

    job = JobSpec(warmup=WARMUP, steps=STEPS)
    runs = design.sweep_runs((), 1, job, 2, schedules=(wave(),))
    config = SweepConfig(sweep_id="s", runs=runs, job=job, workers=2, output=tmp_path / "out")
    box = {}

    def hold(task, k):
        if task.index == 0 and task.role == "worker" and k == WARMUP + STEPS - 1:
            wait_for(lambda: box["testbed"].raised)

    testbed = box["testbed"] = Broken(Journal(tmp_path / "state"), hold=hold)
    (result,) = run_sweep(config, Recorder(), testbed=testbed)
    assert result.status == "failed" and result.error == "schedule: the link went away"
    assert result.schedule["error"] == "the link went away" and no_schedule_thread()


# ---------------------------------------------------------------- hosts

def test_the_hosts_target_refuses_schedules():
    from netbench.testbed.hosts import refuse_schedules

    runs = design.sweep_runs((), 1, JobSpec(), 2, schedules=(wave(),))
    config = SweepConfig(sweep_id="s", runs=runs, job=JobSpec(), workers=2, output=None)
    with pytest.raises(UsageError, match="schedule wave: not with --inventory"):
        refuse_schedules(config)


# ---------------------------------------------------------------- playbooks

SPIKE = "name: spike\nprofile: {delay: 5ms}\nsteps:\n  - {at: 0s, delay: 5ms}\n  - {at: 2s, delay: 30ms}\n"


def write_book(tmp_path, body: str, schedule: str = SPIKE):
    (tmp_path / "sched").mkdir(exist_ok=True)
    (tmp_path / "sched" / "spike.yaml").write_text(schedule)
    (tmp_path / "book.yaml").write_text(body)
    return tmp_path / "book.yaml"


def test_a_playbook_schedule_is_relative_to_the_playbook_and_crosses_every_point(tmp_path):
    book = load_playbook(write_book(tmp_path, "factors: {workers: [2, 3]}\nschedule: sched/spike.yaml\n"
                                              "order: as-written\n"))
    runs = design.expand(book, seed=1)
    assert [(r.settings.workers, r.profile.name, r.schedule.name) for r in runs] == [(2, "spike", "spike"),
                                                                                     (3, "spike", "spike")]
    assert runs[0].timeline[1].profile.delay_us == 30000
    assert design.describe_settings(runs[0].settings)["schedule"] == "spike.yaml"


def test_a_playbook_without_a_schedule_keeps_its_digest(tmp_path):
    from dataclasses import asdict

    book = load_playbook(write_book(tmp_path, "factors: {latency: [1ms, 2ms]}\n"))
    runs = design.expand(book, seed=1)
    assert "schedule" not in design.plan_record(book, 1, runs)["runs"][0]
    assert "schedule" in asdict(runs[0].settings)  # it is dropped from the record only when unset


@pytest.mark.parametrize("body, schedule, message", [
    ("factors: {latency: [1ms]}\nschedule: sched/none.yaml\n", SPIKE, "book.yaml: schedule: "),
    ("factors: {latency: [1ms]}\nschedule: 3\n", SPIKE, "book.yaml: schedule: must be a path"),
    ("factors: {latency: [1ms]}\nschedule: [sched/spike.yaml, sched/spike.yaml]\n", SPIKE,
     "book.yaml: schedule[1]: two schedules are named 'spike'"),
    ("factors: {latency: [1ms]}\nschedule: []\n", SPIKE, "book.yaml: schedule: must be a path"),
    ("factors: {latency: [1ms]}\nschedule: sched/spike.yaml\n", "name: spike\nsteps:\n  - {at: 1s, delai: 5ms}\n",
     "book.yaml: schedule: "),
    # over this point's profile, the schedule's jitter is above its delay
    ("factors: {latency: [1ms]}\nschedule: sched/spike.yaml\n", "name: spike\nsteps:\n  - {at: 1s, jitter: 5ms}\n",
     "book.yaml: schedule: "),
])
def test_playbook_schedule_errors_are_one_line_naming_file_and_key(tmp_path, body, schedule, message):
    with pytest.raises(PlaybookError) as caught:
        load_playbook(write_book(tmp_path, body, schedule))
    assert message in caught.value.message
    assert "\n" not in caught.value.message


# ---------------------------------------------------------------- the command line

def invoke(*args):
    return CliRunner().invoke(cli.main, list(args))


def test_sweep_dry_run_shows_each_schedules_length_and_duration(tmp_path):
    (tmp_path / "a.yaml").write_text(SPIKE)
    (tmp_path / "b.yaml").write_text("name: ramp\nsteps:\n  - {at: 1s, delay: 40ms, ramp: 1s}\n")
    result = invoke("sweep", "--latency", "1,2ms", "--schedule", f"{tmp_path / 'a.yaml'},{tmp_path / 'b.yaml'}",
                    "--dry-run", "--output", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert "4 runs" in result.output
    assert "r002  spike" in result.output and "r003  ramp" in result.output
    assert "schedule spike" in result.output and "2 change(s) over 2s" in result.output
    assert "schedule ramp" in result.output and "10 change(s) over 2s" in result.output


def test_sweep_with_only_schedules_has_no_grid_point(tmp_path):
    (tmp_path / "a.yaml").write_text(SPIKE)
    result = invoke("sweep", "--schedule", str(tmp_path / "a.yaml"), "--dry-run", "--output", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    assert "1 runs" in result.output and "r000  spike" in result.output


@pytest.mark.parametrize("extra, message", [
    (["--schedule", "missing.yaml"], "error: flag --schedule: missing.yaml"),
    (["--schedule", "{a},{a}"], "are both named 'spike'"),
    (["--schedule", "{a},"], "flag --schedule: an empty file name"),
    (["--schedule", "{a}", "--inventory", "hosts.yaml"], "flag --schedule: not with --inventory"),
])
def test_sweep_schedule_contradictions_are_one_line_errors(tmp_path, extra, message):
    (tmp_path / "a.yaml").write_text(SPIKE)
    args = [a.replace("{a}", str(tmp_path / "a.yaml")) for a in extra]
    result = invoke("sweep", *args, "--dry-run", "--output", str(tmp_path / "o"))
    assert result.exit_code != 0 and message in result.output
    assert len([line for line in result.output.splitlines() if line.startswith("error:")]) == 1


def test_playbook_dry_run_shows_its_schedules(tmp_path):
    path = write_book(tmp_path, "factors: {latency: [1ms]}\nschedule: sched/spike.yaml\n")
    result = invoke("run", str(path), "--dry-run", "--output", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert "schedule spike" in result.output and "2 change(s) over 2s" in result.output


def test_a_playbook_whose_schedule_changed_has_another_digest(tmp_path):
    path = write_book(tmp_path, "factors: {latency: [1ms]}\nschedule: sched/spike.yaml\n")
    book = load_playbook(path)
    before = design.design_digest(book, design.expand(book, seed=1))
    (tmp_path / "sched" / "spike.yaml").write_text(SPIKE.replace("30ms", "40ms"))
    book = load_playbook(path)
    assert design.design_digest(book, design.expand(book, seed=1)) != before


def test_a_run_whose_delay_engine_died_fails_and_says_which(tmp_path):
    class Dying(SyntheticTestbed):
        def emulation_lost(self):
            return "the delay engine on queue 1 in netbench-sw (pid 42) died"

    job = JobSpec(warmup=WARMUP, steps=STEPS)
    runs = design.sweep_runs((Profile(name="d", delay_us=5000),), 1, job, 2)
    config = SweepConfig(sweep_id="s", runs=runs, job=job, workers=2, output=tmp_path / "out")
    (result,) = run_sweep(config, Recorder(), testbed=Dying(Journal(tmp_path / "state")))
    assert result.status == "failed" and result.error == ("emulation: the delay engine on queue 1 in netbench-sw "
                                                          "(pid 42) died")
    stored = json.loads((tmp_path / "out" / "runs" / f"{result.run_id}.json").read_text())
    assert stored["status"] == "failed" and "died" in stored["error"]


@pytest.mark.parametrize("command", ["sweep", "run"])
@pytest.mark.parametrize("chief_stops_after, code", [(None, 0), (3, 1)])
def test_a_sweep_or_playbook_exits_1_when_a_run_failed(tmp_path, monkeypatch, chief_stops_after, code, command):
    """A script running sweeps needs the exit status: 1 when any run failed (every run is
    recorded first), 0 when all ended ok."""
    from netbench.cli import common, experiment as cli_experiment
    from netbench.experiment import runner

    real = runner.run_sweep
    monkeypatch.setattr(runner, "run_sweep", lambda config, observer, testbed=None: real(
        config, observer, testbed=SyntheticTestbed(Journal(tmp_path / "state"), chief_stops_after=chief_stops_after)))
    monkeypatch.setattr(common, "require_root", lambda: None)
    monkeypatch.setattr(common, "require_testbed", lambda use: None)  # the synthetic testbed, whatever is up here
    monkeypatch.setattr(cli_experiment, "_sigterm_as_interrupt", lambda: None)
    out = tmp_path / "out"
    if command == "sweep":
        args = ["sweep", "--latency", "1ms", "--warmup", "1", "--steps", "4"]
    else:
        args = ["run", str(write_book(tmp_path, "factors: {latency: [1ms]}\nwarmup: 1\nsteps: 4\n"))]
    result = CliRunner().invoke(cli.main, [*args, "--output", str(out)], terminal_width=200)
    assert result.exit_code == code, result.output
    (record,) = [json.loads(path.read_text()) for path in (out / "runs").glob("*.json")]
    assert record["status"] == ("ok" if code == 0 else "failed")
    if code:
        assert "1 of 1 run(s) failed: r000" in result.output
