"""A job's processes started once and kept running while the controller reads their events.

`run_job` (netbench.jobs.launch) runs a job to its end. A sweep's launch instead starts the
workers with ``--until-stopped`` and moves them through many network points; `LiveJob` is
that: it starts every task through a Spawner, reads their stdout lines into typed events
(each with its task's index, role and arrival time, as run_job's are) and hands them out one
at a time. No process is meant to end by itself: one that does, or that reports an error,
breaks the job (`JobBroken`, with the likeliest cause). `stop` ends every process (TERM,
then KILL), whatever happened; an ended job is no failure of its points.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

from netbench import interrupts
from netbench.errors import JobError
from netbench.jobs import events as ev
from netbench.jobs.launch import ERROR_SETTLE_S, Spawner, _EOF, _Live, _reader, exchange_env, log_tail
from netbench.model.job import Task


class JobBroken(JobError):
    """A process of a live job ended or reported an error: the point it was serving fails."""


class LiveJob:
    """Every task of a job, started now; `read` gives their events as they arrive."""

    def __init__(self, tasks: list[Task], log_dir: Path, spawn: Spawner, env: dict[str, str] | None = None) -> None:
        """Start every task (a TaskLost from the spawner stops those started and propagates)."""
        log_dir.mkdir(parents=True, exist_ok=True)
        self._sink: queue.SimpleQueue = queue.SimpleQueue()  # C: put/get cost less
        self._live: list[_Live] = []
        self._reported: tuple[float, str] | None = None
        self.stopped = False
        self.broken: str | None = None  # once broken, every later read raises again
        # the step clock: the first task that is not a server (the chief, or ps's coordinator)
        self.clock = next((i for i, task in enumerate(tasks) if not task.serves), 0)
        env = {**exchange_env(), **(env or {})}  # the launch's own token (and the caller's timeout)
        try:
            for task in tasks:
                log = log_dir / f"{task.node}-{task.role}{task.index}.log"
                popen = spawn(task, log, dict(env))
                self._live.append(_Live(task, popen, log=log))
                threading.Thread(target=_reader, args=(len(self._live) - 1, task, popen.stdout, self._sink),
                                 daemon=True).start()
        except BaseException:
            self.stop()
            raise

    @property
    def clock_task(self) -> Task:
        return self._live[self.clock].task

    def steppers(self) -> list[tuple[str, int]]:
        """(role, index) of every task that streams step events (not the servers)."""
        return [(item.task.role, item.task.index) for item in self._live if not item.task.serves]

    def read(self, timeout: float) -> ev.Event | None:
        """The next event, or None when none came within `timeout` seconds.

        Raises JobBroken when a process ended or reported an error (a reported error waits
        ERROR_SETTLE_S for a peer's exit, the likelier root cause)."""
        if self.broken is not None:
            raise JobBroken(self.broken)
        try:
            return self._read(timeout)
        except JobBroken as exc:
            self.broken = exc.message
            raise

    def _read(self, timeout: float) -> ev.Event | None:
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            now = time.monotonic()
            if self._reported is not None and now >= self._reported[0] + ERROR_SETTLE_S:
                raise JobBroken(self._reported[1])
            wait = deadline - now
            if self._reported is not None:
                wait = min(wait, self._reported[0] + ERROR_SETTLE_S - now)
            if wait <= 0 and self._reported is None:
                return None
            try:
                position, event = self._sink.get(timeout=max(0.01, wait))
            except queue.Empty:
                if self._reported is None and time.monotonic() >= deadline:
                    return None
                continue
            item = self._live[position]
            if event is _EOF:
                self._ended(item)
                continue
            if isinstance(event, ev.Error):
                item.error = f"{event.type}: {event.message}"
                if self._reported is None:
                    self._reported = (time.monotonic(),
                                      f"{item.task.node} {item.task.role}{item.task.index}: {item.error}")
            return event

    def _ended(self, item: _Live) -> None:
        code = item.popen.wait()
        lost = item.popen.failure(code)
        if lost:
            raise JobBroken(lost)
        if item.error and self._reported is not None:
            return  # it exited after reporting its error: wait a while longer for a root cause
        reason = item.error or log_tail(item.log) or "no output"
        raise JobBroken(f"{item.task.node} {item.task.role}{item.task.index} exited with {code}: {reason}")

    def stop(self, grace: float = 3.0) -> None:
        """Stop every process (TERM, `grace` s, KILL); idempotent; no second signal interrupts it."""
        with interrupts.held_off():
            for item in self._live:
                item.popen.stop(grace)
        self.stopped = True
