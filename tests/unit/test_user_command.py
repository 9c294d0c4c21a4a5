"""A user's own command (pure parts): each rank's environment and hosts file, its plan, the
CLI's flags, step lines read with a regex, the spawner's wrapping and stop request, and the
record's framework and source."""

from __future__ import annotations

import io
import os
import sys
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from netbench.cli import app as cli
from netbench.jobs import events as ev
from netbench.jobs import user, user_results
from netbench.jobs.stop_margin import stop_margin
from netbench.model import command_job
from netbench.model.command_job import Place, UserCommand
from netbench.model.job import JobSpec, describe_plan, plan_job
from netbench.model.topology import plan_topology

REGEX = r"step (?P<step>\d+) took (?P<ms>[\d.]+) ms"


def nodes(count=3):
    return plan_topology(count, ipaddress.ip_network("10.7.0.0/24")).nodes


def command_job_spec(**kw) -> JobSpec:
    return JobSpec(strategy="command", model="command", batch_size=0, warmup=2,
                   command=UserCommand(argv=("python", "train.py", "--x"), **kw))


def test_every_rank_gets_the_frameworks_variables_with_rank_0_as_master():
    tasks = plan_job(command_job_spec(), nodes(), 3, port=30000)
    assert [t.index for t in tasks] == [0, 1, 2] and [t.node for t in tasks] == ["n1", "n2", "n3"]
    env = [dict(t.env) for t in tasks]
    addresses = [t.address for t in tasks]
    for rank, e in enumerate(env):
        assert e["RANK"] == e["NETBENCH_RANK"] == e["PET_NODE_RANK"] == e["JAX_PROCESS_ID"] == str(rank)
        assert e["WORLD_SIZE"] == e["NETBENCH_WORLD_SIZE"] == e["PET_NNODES"] == "3"
        assert e["MASTER_ADDR"] == e["PET_MASTER_ADDR"] == addresses[0]
        assert e["MASTER_PORT"] == e["PET_MASTER_PORT"] == "30000"
        assert e["NETBENCH_ADDRESS"] == e["PET_LOCAL_ADDR"] == addresses[rank]
        assert e["NETBENCH_PEERS"] == ",".join(addresses) and e["NETBENCH_NODE"] == f"n{rank + 1}"
        assert (e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["PET_NPROC_PER_NODE"]) == ("0", "1", "1")
        assert e["GLOO_SOCKET_IFNAME"] == nodes()[rank].ifname
        assert e["JAX_COORDINATOR_ADDRESS"] == f"{addresses[0]}:30002" and e["NETBENCH_WARMUP"] == "2"
        tf = json.loads(e["TF_CONFIG"])
        assert tf == {"cluster": {"worker": [f"{a}:30001" for a in addresses]}, "task": {"type": "worker", "index": rank}}
    assert all(t.argv == ("python", "train.py", "--x") and not t.serves for t in tasks)


def test_the_hosts_file_names_every_node_at_its_address():
    places = [Place("n1", "netbench-n1", "10.7.0.1", "eth0"), Place("n2", "netbench-n2", "10.7.0.2", "eth0")]
    text = command_job.hosts_text(places)
    assert "127.0.0.1\tlocalhost" in text.splitlines()
    assert "10.7.0.1\tnetbench-n1" in text.splitlines() and "10.7.0.2\tnetbench-n2" in text.splitlines()


def test_with_a_step_regex_only_rank_0_reports_and_a_dry_run_shows_each_ranks_command():
    tasks = plan_job(command_job_spec(step_regex=REGEX, images_per_step=64), nodes(2), 2, port=0)
    assert [t.serves for t in tasks] == [False, True]
    lines = describe_plan(tasks)
    assert lines[0].startswith("rank 0 on n1") and "reports steps" in lines[0]
    assert "  $ python train.py --x" in lines and "    MASTER_PORT=<port>" in lines
    assert any(l.startswith("rank 1 on n2") and "output ignored" in l for l in lines)


@pytest.mark.parametrize("command, message", [
    (UserCommand(argv=()), "command: empty"),
    (UserCommand(argv=("x",), step_regex="(unclosed"), "step-regex:"),
    (UserCommand(argv=("x",), step_regex=r"(?P<seconds>\d)(?P<ms>\d)", images_per_step=1), "not both"),
    (UserCommand(argv=("x",), step_regex=REGEX), "needs images-per-step"),
    (UserCommand(argv=("x",), images_per_step=0), "images-per-step: must be at least 1"),
])
def test_bad_commands_name_the_setting(command, message):
    with pytest.raises(ValueError, match=message):
        command_job.check_command(command)


def invoke(*args):
    return CliRunner().invoke(cli.main, list(args))


def test_sweep_dry_run_prints_each_ranks_command_and_environment():
    result = invoke("sweep", "--latency", "1,20ms", "--workers", "2", "--dry-run", "--", "python", "job.py", "--lr", "1")
    assert result.exit_code == 0, result.output
    assert "strategy command" in result.output
    assert result.output.count("$ python job.py --lr 1") == 2
    assert "NETBENCH_RANK=1" in result.output and "PET_NNODES=2" in result.output
    assert "a job that never imports it is measured in bytes on each node's link instead (10 s warm-up after " \
           "its first bytes, then a 10 s window; no images/s)" in result.output


def test_a_playbooks_dry_run_prints_the_command_each_rank_runs(tmp_path):
    book = tmp_path / "book.yaml"
    book.write_text("name: ring\nfactors:\n  bandwidth: [1gbit, 20mbit]\nfixed:\n  workers: 2\nwarmup: 2\n"
                    "seconds: 5s\ncommand: [python, ring.py, --kib, 32]\nimages_per_step: 8\nstep_regex: 'x (?P<ms>.*)'\n")
    result = invoke("run", str(book), "--dry-run", "--output", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert result.output.count("$ python ring.py --kib 32") == 2 and "NETBENCH_RANK=1" in result.output
    assert "steps: rank 0's output lines that match 'x (?P<ms>.*)', 8 images each" in result.output
    assert "rank 1 on n2" in result.output and "output ignored" in result.output  # with a regex, rank 0 reports


@pytest.mark.parametrize("args, message", [
    (["--step-regex", "x"], "flag --step-regex: only with a COMMAND"),
    (["--images-per-step", "8"], "flag --images-per-step: only with a COMMAND"),
    (["--step-regex", "(x", "--", "python", "j.py"], "flag --step-regex"),
    (["--step-regex", "x", "--", "python", "j.py"], "needs images-per-step"),
    (["--verify", "--", "python", "j.py"], "flag --verify: not with a COMMAND"),
    (["--schedule", "profiles/schedules/spike.yaml", "--", "python", "j.py"], "flag --schedule: not with a COMMAND"),
    # it was a traceback (the plan's framework check) once the testbed was up
    (["--framework", "torch", "--", "python", "j.py"], "flag --framework: torch picks netbench's built-in workload"),
])
def test_sweep_refuses_flags_that_do_not_fit_a_command(args, message):
    result = invoke("sweep", "--latency", "1ms", "--dry-run", *args)
    assert result.exit_code != 0 and message in result.output, result.output


def test_regex_lines_become_step_events_with_warm_up_first():
    stream = io.BytesIO(b"loading\nstep 0 took 12.5 ms\nstep 1 took 10 ms\nnoise\nstep 2 took 8 ms\n")
    times = iter([1.0, 2.0, 3.0, 4.0, 5.0])
    reader = user.RegexSteps(stream, REGEX, images=64, warmup=1, clock=lambda: next(times))
    lines = list(iter(reader.readline, b""))
    events = [ev.parse_line(line) for line in lines]
    steps = [e for e in events if isinstance(e, ev.Step)]
    assert [e is None for e in events] == [True, False, False, True, False]  # other lines pass through
    assert [(s.step, s.phase, s.images) for s in steps] == [(0, "warmup", 64), (1, "measured", 64), (2, "measured", 64)]
    assert [s.duration for s in steps] == [0.0125, 0.010, 0.008] and steps[0].end == 2.0


def test_without_a_time_group_a_step_is_the_time_between_lines():
    reader = user.RegexSteps(io.BytesIO(), r"^tick", images=8, warmup=0)
    assert reader.step_of("tick", 10.0) is None  # the first line only starts the clock
    first, second = reader.step_of("tick", 10.5), reader.step_of("tick", 11.25)
    assert (first["step"], first["duration"], second["step"], second["duration"]) == (0, 0.5, 1, 0.75)
    assert reader.step_of("tock", 12.0) is None


@dataclass
class FakeTask:
    stdout: io.BytesIO

    def wait(self):
        return 0

    def failure(self, code):
        return None

    def stop(self, grace):
        self.stopped = grace


def test_the_spawner_gives_each_rank_its_hostname_control_file_and_records_it(tmp_path):
    started = []

    def spawn(task, log, env):
        started.append((task, env))
        return FakeTask(io.BytesIO(b'{"event": "step", "step": 7, "start": 0, "end": 1, "duration": 1}\n'))

    tasks = plan_job(command_job_spec(), nodes(2), 2, port=30000)
    spawner = user.UserSpawner(spawn, tmp_path / "launch000", warmup=2)
    procs = [spawner(t, tmp_path / "launch000" / f"{t.node}.log", {"EXTRA": "1"}) for t in tasks]
    task, env = started[1]
    assert task.argv[:3] == ("unshare", "--uts", "--mount") and task.argv[-3:] == ("python", "train.py", "--x")
    hosts_file = Path(task.argv[-4])
    assert task.argv[-5] == "netbench-n2" and "netbench-n2" in hosts_file.read_text()
    assert env["EXTRA"] == "1" and env["RANK"] == "1" and env["NETBENCH_CONTROL"] == str(spawner.control)
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)  # `python` is netbench's
    ranks = json.loads((tmp_path / "launch000" / "ranks.json").read_text())
    assert [r["env"]["MASTER_PORT"] for r in ranks] == ["30000", "30000"] and ranks[0]["argv"][0] == "python"
    assert procs[0].stdout.readline() and spawner.last_step == 7  # heard on the way to the reader
    unknown = stop_margin(None, 0.0)  # one step heard: no step time yet
    assert spawner.request_stop(wait_s=0) == 7 + 1 + unknown
    assert spawner.control.read_text().strip() == str(7 + 1 + unknown)
    procs[0].stop(0.5)  # asked to stop, and still running: it never got there
    assert json.loads((tmp_path / "launch000" / "ranks.json").read_text())[0]["ended"].startswith("killed: ")


def test_on_hosts_ranks_keep_their_own_hostname(tmp_path):
    seen = []
    spawner = user.UserSpawner(lambda t, log, env: seen.append(t) or FakeTask(io.BytesIO()), tmp_path,
                               own_hostnames=False)
    task = plan_job(command_job_spec(), nodes(1), 1, port=30000)[0]
    spawner(task, tmp_path / "n1.log", {})
    assert seen[0].argv == ("python", "train.py", "--x")


def test_a_job_that_asks_to_stop_is_told_apart_and_its_record_names_framework_and_source():
    job = command_job_spec()
    start = ev.received(ev.parse_line(json.dumps({"event": "start", "framework": "torch 2.13.0", "source": "track"})),
                        0, "worker", 1.0)
    step = ev.received(ev.parse_line(json.dumps({"event": "step", "step": 0, "images": 128})), 0, "worker", 2.0)
    asked = ev.received(ev.parse_line('{"event": "stop-checked", "step": 1}'), 0, "worker", 3.0)
    assert user.checks_stop([start, step, asked]) and not user.checks_stop([start, step])
    assert user_results.origin([start, step], job) == {"framework": "torch 2.13.0", "source": "track"}
    assert user_results.resolved_job(job, [start, step], 2).batch_size == 64
    regex = command_job_spec(step_regex=REGEX, images_per_step=96)
    assert user_results.origin([], regex)["source"] == "regex"
    assert user_results.resolved_job(regex, [step], 2).batch_size == 48
    assert user_results.origin([], JobSpec()) == {"framework": "tensorflow", "source": "harness"}
    assert user_results.resolved_job(JobSpec(), [step], 2) == JobSpec()


# ---------------------------------------------------------------- a user's command in a sweep's launches

from netbench.experiment.runner import SweepConfig, run_sweep  # noqa: E402
from netbench.model import design  # noqa: E402
from netbench.model.profile import Profile  # noqa: E402
from netbench.state.journal import Journal  # noqa: E402
from netbench.experiment.launch import Settle  # noqa: E402
from tests.fakes.sweep import ContinuousProcess, ContinuousStdout, SyntheticTestbed  # noqa: E402


class AsksToStop:
    """A rank's stdout that first says it asks track.stop_requested(), then steps."""

    def __init__(self, inner) -> None:
        self.inner, self.said = inner, False
        self.stopped = inner.stopped

    def readline(self) -> bytes:
        if not self.said:
            self.said = True
            return b'{"event": "stop-checked", "step": 0}\n'
        return self.inner.readline()


class CommandTestbed(SyntheticTestbed):
    """Ranks of a user's command step until stopped (they get no --until-stopped)."""

    def __init__(self, journal, asks: bool) -> None:
        super().__init__(journal)
        self.asks = asks
        self.envs: list[dict] = []

    def spawn(self, task, log, env):
        self.spawned.append(task)
        self.envs.append(env)
        stdout = ContinuousStdout(task, self.job.warmup, 32, self.workers, self.pace, pid=1000 + len(self.spawned))
        return ContinuousProcess(AsksToStop(stdout) if self.asks else stdout)


def command_sweep(tmp_path, asks: bool, isolate: bool = False):
    job = replace_job(command_job_spec(), warmup=2, steps=4)
    runs = design.plan_sweep(Profile(name="base"), design.SweepLevels(delay_us=(1000, 2000, 3000)), 1, job, 2)
    config = SweepConfig(sweep_id="s", runs=tuple(runs), job=job, workers=2, output=tmp_path / "out",
                         settle=Settle(steps=2, seconds=0.0), order_seed=3, isolate=isolate)
    testbed = CommandTestbed(Journal(tmp_path / "state"), asks)
    return run_sweep(config, testbed=testbed), testbed


def replace_job(job, **kw):
    from dataclasses import replace

    return replace(job, **kw)


def test_a_command_that_never_asks_to_stop_gets_a_launch_per_point(tmp_path):
    results, testbed = command_sweep(tmp_path, asks=False)
    assert all(r.status == "ok" and r.source == "track" and r.strategy == "command" for r in results), results
    assert sorted(r.launch for r in results) == [0, 1, 2] and len(testbed.spawned) == 6
    assert not (tmp_path / "out" / "logs" / "launch000" / "control").exists()
    assert all("--until-stopped" not in t.argv for t in testbed.spawned)
    assert {e["NETBENCH_RANK"] for e in testbed.envs} == {"0", "1"}


def test_a_command_that_asks_serves_every_point_and_is_asked_to_stop_after_the_same_step(tmp_path):
    results, testbed = command_sweep(tmp_path, asks=True)
    assert all(r.status == "ok" for r in results) and {r.launch for r in results} == {0}
    assert len(testbed.spawned) == 2 and all(r.batch_size == 32 for r in results)
    stop_at = int((tmp_path / "out" / "logs" / "launch000" / "control").read_text())
    last = max(e["step"] for r in results for e in json.loads(
        (tmp_path / "out" / "runs" / f"{r.run_id}.json").read_text())["events"] if e["event"] == "step")
    assert stop_at > last + 1  # ahead of every step heard, so each rank reads it before reaching it


def test_isolate_starts_a_command_anew_for_every_point(tmp_path):
    results, testbed = command_sweep(tmp_path, asks=True, isolate=True)
    assert all(r.status == "ok" for r in results) and sorted(r.launch for r in results) == [0, 1, 2]
    assert len(testbed.spawned) == 6


# ---------------------------------------------------------------- a playbook's command:

from netbench.model.playbook import PlaybookError, playbook_from_mapping  # noqa: E402


def test_a_playbooks_command_runs_in_every_run_with_its_step_regex():
    book = playbook_from_mapping({"factors": {"latency": ["1ms", "20ms"]}, "fixed": {"workers": 2},
                                  "command": ["python", "train.py", 3], "images_per_step": 64,
                                  "step_regex": REGEX}, "book.yaml")
    runs = design.expand(book, seed=1)
    assert len(runs) == 2 and all(r.job.command == UserCommand(("python", "train.py", "3"), 64, REGEX) for r in runs)
    assert all(r.job.strategy == "command" and r.job.batch_size == 32 for r in runs)


@pytest.mark.parametrize("extra, key", [
    ({"command": "python train.py"}, "command"),
    ({"step_regex": "x"}, "step_regex"),
    ({"command": ["python"], "images_per_step": "many"}, "images_per_step"),
    ({"command": ["python"], "step_regex": REGEX}, "step"),
    ({"command": ["python"], "factors": {"latency": ["1ms"], "model": ["mlp", "cnn"]}}, "factors.model"),
])
def test_a_bad_playbook_command_names_its_key(extra, key):
    with pytest.raises(PlaybookError, match=f"book.yaml: {key}"):
        playbook_from_mapping({"factors": {"latency": ["1ms"]}, **extra}, "book.yaml")


def test_live_metrics_take_a_track_jobs_images_from_its_events():
    from netbench.metrics.state import MetricsObserver, MetricsState

    job = command_job_spec()
    run = design.plan_sweep(Profile(name="base"), design.SweepLevels(delay_us=(1000,)), 1, job, 2)[0]
    state = MetricsState()
    observer = MetricsObserver(state)
    observer.run_started(run)
    observer.step(run, ev.Step(step=0, phase="measured", start=0.0, end=0.5, duration=0.5, images=128,
                               worker=0, role="worker"))
    assert state.snapshot().run_images_per_s == pytest.approx(256.0)


def test_on_a_host_a_command_runs_as_written_with_its_environment():
    import shlex

    from tests.unit.test_hosts_testbed import INV, host_node
    from netbench.testbed.hosts import task_command

    tasks = plan_job(command_job_spec(), tuple(host_node(h) for h in INV.hosts), 2, port=3333)
    argv = shlex.split(task_command(INV.host("b"), tasks[1], dict(tasks[1].env)))
    assert argv[argv.index("--") + 1:] == ["python", "train.py", "--x"]
    env = dict(argv[i + 1].split("=", 1) for i, word in enumerate(argv) if word == "--env")
    assert env["RANK"] == "1" and env["MASTER_ADDR"] == tasks[0].address and "cluster" in env["TF_CONFIG"]


def test_descendants_are_found_through_the_process_tree():
    import subprocess
    import sys

    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen(['sleep', '30'], start_new_session=True); time.sleep(30)"])
    try:
        import time

        deadline = time.monotonic() + 10
        while not user.descendants(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        (child,) = user.descendants(parent.pid)
        assert Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"sleep")
    finally:
        for pid in user.descendants(parent.pid):
            os.kill(pid, 9)
        parent.kill()
        parent.wait()


def test_a_sweep_refuses_a_job_that_cannot_run_before_it_sets_anything_up(tmp_path):
    # a playbook or an API caller can hand the runner what the flags refuse: a torch job running a
    # user's command was a traceback from the first launch's placement, after the testbed was up
    from netbench.errors import UsageError

    job = JobSpec(strategy="command", model="command", batch_size=0, warmup=0, seconds=0.6, framework="torch",
                  command=UserCommand(argv=("python", "j.py")))
    runs = design.plan_sweep(Profile(name="base"), design.SweepLevels(delay_us=(1000,)), 1, job, 2)
    config = SweepConfig(sweep_id="s", runs=tuple(runs), job=job, workers=2, output=tmp_path / "out",
                         settle=Settle(steps=2, seconds=0.0))
    testbed = SyntheticTestbed(Journal(tmp_path / "state"))
    with pytest.raises(UsageError, match="setting strategy: command is not available with framework torch"):
        run_sweep(config, testbed=testbed)
    assert testbed.config is None and not (tmp_path / "out").exists()  # nothing prepared, no folder made
