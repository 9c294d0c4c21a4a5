"""All process execution goes through here (as Mininet's node.py does).

Processes can be started inside a named network namespace (nsenter), in their own session,
and optionally tied to the controller's life (PR_SET_PDEATHSIG, through setpriv) so a
SIGKILLed controller leaves no orphan behind. The kernel sends that signal when the *thread*
that forked the child exits, not the process: every child is therefore forked by the main
thread or by one thread that lives as long as the process (`_LastingThread`), whichever
thread asks. Stopping always escalates: SIGTERM, a grace period, SIGKILL.
"""

from __future__ import annotations

import errno
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from netbench.errors import NetbenchError
from netbench.state import places

# where this testbed's namespaces are bound: /run/netns, or a sandbox's own folder (its state
# folder's netns/, set in the environment before the process started: state/places.py)
NETNS_RUN_DIR = places.netns_dir(os.environ)


def pyroute2_netns():
    """pyroute2's netns module, set to create, list and enter namespaces in NETNS_RUN_DIR (its
    default is /var/run/netns): every netbench use of it goes through here."""
    from pyroute2 import netns

    netns.NETNS_RUN_DIR = str(NETNS_RUN_DIR)
    return netns


# run by sh after setpriv has set the death signal: a parent already gone by then would
# never send it, so the child stops itself instead of running on as an orphan
_PARENT_CHECK = '[ "$PPID" = "$1" ] || exit 1; shift; exec "$@"'
# run by sh first of all with a node's CPU limit: its own pid into the group's cgroup.procs,
# then exec, so the command and every process it starts are in the group from their start
_JOIN_CGROUP = 'echo $$ > "$1" || exit 1; shift; exec "$@"'


def user_argv(run_as, argv: Sequence[str], parent: int | None) -> list[str]:
    """`argv` run as `run_as`'s user (testbed/run_as.RunAs) by setpriv; with a `parent`, tied to
    it after the change of user (which clears a death signal set before): the death signal, then
    sh's check that the parent was still there once it was set."""
    if parent is None:
        return [*run_as.argv()[:-1], "--", *argv]
    return [*run_as.argv()[:-1], "--pdeathsig", "KILL", "--", "sh", "-c", _PARENT_CHECK, "netbench-child", str(parent),
            *argv]


def child_argv(argv: Sequence[str], netns: str | None, die_with_parent: bool,
               parent_pid: int | None = None, cgroup: str | None = None, run_as=None) -> list[str]:
    """`argv` behind exec wrappers that set the child up: `setpriv --pdeathsig KILL` ties it
    to the controller (`parent_pid`, default this process), then sh checks that the parent
    was still there once that was set; `nsenter --net=` enters the namespace. Each execs in
    place, so the pid is the command's own; and nothing runs between fork and exec, as a
    preexec_fn would in a controller with threads (where only async-signal-safe code may
    run there). `cgroup`: a group's cgroup.procs file the child joins before anything else.
    `run_as` (testbed/run_as.RunAs): the user the command runs as; what needs root (the group,
    the namespace) comes first, then setpriv drops to the user, setting the death signal after
    the change of user (which would clear it)."""
    prefix: list[str] = []
    if cgroup:
        prefix += ["sh", "-c", _JOIN_CGROUP, "netbench-cgroup", cgroup]
    parent = os.getpid() if parent_pid is None else parent_pid
    if run_as is not None:
        if netns:
            prefix += ["nsenter", f"--net={NETNS_RUN_DIR / netns}", "--"]
        return prefix + user_argv(run_as, argv, parent if die_with_parent else None)
    if die_with_parent:
        prefix += ["setpriv", "--pdeathsig", "KILL", "--", "sh", "-c", _PARENT_CHECK, "netbench-child", str(parent)]
    if netns:
        prefix += ["nsenter", f"--net={NETNS_RUN_DIR / netns}", "--"]
    return prefix + list(argv)


def _check_startable(argv: Sequence[str], netns: str | None, die_with_parent: bool, verb: str,
                     path: str | None = None) -> None:
    """What the wrappers would otherwise report only as the child's exit status. `path`:
    the child's PATH, where it differs from ours."""
    for tool, needed in (("setpriv", die_with_parent), ("nsenter", bool(netns))):
        if needed and shutil.which(tool) is None:
            raise NetbenchError(f"cannot {verb} {argv[0]}: {tool} is not installed",
                                hint="install util-linux (it provides setpriv and nsenter)")
    if netns and not (NETNS_RUN_DIR / netns).exists():
        raise NetbenchError(f"cannot {verb} {argv[0]}: namespace {netns} does not exist",
                            hint="is the testbed up? 'netbench testbed show'")
    if shutil.which(argv[0], path=path) is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])


_T = TypeVar("_T")


class _LastingThread:
    """One daemon thread, started on first use, that runs what is handed to it and never
    returns while the process lives: children it forks get their parent-death signal only
    when the controller process ends (a daemon thread dies with the process, never before)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._pid: int | None = None  # the process whose thread it is (a forked copy has none)

    def call(self, work: Callable[[], _T]) -> _T:
        """`work()` run on the main thread (the caller's, if it is the main one) or on the
        lasting thread; its result or its exception."""
        if threading.current_thread() is threading.main_thread():
            return work()
        with self._lock:
            if self._pid != os.getpid():
                self._work = queue.SimpleQueue()
                threading.Thread(target=self._serve, args=(self._work,), name="netbench-spawner", daemon=True).start()
                self._pid = os.getpid()
            done: Future = Future()
            self._work.put((work, done))
        return done.result()

    @staticmethod
    def _serve(work_queue: queue.SimpleQueue) -> None:
        while True:
            work, done = work_queue.get()
            try:
                done.set_result(work())
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                done.set_exception(exc)


_LASTING = _LastingThread()


def spawn(argv: Sequence[str], *, netns: str | None = None, env: Mapping[str, str] | None = None,
          stdin=subprocess.DEVNULL, stdout=None, stderr=None, die_with_parent: bool = True,
          cwd: str | None = None, cgroup: str | None = None, run_as=None) -> subprocess.Popen:
    """Start `argv` (optionally inside network namespace `netns`) in a new session.

    die_with_parent: the child gets SIGKILL when the controller process dies (sweeps), not
    when the thread that asked returns (it is forked by a thread that lives as long as the
    process). Long-lived daemons started by `netbench apply` pass False and are tracked by the
    journal instead. `cgroup`: the cgroup.procs file of the group it starts in (child_argv);
    `run_as`: the user it runs as (testbed/run_as.py), None for this process's own.
    """
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    if run_as is not None:
        full_env.update(run_as.env())
    where = f" in {netns}" if netns else ""
    try:
        _check_startable(argv, netns, die_with_parent or run_as is not None, "start", full_env.get("PATH"))
        full_argv = child_argv(argv, netns, die_with_parent, cgroup=cgroup, run_as=run_as)
        return _LASTING.call(lambda: subprocess.Popen(full_argv, stdin=stdin, stdout=stdout, stderr=stderr,
                                                      env=full_env, cwd=cwd, start_new_session=True))
    except OSError as exc:
        raise NetbenchError(f"cannot start {argv[0]}{where}: {exc.strerror or exc}") from None


def run(argv: Sequence[str], *, netns: str | None = None, timeout: float = 30.0,
        check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    """Run a short command to completion, capturing output; raise NetbenchError on failure."""
    try:
        _check_startable(argv, netns, True, "run")
        proc = subprocess.run(
            child_argv(argv, netns, True), capture_output=True, text=True, timeout=timeout, input=input,
        )
    except subprocess.TimeoutExpired:
        raise NetbenchError(f"{' '.join(argv)} did not finish within {timeout:g}s") from None
    except FileNotFoundError:
        raise NetbenchError(f"{argv[0]} is not installed", hint="run 'make install'") from None
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise NetbenchError(f"{' '.join(argv)} failed: {detail[-1] if detail else proc.returncode}")
    return proc


def owner_uid() -> int:
    """This process's user on the host: inside a user namespace (a sandbox without root), the
    uid its uid 0 stands for."""
    try:
        outside = places.outside_uid(Path("/proc/self/uid_map").read_text())
    except OSError:
        outside = None
    return os.getuid() if outside is None else outside


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat).

    Recorded with each pid so that a reset never kills an unrelated process that reused it.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19])


def is_same_process(pid: int, started: int | None) -> bool:
    """True if `pid` is alive and is the process that started at `started`. Without a
    recorded start time it cannot be told from a process that reused the pid: False."""
    now = start_time(pid)
    return now is not None and started is not None and now == started


def is_running(pid: int, started: int | None) -> bool:
    """is_same_process, and not a zombie (a child that died and was not reaped yet): one read
    of /proc/PID/stat (a change to 64 delay engines asks this of each)."""
    if started is None:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            stat = fh.read()
        fields = stat[stat.rindex(")") + 2:].split()  # comm may hold spaces and parentheses
        return int(fields[19]) == started and fields[0] != "Z"
    except (OSError, ValueError, IndexError):
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is dead for our purposes
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def stop_pids(pids: Iterable[int], grace: float = 5.0) -> list[int]:
    """SIGTERM every pid, wait up to `grace` seconds, then SIGKILL the rest.

    Returns the pids that were alive and have been stopped.
    """
    live = [pid for pid in pids if _alive(pid)]
    for pid in live:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(pid) for pid in live):
        _reap(live)
        time.sleep(0.05)
    for pid in live:
        if _alive(pid):
            _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(_alive(pid) for pid in live):
        _reap(live)
        time.sleep(0.02)
    _reap(live)
    return live


def stop(popen: subprocess.Popen, grace: float = 5.0) -> None:
    """Stop a child we started, with escalation, and reap it."""
    if popen.poll() is None:
        stop_pids([popen.pid], grace=grace)
    try:
        popen.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def stop_group(popen: subprocess.Popen, grace: float = 5.0) -> int | None:
    """Stop a child started in its own session (spawn does that) and its whole process
    group, whether the child (the group's leader) still runs or not: a shell script that
    started a process in the background (`tensorboard &`) and exited leaves that process in
    the group. SIGTERM to the group, up to `grace` seconds for the leader and every member
    to end, then SIGKILL. Returns the child's exit code.

    The group keeps the leader's pid as its id while any member lives (the kernel reuses
    neither), so signalling it after the leader was reaped reaches only its members."""
    pgid = popen.pid
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if _group_ended(popen, pgid):
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not _group_ended(popen, pgid):
            time.sleep(0.02)
    return popen.poll()


def _group_ended(popen: subprocess.Popen, pgid: int) -> bool:
    """Whether the child has exited (reaped here) and its group has no member left running."""
    return popen.poll() is not None and not group_members(pgid)


def group_members(pgid: int) -> list[int]:
    """The processes of process group `pgid` still running (zombies are not), from /proc."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
        except (OSError, ValueError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def netns_inode(name: str) -> int | None:
    try:
        return os.stat(NETNS_RUN_DIR / name).st_ino
    except OSError:
        return None


HOST_NETNS_REFS = (Path("/proc/1/ns/net"), Path("/proc/self/ns/net"))


def is_host_netns(name: str) -> bool:
    """True when /run/netns/NAME is the host's own network namespace (pid 1's) or this
    process's: a reference someone made to it, whose processes netbench must never stop.

    Where pid 1's namespace cannot be read (a container whose init is more privileged than
    root inside it), only this process's is compared; that init's processes cannot be read
    either, so pids_in_netns never finds them.
    """
    try:
        target = os.stat(NETNS_RUN_DIR / name)
    except OSError:
        return False
    for ref in HOST_NETNS_REFS:
        try:
            st = os.stat(ref)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            return True
    return False


def pids_in_netns(name: str) -> list[int]:
    """Every process whose network namespace is /run/netns/NAME (by inode)."""
    inode = netns_inode(name)
    if inode is None:
        return []
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(entry / "ns" / "net").st_ino == inode:
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def child_pythonpath() -> str:
    """PYTHONPATH for children: the folder holding this netbench first, so they run this code."""
    root = str(Path(__file__).resolve().parents[1])
    existing = os.environ.get("PYTHONPATH")
    return root if not existing else f"{root}{os.pathsep}{existing}"


@contextmanager
def realtime(priority: int) -> Iterator[bool]:
    """The calling thread at SCHED_FIFO `priority` for the block (its children forked meanwhile
    start with normal scheduling: SCHED_RESET_ON_FORK), then back to what it had. Yields
    False, changing nothing, where the system refuses (not root, or no real-time scheduling)."""
    try:
        before = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(priority))
    except (OSError, AttributeError):
        yield False
        return
    try:
        yield True
    finally:
        os.sched_setscheduler(0, before[0], before[1])
