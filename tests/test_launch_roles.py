"""netbench.jobs.launch with several roles: serving tasks, the step clock, stopping servers.

Stand-in processes (small Python scripts, no TensorFlow, no namespace) play the roles.
"""

from __future__ import annotations

import os
import sys
import time

from netbench.jobs.cluster import Task
from netbench.jobs.launch import LocalSpawner, Timeouts, run_job
from netbench.journal import Journal

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
    starts = [e for e in outcome.events if e["event"] == "start"]
    assert sorted((e["role"], e["worker"]) for e in starts) == [
        ("coordinator", 0), ("ps", 0), ("worker", 0), ("worker", 1)]
    steps = [e for e in outcome.events if e["event"] == "step"]
    assert [(e["role"], e["step"]) for e in steps] == [("coordinator", 0), ("coordinator", 1), ("coordinator", 2)]
    for event in starts:
        if "pid" in event:
            assert not alive(event["pid"]), event
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
