"""A user's own command as a launch's processes: how each rank starts, is read and stops.

`UserSpawner` wraps a target's spawner (jobs/launch.py `Spawner`) for the tasks of a user's
command (model/command_job.py):

* on the embedded testbed each rank runs in a UTS and mount namespace of its own, with its
  node's hostname and an /etc/hosts (written beside the logs) in which that name resolves
  to the node's address: what gloo, torchrun and TensorFlow advertise to their peers;
* on this machine a rank's PATH starts with the folder of netbench's own Python, so the
  command's ``python`` is the one netbench runs under (its virtualenv's), as if activated;
* every rank gets NETBENCH_CONTROL, the file `request_stop` writes the step count at which
  netbench.track's stop_requested() turns true on every rank: far enough past the last step
  heard that no rank has reached it when the request arrives (jobs/stop_margin.py: from the
  step time measured on the ranks and how late the controller hears them); a rank on a host
  gets it through its `node task` (a control file of its own there: remote/agent.py);
* with a step regex, rank 0's output lines become step events (`RegexSteps`), so the
  launch reads them as it reads the track module's or netbench's own workers';
* a rank is its process group (a launcher's children included): stopping it asks the job
  to stop where it checks, waits a while, then ends the whole group (TERM, then KILL),
  whether the rank's own process still runs or not (what it left in the background).

The ranks' command lines and environments are written to ``ranks.json`` in the launch's log
folder, so the record says which ports and addresses the job was given.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Iterable

from netbench import proc
from netbench.jobs import events as ev
from netbench.jobs.line_match import GIVEN_UP, LineMatcher
from netbench.jobs.stop_margin import StepPace, stop_margin
from netbench.model.job import Task

STOP_WAIT_S = 15.0  # how long a job that checks stop_requested() gets to end by itself
CONTROL_FILE = "control"
RANKS_FILE = "ranks.json"
STOP_CHECKED = "stop-checked"  # the track module's event: this job asks stop_requested()
GIVEN_UP_EVENT = "step-regex-given-up"  # a line --step-regex took too long over: no step, counted

# run by sh inside the rank's own UTS and mount namespaces (unshare): the node's hostname,
# its hosts file over /etc/hosts, then the command itself (exec: the pid stays the rank's)
_NODE_SETUP = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'


def node_argv(argv: tuple[str, ...], hostname: str, hosts_file: Path) -> tuple[str, ...]:
    """`argv` behind the wrapper that gives it its node's hostname and /etc/hosts."""
    return ("unshare", "--uts", "--mount", "--", "sh", "-c", _NODE_SETUP, "netbench-node",
            hostname, str(hosts_file), *argv)


def checks_stop(events: Iterable[ev.Event]) -> bool:
    """Whether the job asked stop_requested() (the track module says so once, on its first ask)."""
    return any(isinstance(e, ev.Other) and e.name == STOP_CHECKED for e in events)


class RegexSteps:
    """A rank's stdout with every line that matches `pattern` turned into a step event line
    (other lines pass through: the reader skips what is not an event). Named groups:
    ``step`` (its number; else the lines are counted), ``seconds`` or ``ms`` (its duration;
    else the time since the last matching line, so the first match only starts the clock).

    The pattern sees the last 4 KiB of a line and runs in a process of its own
    (jobs/line_match.py): a thread of this reader's own reads the rank's lines, notes when
    each came and streams them to the matcher, and `readline` hands back each line's answer
    in order, so no line waits a round trip behind the one before it, and a pattern that
    backtracks on a long progress-bar line never freezes the controller's threads. A line
    whose match takes longer than half a second is given up: it becomes a GIVEN_UP_EVENT
    line (counted in the run's record), and no step is timed across it (the next match
    without a duration group only starts the clock again)."""

    def __init__(self, stream, pattern: str, images: int, warmup: int, clock=time.monotonic) -> None:
        self.stream, self.images, self.warmup = stream, images, warmup
        self.matcher = LineMatcher(pattern)
        self.clock = clock
        self.count = 0
        self.last: float | None = None
        self._read: queue.SimpleQueue = queue.SimpleQueue()  # (raw line, when read); b"" at the end
        self._feeder: threading.Thread | None = None

    def _feed(self) -> None:
        try:
            for raw in iter(self.stream.readline, b""):
                now = self.clock()
                self.matcher.put(raw.decode("utf-8", "replace"))  # before the line is seen below
                self._read.put((raw, now))
        finally:
            self._read.put((b"", 0.0))

    def readline(self) -> bytes:
        if self._feeder is None:
            self._feeder = threading.Thread(target=self._feed, daemon=True, name="step-regex-reader")
            self._feeder.start()
        raw, now = self._read.get()
        if not raw:
            self.matcher.close()
            return raw
        answer = self.matcher.take()
        if answer is GIVEN_UP:
            self.last = None  # the line may have been a step: never time one across it
            return (json.dumps({"event": GIVEN_UP_EVENT, "given_up": self.matcher.given_up,
                                "at": now}) + "\n").encode()
        event = self._step(answer, now)
        return raw if event is None else (json.dumps(event) + "\n").encode()

    def step_of(self, line: str, now: float) -> dict | None:
        """The step event a line stands for, read at `now` (None: no step); synchronous."""
        return self._step(self.matcher.search(line), now)

    def _step(self, groups: dict | None, now: float) -> dict | None:
        if groups is None:
            return None
        try:
            if groups.get("seconds") is not None:
                duration: float | None = float(groups["seconds"])
            elif groups.get("ms") is not None:
                duration = float(groups["ms"]) / 1000
            else:
                duration = None if self.last is None else now - self.last
            number = int(groups["step"]) if groups.get("step") is not None else self.count
        except ValueError:
            return None
        self.last = now
        if duration is None:
            return None
        self.count += 1
        phase = ev.PHASE_WARMUP if self.count <= self.warmup else ev.PHASE_MEASURED
        return {"compute": None, "comm": None, "event": "step", "step": number, "phase": phase,
                "start": now - duration, "end": now, "duration": duration, "images": self.images, "loss": None}


def descendants(pid: int) -> list[int]:
    """Every process below `pid` in the process tree (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], list(children.get(pid, ()))
    while queue:
        child = queue.pop(0)
        found.append(child)
        queue += children.get(child, ())
    return found


class UserProcess:
    """A started rank: its (translated) stdout, and a stop that ends its whole process group."""

    def __init__(self, inner, stdout, owner: "UserSpawner", rank: int) -> None:
        self.inner, self.stdout, self.owner, self.rank = inner, stdout, owner, rank

    def wait(self) -> int:
        return self.inner.wait()

    def failure(self, code: int) -> str | None:
        return self.inner.failure(code)

    def stop(self, grace: float) -> None:
        popen = getattr(self.inner, "popen", None)
        exited = getattr(self.inner, "exited", None)  # a rank on a host: its `node task`'s exit
        if self.owner.asked is not None:  # asked to stop: a while to end by itself
            left = max(0.0, self.owner.asked - time.monotonic())
            try:
                if popen is not None:
                    popen.wait(timeout=left)
                elif exited is not None:
                    exited(left)
            except Exception:  # noqa: BLE001 - a rank still running is ended below
                pass
        code = popen.poll() if popen is not None else exited(0) if exited is not None else None
        if popen is not None:  # as every local rank stood before the first was signalled
            code = self.owner.codes_before_stopping().get(self.rank, code)
        if popen is not None and hasattr(popen, "pid"):
            # a launcher's children may lead sessions of their own (torchrun's workers do): found
            # before the group is signalled, while they are still the launcher's, and ended after
            family = [(pid, proc.start_time(pid)) for pid in descendants(popen.pid)]
            proc.stop_group(popen, grace=grace)
            proc.stop_pids([pid for pid, started in family if proc.is_same_process(pid, started)], grace=grace)
        self.inner.stop(grace)
        # the record says whether the rank ended by itself (its exit status), was stopped (a job
        # that does not ask stop_requested() ends so), or was killed after a stop it did not make
        self.owner.ended(self.rank, how_it_ended(code, self.owner.stop_at, self.owner.stop_wait_s))


def how_it_ended(code: int | None, stop_at: int | None = None, waited_s: float | None = None) -> str:
    """A rank's end as ranks.json records it: "exited CODE" by itself, with the signal's name
    where a signal ended it ("exited -6 (SIGABRT)"); "stopped" (netbench ended a job that does
    not ask to stop, as such a job ends); "killed: ..." when it was asked to stop once `stop_at`
    steps were done and was still running `waited_s` later (it never got there)."""
    if code is None and stop_at is not None:
        return (f"killed: still running {waited_s or 0:.0f} s after it was asked to stop at {stop_at} steps"
                " (it never got there)")
    if code is None:
        return "stopped"
    if code < 0:
        try:
            return f"exited {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exited {code}"


class UserSpawner:
    """A Spawner (jobs/launch.py) for a user's command's ranks; see the module docstring."""

    def __init__(self, spawn, log_dir: Path, step_regex: str = "", images_per_step: int = 0,
                 warmup: int = 0, own_hostnames: bool = True) -> None:
        self.spawn, self.log_dir = spawn, log_dir
        self.step_regex, self.images, self.warmup = step_regex, images_per_step, warmup
        self.own_hostnames = own_hostnames
        self.control = log_dir / CONTROL_FILE
        self.asked: float | None = None  # when request_stop's wait for the ranks ends (monotonic)
        self.stop_at: int | None = None  # the step count request_stop asked the ranks to stop at
        self.stop_wait_s: float | None = None  # how long from the request to `asked`
        self.last_step = -1
        self.pace = StepPace()  # the ranks' step time and how late their steps are heard
        self.processes: list[UserProcess] = []
        self._codes: dict[int, int | None] | None = None  # codes_before_stopping's, taken once
        self.ranks: list[dict] = []
        self.ranks_file: Path | None = None

    def __call__(self, task: Task, log: Path, env: dict) -> UserProcess:
        log.parent.mkdir(parents=True, exist_ok=True)
        argv = task.argv
        drops_itself = False
        if self.own_hostnames and task.hosts and task.netns:
            hosts_file = log.parent / f"{task.node}.hosts"
            hosts_file.write_text(task.hosts)
            run_as = getattr(self.spawn, "run_as", None)  # the node's setup needs root; the command runs as the user
            if run_as is not None:
                argv = tuple(proc.user_argv(run_as, argv, os.getpid()))  # tied to the controller as the user
                drops_itself = True
            argv = node_argv(argv, task.netns, hosts_file.resolve())
        rank_env = {**dict(task.env), "NETBENCH_CONTROL": str(self.control.resolve())}
        if self.own_hostnames:  # this machine: `python` is the one netbench runs under (its venv's)
            rank_env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        self.ranks.append({"rank": task.index, "node": task.node, "argv": list(task.argv), "env": rank_env})
        self.ranks_file = log.parent / RANKS_FILE
        self._write_ranks()
        from dataclasses import replace

        inner = self.spawn(replace(task, argv=argv), log, {**env, **rank_env}, **({"drops_itself": True}
                                                                                  if drops_itself else {}))
        stdout = inner.stdout
        if self.step_regex and task.index == 0:
            stdout = RegexSteps(stdout, self.step_regex, self.images, self.warmup)
        started = UserProcess(inner, _Heard(stdout, self, len(self.ranks) - 1), self, len(self.ranks) - 1)
        self.processes.append(started)
        return started

    def _write_ranks(self) -> None:
        if self.ranks_file is not None:
            self.ranks_file.write_text(json.dumps(self.ranks, indent=1) + "\n")

    def ended(self, position: int, how: str) -> None:
        """Record how a rank ended ("exited CODE" by itself, or "stopped") in ranks.json."""
        self.ranks[position]["ended"] = how
        try:
            self._write_ranks()
        except OSError:
            pass

    def codes_before_stopping(self) -> dict[int, int | None]:
        """Each local rank's exit status (None: still running) once every rank has had until the
        stop request's deadline to end by itself, taken before the first is signalled: a rank that
        dies because a stopped peer went away was stopped, not ended by itself."""
        if self._codes is None:
            self._codes = {}
            for position, started in enumerate(self.processes):
                popen = getattr(started.inner, "popen", None)
                if popen is None:
                    continue
                if self.asked is not None:
                    try:
                        popen.wait(timeout=max(0.0, self.asked - time.monotonic()))
                    except Exception:  # noqa: BLE001 - still running: stopped below
                        pass
                self._codes[position] = popen.poll()
        return self._codes

    def request_stop(self, wait_s: float = STOP_WAIT_S) -> int:
        """Ask every rank to stop after the same step: past the last heard by a margin that
        no rank has reached when the request arrives (stop_margin: the measured step time,
        how late the last step was heard, a host's delivery); written into the control file
        here and carried to each rank on a host. The ranks' stop() waits up to `wait_s`
        beyond the margin's time for them to end by themselves. Returns that step count."""
        now = time.monotonic()
        step_s = self.pace.step_s()
        delivery_s = max((getattr(p.inner, "stop_delivery_s", 0.0) for p in self.processes), default=0.0)
        margin = stop_margin(step_s, self.pace.late_s(now), delivery_s)
        at = self.last_step + 1 + margin
        tmp = self.control.with_name(CONTROL_FILE + ".tmp")
        tmp.write_text(f"{at}\n")
        tmp.replace(self.control)
        for started in self.processes:
            carry = getattr(started.inner, "request_stop", None)
            if carry is not None:
                carry(at)
        self.stop_wait_s = wait_s + margin * (step_s or 0.0)
        self.asked, self.stop_at = now + self.stop_wait_s, at
        return at


class _Heard:
    """A rank's stdout through which the spawner hears the last step number (cheaply: only
    lines that look like step events are parsed)."""

    def __init__(self, stream, owner: UserSpawner, rank: int = 0) -> None:
        self.stream, self.owner, self.rank = stream, owner, rank

    def readline(self) -> bytes:
        raw = self.stream.readline()
        if b'"event": "step"' in raw:
            event = ev.parse_line(raw)
            if isinstance(event, ev.Step):
                self.owner.last_step = max(self.owner.last_step, event.step)
                self.owner.pace.heard(pace_key(self.rank, event), event.end, time.monotonic())
        return raw


def pace_key(position: int, event: ev.Step) -> tuple[int, int | None]:
    """Whose steps a step event's are, for the pace: the process's, and within it the rank
    the event names (a launcher started once per node, torchrun, writes several ranks' steps
    on one stdout: read as one, their interleaved ends looked like one rank of 1.4 ms steps)."""
    said = dict(event.extra).get("rank")
    return position, said if isinstance(said, int) and not isinstance(said, bool) else None
