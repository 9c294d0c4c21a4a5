"""How a user's command's ranks are asked to stop (jobs/user.py, jobs/stop_margin.py) and how
the request reaches ranks on hosts (testbed/host_task.py, remote/agent.py `run_task`). No
root, no SSH: hosts are tests/fakes/remote.py's; `node task` runs a real child here."""

from __future__ import annotations

import io
import json
import os
import sys
import threading
import time
from pathlib import Path

from tests.fakes.remote import FakeHost, task_stream

from netbench import proc
from netbench.jobs import user
from netbench.jobs.stop_margin import MIN_MARGIN_STEPS, STOP_SLACK_S, StepPace, stop_margin
from netbench.model.command_job import UserCommand
from netbench.model.job import JobSpec, plan_job
from netbench.remote.agent import run_task
from netbench.remote.inventory import inventory_from_mapping
from netbench.state.journal import Journal
from netbench.testbed.host_task import STOP_DELIVERY_S, RemoteTask
from netbench.testbed.hosts import host_node

INV = inventory_from_mapping({
    "defaults": {"interface": "eth1", "venv": "/opt/nb"},
    "hosts": {"a": {"ssh": "10.0.0.1", "tf_address": "10.9.0.1", "roles": ["chief", "worker"]},
              "b": {"ssh": "10.0.0.2", "tf_address": "10.9.0.2"}}}, "inv.yaml")


def command_tasks(count: int = 2):
    job = JobSpec(strategy="command", command=UserCommand(("python", "train.py"), 32))
    return plan_job(job, tuple(host_node(h) for h in INV.hosts[:count]), count, port=30000)


def step_line(step: int, end: float) -> str:
    return json.dumps({"event": "step", "step": step, "phase": "measured", "start": end - 0.001, "end": end,
                       "duration": 0.001, "images": 32})


# ---------------------------------------------------------------- the margin (pure)

def steps_reached(step_s: float, last_heard: int, late_s: float, delivery_s: float) -> int:
    """The steps a rank has completed when the request reaches it: the last heard, then one
    per step time over the time since that step ended there, plus one for a rank a step
    ahead of the one heard (a collective's ranks are within a step of each other)."""
    return last_heard + 1 + int((late_s + delivery_s) / step_s) + 1


def test_with_millisecond_steps_the_stop_lies_beyond_every_step_a_rank_reaches_before_it_arrives():
    for late_s, delivery_s in [(0.0, 0.0), (0.004, 0.0), (0.05, 0.0), (0.2, 0.0), (0.03, STOP_DELIVERY_S)]:
        at = 1000 + 1 + stop_margin(0.001, late_s, delivery_s)
        assert at > steps_reached(0.001, 1000, late_s, delivery_s), (late_s, delivery_s, at)
        # and not absurdly far: the ranks stop within the time the lag and delivery take, plus the slack
        assert (at - 1001) * 0.001 <= late_s + delivery_s + STOP_SLACK_S + 0.003
    # a constant of 3 steps is 3 ms here: any lag of the controller beyond it split the ranks
    assert stop_margin(0.001, 0.004) > 3 + 4


def test_with_slow_steps_the_margin_stays_a_few_steps_and_unknown_pace_takes_the_minimum():
    assert stop_margin(2.0, 0.05) == MIN_MARGIN_STEPS + 1
    assert stop_margin(0.1, 0.05) == MIN_MARGIN_STEPS + 3  # (0.05 + 0.25) / 0.1
    assert stop_margin(None, 5.0) == stop_margin(float("nan"), 5.0) == stop_margin(0.0, 5.0) == MIN_MARGIN_STEPS + 1


def test_the_pace_is_the_ranks_own_step_time_and_the_lag_is_measured_against_the_least_seen():
    pace = StepPace()
    offset = 5000.0  # a host's monotonic clock is not ours (the controller's is the true time here)
    for step in range(40):
        end = 100.0 + step * 0.001  # when the step ended, on the controller's clock
        lag = 0.040 if step == 39 else 0.0005  # the last step heard 40 ms late (the controller was busy)
        pace.heard(0, end - offset, end + lag)  # rank 0's clock is `offset` behind ours
        pace.heard(1, end + 0.0002 + offset, end + 0.0002 + lag)  # rank 1's ahead, its steps 0.2 ms later
    assert abs(pace.step_s() - 0.001) < 1e-9
    heard_last = 100.039 + 0.040
    assert abs(pace.late_s(heard_last + 0.010) - (0.0395 + 0.010)) < 1e-6  # its lag beyond the least, and since


def spawner_with_steps(tmp_path: Path, lines: list[str]) -> user.UserSpawner:
    class Task:
        exited = None  # a rank that never ends by itself: stop() takes no exit status from it

        def __init__(self) -> None:
            self.stdout = io.BytesIO("".join(line + "\n" for line in lines).encode())

        def wait(self):
            return 0

        def failure(self, code):
            return None

        def stop(self, grace):
            pass

    spawner = user.UserSpawner(lambda task, log, env: Task(), tmp_path, own_hostnames=False)
    started = spawner(command_tasks(1)[0], tmp_path / "a.log", {})
    while started.stdout.readline():
        pass
    return spawner


def test_a_stop_asked_of_a_millisecond_step_job_is_past_where_its_ranks_get_meanwhile(tmp_path):
    now = time.monotonic()
    lines = [step_line(step, now - 0.060 + step * 0.001) for step in range(50)]  # 1 ms steps, the last 11 ms ago
    spawner = spawner_with_steps(tmp_path, lines)
    at = spawner.request_stop(wait_s=0)
    assert spawner.last_step == 49
    late_s = time.monotonic() - (now - 0.011)
    assert at > steps_reached(0.001, 49, late_s, 0.0) and at - 50 > 200  # the slack alone is 250 steps
    assert int((tmp_path / "control").read_text()) == at


def test_a_launcher_per_node_writes_several_ranks_steps_and_each_ranks_pace_is_its_own(tmp_path):
    """torchrun started once per node: one stdout carries ranks 0 and 1, each 0.5 s a step,
    their ends 1.4 ms apart. Read as one rank they were a 1.4 ms step, a margin of ~180 steps
    (90 s away) and a wait of 15 s: the ranks were killed long before the step they were
    asked to stop at, and ranks.json said "stopped"."""
    now = time.monotonic()
    lines = []
    for step in range(20):
        end = now - 0.2 - (19 - step) * 0.5
        for rank, offset in ((0, 0.0), (1, 0.0014)):
            lines.append(json.dumps({"event": "step", "step": step, "phase": "measured", "start": end + offset - 0.5,
                                     "end": end + offset, "duration": 0.5, "images": 32, "rank": rank}))
    spawner = spawner_with_steps(tmp_path, lines)
    assert abs(spawner.pace.step_s() - 0.5) < 1e-9
    at = spawner.request_stop(wait_s=15.0)
    assert at == 19 + 1 + MIN_MARGIN_STEPS + 1  # the slack (0.25 s) is within one 0.5 s step
    assert spawner.asked - time.monotonic() > 15.0 + (at - 20) * 0.5 - 0.5  # time to get there and end


def test_ranks_json_says_a_rank_was_killed_when_it_did_not_stop_where_it_was_asked(tmp_path):
    spawner = spawner_with_steps(tmp_path, [step_line(step, 100.0 + step) for step in range(5)])
    spawner.processes[0].stop(0.0)  # never asked: a job that does not check stop_requested()
    ranks = json.loads((tmp_path / "ranks.json").read_text())
    assert ranks[0]["ended"] == "stopped"
    spawner = spawner_with_steps(tmp_path, [step_line(step, 100.0 + step) for step in range(5)])
    at = spawner.request_stop(wait_s=0.0)
    spawner.processes[0].stop(0.0)
    ended = json.loads((tmp_path / "ranks.json").read_text())[0]["ended"]
    assert ended.startswith("killed: still running") and f"stop at {at} steps" in ended, ended


# ---------------------------------------------------------------- ranks on hosts

def remote_rank(tmp_path: Path, stream) -> RemoteTask:
    conn = FakeHost("a")
    return RemoteTask(conn, INV.host("a"), command_tasks(1)[0], tmp_path / "a.log", stream)


def test_a_stop_request_reaches_a_rank_on_a_host_and_the_rank_gets_time_to_end_by_itself(tmp_path):
    stream = task_stream(4242, step_line(0, 1.0), step_line(1, 1.001), running=True)
    rank = remote_rank(tmp_path, stream)
    spawner = user.UserSpawner(lambda task, log, env: rank, tmp_path / "launch000", own_hostnames=False)
    started = spawner(command_tasks(1)[0], tmp_path / "launch000" / "a.log", {})
    assert started.stdout.readline() and started.stdout.readline() and spawner.last_step == 1
    at = spawner.request_stop(wait_s=5.0)
    assert stream.input == [f"stop-at {at}\n"]  # the host writes it into the rank's own control file
    assert at >= 2 + stop_margin(0.001, 0.0, STOP_DELIVERY_S)  # the margin covers the request's way there
    threading.Timer(0.3, lambda: stream.end(0)).start()  # the rank stops at `at` and `node task` exits
    began = time.monotonic()
    started.stop(0.5)
    assert 0.2 < time.monotonic() - began < 4.0  # waited for it, no longer
    assert not stream.stdin_closed  # it ended by itself: never stopped
    ranks = json.loads((tmp_path / "launch000" / "ranks.json").read_text())
    assert ranks[0]["ended"] == "exited 0"


TRACKED = """
import os, sys, time
from netbench import track
print("control", os.environ["NETBENCH_CONTROL"], file=sys.stderr, flush=True)
while not track.stop_requested():
    with track.step(images=1):
        time.sleep(0.002)
print("stopped-after", track._state.steps, flush=True)
"""


def test_node_task_gives_a_users_command_a_control_file_on_the_host_and_writes_the_stop_there(tmp_path):
    """`node task` for a rank whose NETBENCH_CONTROL names a file on the controller: the rank
    gets a file of the host's own; "stop-at N" on stdin is written there; the rank, which
    asks track.stop_requested() after each step, stops after step N by itself (exit 0)."""
    journal = Journal(tmp_path / "state")
    read, write = os.pipe()
    out = io.BytesIO()
    controller_path = "/nonexistent/controller/launch000/control"
    env = {"NETBENCH_CONTROL": controller_path, "NETBENCH_RANK": "0", "NETBENCH_WORLD_SIZE": "1",
           "PYTHONPATH": proc.child_pythonpath()}
    result: dict = {}
    stderr_r, stderr_w = os.pipe()
    saved = os.dup(2)
    os.dup2(stderr_w, 2)  # the child's stderr goes straight to `node task`'s (here: a pipe of ours)
    try:
        thread = threading.Thread(target=lambda: result.update(code=run_task(
            journal, [sys.executable, "-c", TRACKED], env, "worker0", grace=1.0,
            stdin=os.fdopen(read, "rb"), stdout=out)))
        thread.start()
        deadline = time.monotonic() + 20
        while out.getvalue().count(b'"event": "step"') < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        steps = out.getvalue().count(b'"event": "step"')
        os.write(write, f"stop-at {steps + 100}\n".encode())
        thread.join(timeout=30)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(stderr_w)
    said = os.read(stderr_r, 65536).decode()
    os.close(stderr_r)
    os.close(write)
    assert result.get("code") == 0, (result, out.getvalue()[-500:])  # it ended by itself
    assert f"stopped-after {steps + 100}" in out.getvalue().decode()
    control = said.split("control ", 1)[1].split()[0]
    assert control != controller_path and not os.path.exists(os.path.dirname(control))  # removed at the end
    assert journal.pending() == []


def test_node_task_ends_what_a_process_left_in_the_background_as_soon_as_it_exits(tmp_path):
    """A train.sh that starts a process in the background (holding the relay's pipe) and exits:
    `node task` ends the background process and returns the script's status without waiting
    for the controller to close the channel."""
    journal = Journal(tmp_path / "state")
    marker = f"{300 + os.getpid() % 1000 / 1000:.3f}"
    read, write = os.pipe()  # the channel's stdin, never closed before the task returns
    out = io.BytesIO()
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(code=run_task(
        journal, ["sh", "-c", f"sleep {marker} & echo started; exit 0"], {}, "worker0", grace=1.0,
        stdin=os.fdopen(read, "rb"), stdout=out)), daemon=True)
    began = time.monotonic()
    thread.start()
    thread.join(timeout=10)
    try:
        assert result.get("code") == 0 and time.monotonic() - began < 5.0, result
        assert b"started" in out.getvalue()
        assert running(f"sleep\0{marker}") == [] and journal.pending() == []
    finally:
        for pid in running(f"sleep\0{marker}"):
            os.kill(pid, 9)
        os.close(write)


def running(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read() and proc._alive(int(entry)):
                        found.append(int(entry))
            except OSError:
                continue
    return found


def test_ranks_json_names_the_signal_that_ended_a_rank():
    assert [user.how_it_ended(code) for code in (None, 0, 1, -6, -9, -200)] == [
        "stopped", "exited 0", "exited 1", "exited -6 (SIGABRT)", "exited -9 (SIGKILL)", "exited -200"]
