"""Start a job's processes in their namespaces, collect step events, enforce timeouts.

The controller only plans and collects; workers time their own steps and stream JSON
events on stdout. A step that does not arrive within the step timeout ends the run as
`timeout`; a process that dies ends it as `failed` with its error. Every process is
stopped with escalation (TERM, then KILL) on the way out, whatever happened.

Serving tasks (the ps strategy's workers and parameter servers) never finish by
themselves: the job is over when every other task is done, and a server that exits
before then fails the run. The step clock follows the first task that is not a server.

Each stdout line is parsed once, here, into a typed event (netbench.jobs.events) that
carries the task's index within its role, its role, and when it arrived; everything
downstream reads attributes. Lines that are not events (stray output) are skipped, as are
lines that look like JSON but do not parse; an event of an unknown schema version is an
error of its task.

Where a task runs is the spawner's business (`Spawner`): `LocalSpawner` starts it in a
testbed namespace on this machine; netbench.testbed.hosts starts it on an SSH host. Each
returns a `TaskProcess`, something popen-like: a stdout line stream, wait() and stop().
"""

from __future__ import annotations

import queue
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Protocol

from netbench import interrupts, proc
from netbench.errors import JobError
from netbench.jobs import events as ev
from netbench.jobs import exchange
from netbench.model.job import Task
from netbench.state.journal import Journal


ERROR_SETTLE_S = 2.0  # how long a reported error waits for a peer's exit, the likelier root cause
LOG_CAP_BYTES = 16 * 2**20  # a task's log file is rotated at this size (see TaskLog)
TAIL_BYTES = 64 * 1024  # log_tail reads no more than this from the end of a log
ROTATED_MARK = "[netbench] "  # starts the line a rotated log begins with


@dataclass(frozen=True)
class Timeouts:
    startup_s: float = 240.0  # TF import + cluster start + first (traced) step
    step_s: float = 60.0  # between consecutive step events of the chief


@dataclass(frozen=True)
class JobOutcome:
    status: str  # ok | timeout | failed | interrupted
    # every event, each with its task's index within its role (worker), role, and the
    # monotonic time it arrived (recv); ev.to_record gives each its run record's JSON
    events: tuple[ev.Event, ...]
    error: str = ""


class TaskLost(JobError):
    """A task could not be started, or its node went away (a remote host dropped out): the
    run ends as `failed` with this message, and the sweep goes on."""


class TaskProcess(Protocol):
    """A started task: its stdout as a stream of byte lines, its exit, and how to stop it."""

    stdout: IO[bytes]

    def wait(self) -> int: ...
    def stop(self, grace: float) -> None: ...  # TERM, `grace` s, then KILL; idempotent
    def failure(self, code: int) -> str | None: ...  # why it ended, when the spawner knows better than its log


Spawner = Callable[[Task, Path, dict], TaskProcess]  # (task, stderr log file, extra env) -> started task


class TaskLog:
    """A task's stderr log, bounded on disk: when a write would take it past `cap` bytes, the
    file becomes `<name>.1` (replacing an older one) and a new file starts with a line saying
    so. A long run's chatty task (TensorFlow warns on stderr) keeps about 2 x cap bytes."""

    def __init__(self, path: Path, cap: int | None = None) -> None:
        self.path, self.cap = path, cap or LOG_CAP_BYTES
        self._fh = open(path, "ab")
        self._size = self._fh.tell()

    def write(self, chunk: bytes) -> None:
        if self._size and self._size + len(chunk) > self.cap:
            self._fh.close()
            rotated = self.path.with_name(self.path.name + ".1")
            self.path.replace(rotated)
            self._fh = open(self.path, "wb")
            self._size = self._fh.write(f"{ROTATED_MARK}log rotated at {self.cap} bytes; "
                                        f"the part before is in {rotated.name}\n".encode())
        self._size += self._fh.write(chunk)
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def copy_to_log(stream, path: Path) -> None:
    """Copy a task's stderr `stream` into its TaskLog until the stream ends."""
    # read1 returns what is there without waiting for more; an SSH channel's read(n) waits
    # for n bytes, so small reads keep a remote task's log current
    read1 = getattr(stream, "read1", None)
    log: TaskLog | None = None
    try:
        log = TaskLog(path)
    except OSError:
        pass  # nowhere to write: the stream is drained all the same, or the task blocks on a full pipe
    try:
        for chunk in iter((lambda: read1(65536)) if read1 else (lambda: stream.read(4096)), b""):
            if log is not None:
                try:
                    log.write(chunk)
                except OSError:  # a full disk: stop logging, keep draining
                    log = None
    finally:
        if log is not None:
            log.close()


class LocalProcess:
    """A task in a testbed namespace on this machine, journaled while it runs; its stderr is
    copied into its TaskLog."""

    def __init__(self, popen, journal: Journal, entry, log: Path | None = None) -> None:
        self.popen, self.journal, self.entry = popen, journal, entry
        self.stdout = popen.stdout
        self._log_thread = None
        if log is not None and popen.stderr is not None:
            self._log_thread = threading.Thread(target=copy_to_log, args=(popen.stderr, log), daemon=True)
            self._log_thread.start()

    def _log_written(self) -> None:
        if self._log_thread is not None:
            self._log_thread.join(timeout=2.0)  # its last stderr lines are the cause a failed run shows

    def wait(self) -> int:
        code = self.popen.wait()
        self._log_written()
        return code

    def stop(self, grace: float) -> None:
        proc.stop(self.popen, grace=grace)
        self._log_written()
        if self.entry is not None:
            self.journal.done(self.entry)
            self.entry = None

    def failure(self, code: int) -> str | None:
        return None


class LocalSpawner:
    """Start tasks in their namespaces (Task.netns) with this netbench on PYTHONPATH."""

    def __init__(self, journal: Journal, run_as=None) -> None:
        self.journal = journal
        # a sweep's per-node capacity (testbed/compute.py): node -> the cgroup.procs file its
        # processes start in, and node -> its extra environment (the step-delay file)
        self.cgroups: dict[str, str] = {}
        self.node_env: dict[str, dict[str, str]] = {}
        self.run_as = run_as  # testbed/run_as.RunAs: the user job processes run as (None: this one)

    def __call__(self, task: Task, log: Path, env: dict, drops_itself: bool = False) -> LocalProcess:
        """Start `task`; `drops_itself`: its argv changes to the run-as user by itself, after a
        wrapper of its own that needs root (a user's command's node setup, jobs/user.py)."""
        child_env = {**dict(task.env), "TF_CONFIG": task.tf_config, "PYTHONUNBUFFERED": "1",
                     "PYTHONPATH": proc.child_pythonpath(), **self.node_env.get(task.node, {}), **env}
        if drops_itself and self.run_as is not None:
            child_env.update(self.run_as.env())
        popen = proc.spawn(task.argv, netns=task.netns, env=child_env, stdout=-1, stderr=-1,
                           cgroup=self.cgroups.get(task.node), run_as=None if drops_itself else self.run_as)
        entry = self.journal.record("process", pid=popen.pid, start=proc.start_time(popen.pid),
                                    netns=task.netns, role=f"{task.role}{task.index}")
        return LocalProcess(popen, self.journal, entry, log)


@dataclass
class _Live:
    task: Task
    popen: TaskProcess
    done: bool = False
    error: str = ""
    log: Path | None = None


_EOF = None  # what a reader puts in the sink when its task's stdout ends


def _reader(position: int, task: Task, stream, sink: queue.SimpleQueue) -> None:
    for raw in iter(stream.readline, b""):
        event = ev.parse_line(raw)
        if event is None or (isinstance(event, ev.Error) and event.type == ev.MALFORMED):
            continue  # stray output, or a line that only looks like an event
        sink.put((position, ev.received(event, sender(event, task), task.role, time.monotonic())))
    sink.put((position, _EOF))


def sender(event: ev.Event, task: Task) -> int:
    """The rank that sent `event`: the task's index, or for a user's command started once per
    node (torchrun starting the node's ranks) the rank its event names (netbench.track's start
    event's task_index, its steps' "rank")."""
    if not task.command or task.local_rank or not isinstance(event, (ev.Start, ev.Step)):
        return task.index
    said = event.task_index if isinstance(event, ev.Start) else dict(event.extra).get("rank")
    return said if isinstance(said, int) and not isinstance(said, bool) and said >= 0 else task.index


def log_tail(path: Path | None, lines: int = 1) -> str:
    """The last non-blank `lines` of a task's log, stripped and joined with ' | ' ('' if none);
    reads at most TAIL_BYTES from its end."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - TAIL_BYTES))
            data = fh.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace").splitlines()
    if size > TAIL_BYTES:
        text = text[1:]  # the first line read is likely cut
    text = [l.strip() for l in text if l.strip() and not l.startswith(ROTATED_MARK)]
    return " | ".join(text[-lines:])


def exchange_env(timeouts: Timeouts | None = None) -> dict[str, str]:
    """What every process of one start of a job gets for the exchange protocol: a fresh random
    token (a listener takes connections only from the job's own roles: their hello carries it)
    and the controller's step timeout (the exchange names a vanished peer before it ends)."""
    env = {exchange.TOKEN_ENV: secrets.token_hex(16)}
    if timeouts is not None:
        env[exchange.TIMEOUT_ENV] = f"{timeouts.step_s:g}"
    return env


def run_job(tasks: list[Task], log_dir: Path, spawn: Spawner, timeouts: Timeouts = Timeouts(),
            on_event: Callable[[ev.Event], None] | None = None, env: dict[str, str] | None = None) -> JobOutcome:
    """Run every task to completion (or failure); always stops every process it started.
    `spawn` starts each task where it runs (LocalSpawner: this machine's namespaces)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    sink: queue.SimpleQueue = queue.SimpleQueue()  # C: put/get cost less
    live: list[_Live] = []
    events: list[ev.Event] = []
    env = {**exchange_env(timeouts), **(env or {})}
    try:
        try:
            for task in tasks:
                log = log_dir / f"{task.node}-{task.role}{task.index}.log"
                # a signal while a process starts is taken once it is in `live`: never between
                # its start and the list that `finally` stops (it would be left running)
                with interrupts.held_off():
                    popen = spawn(task, log, dict(env or {}))
                    live.append(_Live(task, popen, log=log))
                threading.Thread(target=_reader, args=(len(live) - 1, task, popen.stdout, sink), daemon=True).start()
        except TaskLost as exc:
            return JobOutcome(status="failed", events=(), error=exc.message)
        status, error = _collect(live, sink, events, timeouts, on_event)
    except KeyboardInterrupt:
        status, error = "interrupted", "interrupted by the user"
        raise
    finally:
        with interrupts.held_off():  # a second signal must not leave processes running
            for item in live:
                item.popen.stop(3.0)
    return JobOutcome(status=status, events=tuple(events), error=error)


def _collect(live: list[_Live], sink: queue.SimpleQueue, events: list[ev.Event], timeouts: Timeouts,
             on_event) -> tuple[str, str]:
    started = time.monotonic()
    last_step: float | None = None
    clock = next((i for i, item in enumerate(live) if not item.task.serves), 0)
    # a process's reported error waits ERROR_SETTLE_S for the root cause: when a peer dies
    # (or its host drops out) the survivors report collective errors at about the same time
    reported: tuple[float, str] | None = None
    while not all(item.done for item in live if not item.task.serves):
        now = time.monotonic()
        if reported is not None and now >= reported[0] + ERROR_SETTLE_S:
            return "failed", reported[1]
        limit = timeouts.startup_s if last_step is None else timeouts.step_s
        since = started if last_step is None else last_step
        wait = since + limit - now
        if wait <= 0:
            what = "first step" if last_step is None else "next step"
            return "timeout", f"no {what} within {limit:g}s"
        if reported is not None:
            wait = min(wait, reported[0] + ERROR_SETTLE_S - now)
        try:
            position, event = sink.get(timeout=max(0.01, min(wait, 1.0)))
        except queue.Empty:
            continue
        item = live[position]
        if event is _EOF:
            code = item.popen.wait()
            lost = item.popen.failure(code)
            if lost:
                return "failed", lost
            if item.error and reported is not None:
                continue  # it exited after reporting its error: wait for a root cause a while longer
            if not item.done:
                reason = item.error or log_tail(item.log) or "no output"
                return "failed", f"{item.task.node} {item.task.role}{item.task.index} exited with {code}: {reason}"
            continue
        events.append(event)
        if on_event:
            on_event(event)
        if isinstance(event, ev.Step) and position == clock:
            last_step = time.monotonic()
        elif isinstance(event, ev.Done):
            item.done = True
        elif isinstance(event, ev.Error):
            item.error = f"{event.type}: {event.message}"
            if reported is None:
                reported = (time.monotonic(), f"{item.task.node} {item.task.role}{item.task.index}: {item.error}")
    if reported is not None:
        return "failed", reported[1]
    return "ok", ""
