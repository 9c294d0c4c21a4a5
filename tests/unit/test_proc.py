"""netbench.proc: starting and identifying processes (no root: no namespace is entered)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from netbench import proc
from netbench.errors import NetbenchError


@pytest.fixture
def popen_calls(monkeypatch):
    """Every subprocess.Popen call's keyword arguments."""
    calls = []
    real = subprocess.Popen

    class Recording(real):
        def __init__(self, args, **kwargs):
            calls.append(kwargs)
            super().__init__(args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", Recording)
    return calls


def test_no_code_runs_between_fork_and_exec(popen_calls):
    """A preexec_fn runs Python in the forked child of a controller with threads (metrics,
    leases, log readers), where a lock another thread held stays locked forever."""
    proc.run(["true"])
    proc.spawn(["true"]).wait()
    proc.spawn(["true"], die_with_parent=False).wait()
    assert len(popen_calls) == 3
    assert all(kwargs.get("preexec_fn") is None for kwargs in popen_calls)


def test_the_pid_is_the_commands_own():
    """The journal records the pid spawn returns: it must be the command's, not a wrapper's."""
    child = proc.spawn(["sh", "-c", "echo $$"], stdout=subprocess.PIPE)
    out, _ = child.communicate(timeout=30)
    assert int(out) == child.pid


def test_child_argv_wraps_only_what_is_asked():
    assert proc.child_argv(["ping", "x"], None, False) == ["ping", "x"]
    assert proc.child_argv(["ping"], "netbench-n1", False) == ["nsenter", "--net=/run/netns/netbench-n1", "--", "ping"]
    tied = proc.child_argv(["ping"], "netbench-n1", True, parent_pid=42)
    assert tied[:4] == ["setpriv", "--pdeathsig", "KILL", "--"]
    assert tied[4:8] == ["sh", "-c", proc._PARENT_CHECK, "netbench-child"] and tied[8] == "42"
    assert tied[9:] == ["nsenter", "--net=/run/netns/netbench-n1", "--", "ping"]


def test_a_child_whose_parent_is_already_gone_stops_itself():
    """The parent's death before setpriv set the death signal sends none: the child must see it."""
    result = subprocess.run(proc.child_argv(["echo", "ran"], None, True, parent_pid=1 << 30),
                            capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stdout) == (1, "")
    result = subprocess.run(proc.child_argv(["echo", "ran"], None, True), capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stdout) == (0, "ran\n")


def test_a_missing_program_or_namespace_is_a_clear_error():
    with pytest.raises(NetbenchError, match="no-such-program-nb is not installed"):
        proc.run(["no-such-program-nb"])
    with pytest.raises(NetbenchError, match="cannot start no-such-program-nb: No such file"):
        proc.spawn(["no-such-program-nb"])
    with pytest.raises(NetbenchError, match="namespace nb-no-such-ns does not exist"):
        proc.run(["true"], netns="nb-no-such-ns")
    with pytest.raises(NetbenchError, match="namespace nb-no-such-ns does not exist"):
        proc.spawn(["true"], netns="nb-no-such-ns")


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        if proc.start_time(pid) is None or not proc._alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("die_with_parent", [True, False])
def test_a_child_dies_with_a_killed_controller_only_when_asked(die_with_parent):
    controller = (
        "import os, signal, sys\n"
        "from netbench import proc\n"
        f"child = proc.spawn(['sleep', '120'], die_with_parent={die_with_parent}, stdout=-3, stderr=-3)\n"
        "print(child.pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    result = subprocess.run([sys.executable, "-c", controller], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": proc.child_pythonpath()})
    pid = int(result.stdout)
    try:
        if die_with_parent:
            assert _gone(pid)
        else:  # a daemon (an engine of `netbench apply`) outlives the command that started it
            assert proc.start_time(pid) is not None
    finally:
        if proc.start_time(pid) is not None:
            os.kill(pid, signal.SIGKILL)


def test_a_child_started_from_a_thread_outlives_the_thread():
    """PR_SET_PDEATHSIG fires when the thread that forked the child exits: a child asked for by
    a short-lived thread (a schedule's) must still live once that thread has returned."""
    import threading

    box = {}
    thread = threading.Thread(target=lambda: box.update(child=proc.spawn(["sleep", "30"])), name="short-lived")
    thread.start()
    thread.join()
    child = box["child"]
    try:
        time.sleep(0.5)  # the signal, had it been sent, has arrived by now
        assert child.poll() is None, f"the child died with its thread: {child.returncode}"
    finally:
        proc.stop(child, grace=1.0)
    assert child.poll() is not None


def test_the_lasting_thread_hands_back_results_and_exceptions():
    import threading

    seen = {}

    def work():
        seen["thread"] = threading.current_thread().name
        return 7

    def fail():
        raise ValueError("no")

    assert proc._LASTING.call(work) == 7 and seen["thread"] == threading.current_thread().name  # main: inline
    out = {}

    def from_thread():
        out["value"] = proc._LASTING.call(work)
        try:
            proc._LASTING.call(fail)
        except ValueError as exc:
            out["error"] = str(exc)

    thread = threading.Thread(target=from_thread)
    thread.start()
    thread.join()
    assert out == {"value": 7, "error": "no"} and seen["thread"] == "netbench-spawner"


def test_realtime_runs_the_block_at_sched_fifo_and_puts_the_thread_back(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "sched_getscheduler", lambda pid: os.SCHED_OTHER)
    monkeypatch.setattr(os, "sched_getparam", lambda pid: os.sched_param(0))
    monkeypatch.setattr(os, "sched_setscheduler", lambda pid, policy, param: calls.append((pid, policy,
                                                                                          param.sched_priority)))
    with proc.realtime(5) as changed:
        assert changed is True
        # the calling thread only; children forked meanwhile start with normal scheduling
        assert calls == [(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, 5)]
    assert calls[-1] == (0, os.SCHED_OTHER, 0)


def test_realtime_refused_changes_nothing_and_says_so(monkeypatch):
    def refuse(pid, policy, param):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    with proc.realtime(5) as changed:
        assert changed is False


def test_is_running_tells_a_live_process_from_a_zombie_and_from_one_that_reused_its_pid():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    started = proc.start_time(child.pid)
    assert proc.is_running(child.pid, started) is True
    assert proc.is_running(child.pid, started + 1) is False  # another process under that pid
    assert proc.is_running(child.pid, None) is False  # no start time recorded: cannot tell
    deadline = time.monotonic() + 10
    while proc.is_running(child.pid, started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.start_time(child.pid) == started  # exited, not reaped: a zombie is not running
    assert proc.is_running(child.pid, started) is False
    child.wait()
    assert proc.is_running(child.pid, started) is False


def _pids_of(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return [pid for pid in pids if proc._alive(pid)]


def test_stopping_a_group_whose_leader_exited_ends_what_it_left_in_the_background():
    """A user's train.sh that starts a process in the background and exits: the group is
    signalled all the same (TERM first: the sleep ends by it), and nothing is left running."""
    marker = f"{300 + os.getpid() % 1000 / 1000:.3f}"  # a sleep of this test's own, told apart from others'
    child = proc.spawn(["sh", "-c", f"sleep {marker} & exit 0"], stdout=-3, stderr=-3)
    try:
        assert child.wait(timeout=10) == 0
        deadline = time.monotonic() + 5
        while not _pids_of(f"sleep\0{marker}") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(_pids_of(f"sleep\0{marker}")) == 1  # left behind, in the leader's group
        began = time.monotonic()
        assert proc.stop_group(child, grace=5.0) == 0
        assert time.monotonic() - began < 4.0  # TERM ended it: no wait for the grace, no KILL needed
        assert _pids_of(f"sleep\0{marker}") == [] and proc.group_members(child.pid) == []
    finally:
        for pid in _pids_of(f"sleep\0{marker}"):
            os.kill(pid, signal.SIGKILL)


def test_stopping_a_running_group_escalates_to_kill_for_a_member_that_ignores_term():
    child = proc.spawn(["sh", "-c", "trap '' TERM; sleep 30 & wait"], stdout=-3, stderr=-3)
    time.sleep(0.3)
    began = time.monotonic()
    code = proc.stop_group(child, grace=0.5)
    assert code is not None and time.monotonic() - began < 6.0
    assert proc.group_members(child.pid) == []
