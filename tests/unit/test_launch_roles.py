"""netbench.jobs.launch with several roles: serving tasks, the step clock, stopping servers.

Stand-in processes (small Python scripts, no TensorFlow, no namespace) play the roles.
"""

from __future__ import annotations

import os
import sys
import time

from netbench.model.job import Task
from netbench.jobs.launch import LocalSpawner, Timeouts, run_job
from netbench.state.journal import Journal

SERVER = ("import json, os, time; print(json.dumps({'event': 'start', 'pid': os.getpid()}), flush=True); "
          "time.sleep({life})")
REPORTER = ("import json, time\n"
            "print(json.dumps({{'event': 'start'}}), flush=True)\n"
            "for k in range({steps}):\n"
            "    time.sleep({pause})\n"
            "    print(json.dumps({{'event': 'step', 'step': k, 'phase': 'measured', 'duration': {pause}}}), flush=True)\n"
            "print(json.dumps({{'event': 'done', 'steps': {steps}}}), flush=True)\n")


def task(role: str, index: int, code: str, serves: bool) -> Task:
    return Task(role=role, index=index, node=f"n{index + 1}", netns=None, address="127.0.0.1", port=0,
                argv=(sys.executable, "-c", code), tf_config="", serves=serves)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def server(role: str, index: int, life: float = 600) -> Task:
    return task(role, index, SERVER.replace("{life}", str(life)), serves=True)


def test_job_ends_when_the_reporter_is_done_and_servers_are_stopped(tmp_path):
    tasks = [server("worker", 0), server("worker", 1), server("ps", 0),
             task("coordinator", 0, REPORTER.format(steps=3, pause=0.05), serves=False)]
    started = time.monotonic()
    outcome = run_job(tasks, tmp_path / "logs", LocalSpawner(Journal(tmp_path / "state")), Timeouts(startup_s=60, step_s=30))
    assert outcome.status == "ok", outcome.error
    assert time.monotonic() - started < 30  # did not wait for the servers' 600 s
    starts = [e for e in outcome.events if e.kind == "start"]
    assert sorted((e.role, e.worker) for e in starts) == [
        ("coordinator", 0), ("ps", 0), ("worker", 0), ("worker", 1)]
    steps = [e for e in outcome.events if e.kind == "step"]
    assert [(e.role, e.step) for e in steps] == [("coordinator", 0), ("coordinator", 1), ("coordinator", 2)]
    assert sum(1 for e in starts if e.pid) == 3  # every server said who it is
    for event in starts:
        if event.pid:
            assert not alive(event.pid), event
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [
        "n1-coordinator0.log", "n1-ps0.log", "n1-worker0.log", "n2-worker1.log"]


def test_a_server_that_exits_fails_the_run(tmp_path):
    tasks = [server("worker", 0, life=0.5), task("coordinator", 0, REPORTER.format(steps=50, pause=0.2), False)]
    outcome = run_job(tasks, tmp_path / "logs", LocalSpawner(Journal(tmp_path / "state")), Timeouts(startup_s=60, step_s=30))
    assert outcome.status == "failed"
    assert "worker0 exited with 0" in outcome.error


def test_the_step_clock_follows_the_reporter_not_the_servers(tmp_path):
    # the reporter's steps are 2 s apart, longer than the 1 s step timeout
    tasks = [server("worker", 0), task("coordinator", 0, REPORTER.format(steps=3, pause=2.0), False)]
    outcome = run_job(tasks, tmp_path / "logs", LocalSpawner(Journal(tmp_path / "state")), Timeouts(startup_s=60, step_s=1))
    assert outcome.status == "timeout" and "next step within 1s" in outcome.error


CHATTY = ("import sys\n"
          "for k in range(20000):\n"
          "    sys.stderr.write(f'W0000 warning number {k} from a chatty library\\n')\n"
          "sys.stderr.write('RuntimeError: the real cause\\n')\n"
          "sys.exit(3)\n")


def test_a_chatty_tasks_log_is_rotated_at_its_cap_and_still_names_the_cause(tmp_path, monkeypatch):
    from netbench.jobs import launch

    monkeypatch.setattr(launch, "LOG_CAP_BYTES", 64 * 1024, raising=False)
    outcome = run_job([task("worker", 0, CHATTY, serves=False)], tmp_path / "logs",
                      LocalSpawner(Journal(tmp_path / "state")), Timeouts(startup_s=60, step_s=30))
    assert outcome.status == "failed"
    assert outcome.error == "n1 worker0 exited with 3: RuntimeError: the real cause"
    log = tmp_path / "logs" / "n1-worker0.log"
    rotated = log.with_name(log.name + ".1")
    # ~1 MB written: the log and its previous part stay near the cap
    assert log.stat().st_size <= 2 * 64 * 1024 and rotated.stat().st_size <= 2 * 64 * 1024
    assert log.read_text().startswith(launch.ROTATED_MARK + "log rotated at 65536 bytes; the part before is in "
                                      "n1-worker0.log.1\n")
    assert sorted(p.name for p in log.parent.iterdir()) == ["n1-worker0.log", "n1-worker0.log.1"]


def test_log_tail_reads_only_the_end_of_a_long_log(tmp_path):
    from netbench.jobs.launch import log_tail
    from tests.unit.test_journal import bytes_read

    log = tmp_path / "big.log"
    log.write_bytes(b"noise " * 1_000_000 + b"\nValueError: last words\n\n")
    before = bytes_read()
    assert log_tail(log) == "ValueError: last words"
    assert bytes_read() - before < 1_000_000  # before: the whole 6 MB


def test_a_log_that_cannot_be_written_does_not_block_the_task(tmp_path):
    """The stderr pipe is drained even when there is nowhere to write it."""
    from netbench.jobs import launch

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "n1-worker0.log").mkdir()  # the log file cannot be opened
    code = CHATTY.replace("sys.exit(3)", "print('{\"event\": \"done\", \"steps\": 0}', flush=True)")
    outcome = run_job([task("worker", 0, code, serves=False)], tmp_path / "logs",
                      LocalSpawner(Journal(tmp_path / "state")), Timeouts(startup_s=60, step_s=30))
    assert outcome.status == "ok", outcome.error
    assert launch.log_tail(tmp_path / "logs" / "n1-worker0.log") == ""


def test_a_stream_without_read1_is_copied_in_small_reads(tmp_path):
    """An SSH channel's stderr (paramiko) has only read(n), which waits for n bytes."""
    from netbench.jobs.launch import copy_to_log

    class Channel:
        def __init__(self):
            self.chunks, self.asked = [b"Traceback\n", b"RuntimeError: boom\n"], []

        def read(self, size):
            self.asked.append(size)
            return self.chunks.pop(0) if self.chunks else b""

    channel = Channel()
    copy_to_log(channel, tmp_path / "h2-worker1.log")
    assert (tmp_path / "h2-worker1.log").read_bytes() == b"Traceback\nRuntimeError: boom\n"
    assert set(channel.asked) == {4096}


def test_each_line_is_parsed_once_into_typed_events_and_stray_lines_are_skipped(tmp_path):
    from netbench.jobs import events as ev

    code = ("import json\n"
            "print('tensorflow says hello', flush=True)\n"
            "print('{\"event\": \"step\", \"step\"', flush=True)\n"  # looks like an event, is not one
            "print(json.dumps({'event': 'step', 'step': 0, 'phase': 'measured', 'duration': 0.5}), flush=True)\n"
            "print(json.dumps({'event': 'done', 'time': 1.0, 'steps': 1}), flush=True)\n")
    outcome = run_job([task("worker", 0, code, serves=False)], tmp_path / "logs",
                      LocalSpawner(Journal(tmp_path / "state")), Timeouts(startup_s=60, step_s=30))
    assert outcome.status == "ok", outcome.error
    step, done = outcome.events
    assert isinstance(step, ev.Step) and (step.worker, step.role, step.duration) == (0, "worker", 0.5)
    assert isinstance(done, ev.Done) and done.recv >= step.recv > 0


def test_an_event_of_an_unknown_schema_version_fails_its_task(tmp_path):
    code = ("import json, time\n"
            "print(json.dumps({'v': 9, 'event': 'step', 'step': 0}), flush=True)\n"
            "time.sleep(30)\n")
    outcome = run_job([task("worker", 0, code, serves=False)], tmp_path / "logs",
                      LocalSpawner(Journal(tmp_path / "state")), Timeouts(startup_s=60, step_s=30))
    assert outcome.status == "failed"
    assert "n1 worker0: UnsupportedEventVersion: event schema version 9" in outcome.error
