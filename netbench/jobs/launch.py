"""Start a job's processes in their namespaces, collect step events, enforce timeouts.

The controller only plans and collects; workers time their own steps and stream JSON
events on stdout. A step that does not arrive within the step timeout ends the run as
`timeout`; a process that dies ends it as `failed` with its error. Every process is
stopped with escalation (TERM, then KILL) on the way out, whatever happened.

Serving tasks (the ps strategy's workers and parameter servers) never finish by
themselves: the job is over when every other task is done, and a server that exits
before then fails the run. The step clock follows the first task that is not a server.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from netbench import proc
from netbench.jobs.cluster import Task
from netbench.journal import Journal


@dataclass(frozen=True)
class Timeouts:
    startup_s: float = 240.0  # TF import + cluster start + first (traced) step
    step_s: float = 60.0  # between consecutive step events of the chief


@dataclass(frozen=True)
class JobOutcome:
    status: str  # ok | timeout | failed | interrupted
    # every event, each with "worker" (the task's index within its role), "role", and
    # "recv" (monotonic s)
    events: tuple[dict, ...]
    error: str = ""


@dataclass
class _Live:
    task: Task
    popen: object
    done: bool = False
    error: str = ""
    entry: object = None
    log: Path | None = None


def _reader(position: int, task: Task, stream, sink: queue.Queue) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            event["worker"] = task.index
            event["role"] = task.role
            event["recv"] = time.monotonic()
            sink.put((position, event))
    sink.put((position, {"event": "_eof"}))


def _log_tail(path: Path | None, lines: int = 1) -> str:
    if path is None:
        return ""
    try:
        text = [l for l in path.read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def run_job(tasks: list[Task], log_dir: Path, journal: Journal, timeouts: Timeouts = Timeouts(),
            on_event: Callable[[dict], None] | None = None, env: dict[str, str] | None = None) -> JobOutcome:
    """Run every task to completion (or failure); always stops every process it started."""
    log_dir.mkdir(parents=True, exist_ok=True)
    sink: queue.Queue = queue.Queue()
    live: list[_Live] = []
    events: list[dict] = []
    try:
        for task in tasks:
            log = log_dir / f"{task.node}-{task.role}{task.index}.log"
            with open(log, "ab") as log_fh:
                child_env = {"TF_CONFIG": task.tf_config, "PYTHONUNBUFFERED": "1",
                             "PYTHONPATH": proc.child_pythonpath(), **(env or {})}
                popen = proc.spawn(task.argv, netns=task.netns, env=child_env, stdout=-1, stderr=log_fh)
            entry = journal.record("process", pid=popen.pid, start=proc.start_time(popen.pid),
                                   netns=task.netns, role=f"{task.role}{task.index}")
            live.append(_Live(task, popen, entry=entry, log=log))
            threading.Thread(target=_reader, args=(len(live) - 1, task, popen.stdout, sink), daemon=True).start()
        status, error = _collect(live, sink, events, timeouts, on_event)
    except KeyboardInterrupt:
        status, error = "interrupted", "interrupted by the user"
        raise
    finally:
        for item in live:
            proc.stop(item.popen, grace=3.0)
            journal.done(item.entry)
    return JobOutcome(status=status, events=tuple(events), error=error)


def _collect(live: list[_Live], sink: queue.Queue, events: list[dict], timeouts: Timeouts,
             on_event) -> tuple[str, str]:
    started = time.monotonic()
    last_step: float | None = None
    clock = next((i for i, item in enumerate(live) if not item.task.serves), 0)
    while not all(item.done for item in live if not item.task.serves):
        limit = timeouts.startup_s if last_step is None else timeouts.step_s
        since = started if last_step is None else last_step
        wait = since + limit - time.monotonic()
        if wait <= 0:
            what = "the first step" if last_step is None else "the next step"
            return "timeout", f"no {what} within {limit:g}s"
        try:
            position, event = sink.get(timeout=min(wait, 1.0))
        except queue.Empty:
            continue
        item = live[position]
        kind = event.get("event")
        if kind == "_eof":
            code = item.popen.wait()
            if not item.done:
                reason = item.error or _log_tail(item.log) or "no output"
                return "failed", f"{item.task.node} {item.task.role}{item.task.index} exited with {code}: {reason}"
            continue
        events.append(event)
        if on_event:
            on_event(event)
        if kind == "step" and position == clock:
            last_step = time.monotonic()
        elif kind == "done":
            item.done = True
        elif kind == "error":
            item.error = f"{event.get('type', 'Error')}: {event.get('message', '')}"
            return "failed", f"{item.task.node} {item.task.role}{item.task.index}: {item.error}"
    return "ok", ""
