"""Sandboxes: a testbed in namespaces of its own, for a user without root and for a second
testbed beside root's (state/places.py says where each lives).

A sandbox is a mount namespace (and, without root, a user namespace whose uid 0 is the user)
in which netbench binds its testbed's network namespaces under the sandbox's state folder
(``<state>/netns``). Nothing of it is visible outside, and the kernel removes all of it once
its last process has ended: after a SIGKILL nothing is left but processes still running in it,
which `end` stops. A netbench command enters one by executing itself again inside it:

* `enter_private`: a new sandbox held by the command itself (a sweep, a playbook, a collective
  benchmark), under ``testbeds/<id>``; it ends with the command;
* `start_keeper` + `enter`: the user's default testbed (``netbench testbed up``) is held by a
  keeper process between commands, which later commands enter (``nsenter``).

Each sandbox's ``testbed.json`` (`Holder`) names the process that holds it, its namespaces'
inodes (to find every process inside it from outside) and its owner.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NoReturn, Sequence

from netbench import proc
from netbench.errors import PrivilegeError, StateError
from netbench.state import places

HOLDER_FILE = "testbed.json"
NO_SANDBOX_ENV = "NETBENCH_NO_SANDBOX"  # set by the doctor where the host allows none: it probes outside
KEEPER_LOG = "keeper.log"
SWEEP, KEEPER = "sweep", "keeper"
KEEPER_START_S = 20.0  # how long `start_keeper` waits for the keeper to say it holds its namespaces


@dataclass(frozen=True)
class Holder:
    """What a sandbox's testbed.json says: who holds it and how to find what is inside."""

    id: str
    kind: str  # SWEEP (its command holds it) or KEEPER (the default testbed, between commands)
    privilege: str  # places.ROOT or places.ROOTLESS
    pid: int
    start: int | None  # the holder's start time (proc.start_time): a reused pid is not it
    uid: int  # its owner on the host
    created: float
    command: str = ""
    mntns: int | None = None  # the sandbox's mount namespace inode (None until it is inside)
    userns: int | None = None  # its user namespace inode (rootless)

    def alive(self) -> bool:
        return proc.is_running(self.pid, self.start)

    def to_json(self) -> dict:
        return asdict(self)


def read_holder(state: Path) -> Holder | None:
    """The Holder of the sandbox whose state folder is `state`; None when there is none (or its
    file cannot be read: a torn write is as good as none)."""
    try:
        data = json.loads((state / HOLDER_FILE).read_text())
        return Holder(**{k: data[k] for k in Holder.__dataclass_fields__ if k in data})
    except (OSError, ValueError, TypeError, KeyError):
        return None


def write_holder(state: Path, holder: Holder) -> None:
    """testbed.json, written whole (a temporary file renamed over it)."""
    tmp = state / f".{HOLDER_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(holder.to_json(), sort_keys=True))
    os.replace(tmp, state / HOLDER_FILE)


def _ns_inode(kind: str, pid: int | str = "self") -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


def _cli_argv(argv: Sequence[str]) -> list[str]:
    """This netbench again, with the same arguments."""
    return [sys.executable, "-m", "netbench.cli", *argv]


def sandbox_env(state: Path, holder_id: str, privilege: str) -> dict[str, str]:
    """The variables that put a process (and everything it starts) in the sandbox's testbed."""
    return {places.STATE_ENV: str(state), places.NETNS_DIR_ENV: str(places.sandbox_netns_dir(state)),
            places.SANDBOX_ENV: holder_id, places.PRIVILEGE_ENV: privilege}


def unshare_argv(privilege: str) -> list[str]:
    """util-linux unshare's arguments for a new sandbox: a private mount namespace, and for a
    user without root a user namespace whose uid 0 is that user."""
    user = ["--user", "--map-root-user"] if privilege == places.ROOTLESS else []
    return ["unshare", *user, "--mount", "--propagation", "private", "--"]


def _check_tools(*tools: str) -> None:
    for tool in tools:
        if shutil.which(tool) is None:
            raise PrivilegeError(f"{tool} is not installed: netbench needs it to hold a testbed of its own",
                                 hint="install util-linux (it provides unshare and nsenter)")


def _exec(argv: list[str], env: dict[str, str]) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(argv[0], argv, {**os.environ, **env})


def new_private(base: Path, privilege: str, command: str) -> tuple[Path, Holder]:
    """A fresh sandbox's state folder under `base`, with its testbed.json naming this process
    as its holder (it keeps its pid and start time through the exec that enters it)."""
    me = os.getpid()
    holder_id = places.new_testbed_id(me, proc.start_time(me))
    state = places.testbed_dir(base, holder_id)
    try:
        base.mkdir(parents=True, exist_ok=True, mode=0o755)
        state.mkdir(parents=True, exist_ok=False, mode=0o755)
        places.sandbox_netns_dir(state).mkdir(mode=0o755)
    except OSError as exc:
        raise StateError(f"cannot make the testbed's state folder {state}: {exc.strerror or exc}",
                         hint="set NETBENCH_STATE_DIR to a folder of your own") from None
    holder = Holder(id=holder_id, kind=SWEEP, privilege=privilege, pid=me, start=proc.start_time(me),
                    uid=os.getuid(), created=time.time(), command=command)
    write_holder(state, holder)
    return state, holder


def enter_private(base: Path, privilege: str, argv: Sequence[str]) -> NoReturn:
    """Run this command again inside a new sandbox of its own (see the module docstring)."""
    _check_tools("unshare")
    state, holder = new_private(base, privilege, " ".join(["netbench", *argv]))
    _exec(unshare_argv(privilege) + _cli_argv(argv), sandbox_env(state, holder.id, privilege))


def settle_in() -> Holder | None:
    """Inside a sandbox (NETBENCH_SANDBOX set): record its namespaces' inodes in its
    testbed.json, once; the Holder (None outside a sandbox, or without a testbed.json)."""
    if not os.environ.get(places.SANDBOX_ENV):
        return None
    state = places.state_dir(os.environ, os.geteuid())
    holder = read_holder(state)
    if holder is not None and holder.mntns is None and holder.pid == os.getpid():
        mntns = _ns_inode("mnt")
        userns = _ns_inode("user") if holder.privilege == places.ROOTLESS else None
        holder = Holder(**{**holder.to_json(), "mntns": mntns, "userns": userns})
        write_holder(state, holder)
    return holder


# ---------------------------------------------------------------- the keeper (the default testbed)

def keeper(state: Path) -> Holder | None:
    """The live keeper of the default testbed in `state`; None when there is none."""
    holder = read_holder(state)
    return holder if holder is not None and holder.kind == KEEPER and holder.alive() else None


def start_keeper(state: Path, privilege: str) -> Holder:
    """Start the keeper of the default testbed in `state` (netbench/testbed/keeper.py) in a new
    sandbox, detached from this command, and wait until it holds its namespaces."""
    _check_tools("unshare", "nsenter")
    try:
        state.mkdir(parents=True, exist_ok=True, mode=0o755)
        places.sandbox_netns_dir(state).mkdir(exist_ok=True, mode=0o755)
    except OSError as exc:
        raise StateError(f"cannot make the testbed's state folder {state}: {exc.strerror or exc}",
                         hint="set NETBENCH_STATE_DIR to a folder of your own") from None
    argv = unshare_argv(privilege) + [sys.executable, "-m", "netbench.testbed.keeper", str(state), privilege]
    env = {**os.environ, **sandbox_env(state, "default", privilege), "PYTHONPATH": proc.child_pythonpath()}
    import subprocess

    log = open(state / KEEPER_LOG, "ab")
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                 start_new_session=True)
    finally:
        log.close()
    deadline = time.monotonic() + KEEPER_START_S
    while time.monotonic() < deadline:
        holder = read_holder(state)
        if holder is not None and holder.kind == KEEPER and holder.pid == child.pid and holder.mntns is not None:
            return holder
        if child.poll() is not None:
            tail = (state / KEEPER_LOG).read_text(errors="replace").strip().splitlines()[-1:]
            raise PrivilegeError(f"the testbed's keeper could not start: {tail[0] if tail else child.returncode}",
                                 hint="'netbench doctor' says what this host allows without root")
        time.sleep(0.02)
    child.kill()
    raise StateError(f"the testbed's keeper did not start within {KEEPER_START_S:g}s")


def enter(holder: Holder, state: Path, argv: Sequence[str]) -> NoReturn:
    """Run this command again inside the sandbox `holder` keeps (nsenter: its user namespace
    first, as its uid 0, then its mount namespace)."""
    _check_tools("nsenter")
    # --preserve-credentials: a user namespace made without root denies setgroups, and this user
    # is already uid 0 inside it (its only mapping)
    user = ["--user", "--preserve-credentials"] if holder.privilege == places.ROOTLESS else []
    nsenter = ["nsenter", f"--target={holder.pid}", *user, "--mount", "--"]
    _exec(nsenter + _cli_argv(argv), sandbox_env(state, holder.id, holder.privilege))


def serve_keeper(state: Path, privilege: str) -> None:
    """The keeper's life (in its new sandbox): say it holds it, then wait for SIGTERM; its
    testbed.json goes with it."""
    me = os.getpid()
    holder = Holder(id="default", kind=KEEPER, privilege=privilege, pid=me, start=proc.start_time(me),
                    uid=proc.owner_uid(), created=time.time(),
                    command="netbench testbed up", mntns=_ns_inode("mnt"),
                    userns=_ns_inode("user") if privilege == places.ROOTLESS else None)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    write_holder(state, holder)
    while not stop:
        signal.pause()
    if read_holder(state) == holder:
        (state / HOLDER_FILE).unlink(missing_ok=True)
        netns_dir = places.sandbox_netns_dir(state)
        _unmount(netns_dir)  # its namespaces' folder: a mount point in this sandbox only
        for path in (netns_dir, state / KEEPER_LOG):
            try:
                path.rmdir() if path.is_dir() else (path.unlink() if path.stat().st_size == 0 else None)
            except OSError:
                pass  # namespaces still bound there, or a log with something in it: reset's to remove


def stop_keeper(holder: Holder) -> None:
    """Ask the keeper to end (its sandbox goes with its last process)."""
    if holder.alive():
        try:
            os.kill(holder.pid, signal.SIGTERM)
        except OSError:
            pass


def describe_here(run_as=None) -> str:
    """One line for a sweep's start: where its testbed is (root's default, or a sandbox: whose,
    which) and whom its job processes run as (testbed/run_as.py)."""
    from netbench.testbed import run_as as users

    privilege = places.privilege(os.environ, os.geteuid())
    holder = read_holder(places.state_dir(os.environ, os.geteuid())) if os.environ.get(places.SANDBOX_ENV) else None
    if holder is None:
        where = "root's default testbed (/run/netns)"
    elif holder.kind == KEEPER:
        where = f"the testbed that is up, in {'your' if privilege == places.ROOTLESS else 'its'} keeper's sandbox"
    else:
        where = f"a sandbox of its own ({holder.id})" + (": the default testbed is busy"
                                                          if privilege == places.ROOT else "")
    return f"{privilege}: {where}; {users.describe(run_as, privilege == places.ROOT)}"


# ---------------------------------------------------------------- which testbed a command uses

def _leave(state: Path) -> None:
    """At the end of the command that holds a sandbox: its state folder goes when its journal
    holds nothing (else `netbench reset` has what it needs)."""
    from netbench.state.journal import Journal

    try:
        if not Journal(state).pending():
            _unmount(places.sandbox_netns_dir(state))  # a mount point here (namespaces are bound in it)
            shutil.rmtree(state, ignore_errors=True)
    except Exception:  # noqa: BLE001 - at exit, a folder left behind is for reset to remove
        pass


def _unmount(path: Path) -> None:
    """Detach whatever is mounted on `path` in this mount namespace (nothing: no harm)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.umount2(str(path).encode(), 2)  # MNT_DETACH


# what a command does with the testbed (`take_testbed`): brings it up, uses the one that is up,
# shows it if there is one, runs a sweep on it (or on one of its own)
UP, USES, SHOWS, SWEEPS, PROBES = "up", "uses", "shows", "sweeps", "probes"  # PROBES: a sandbox of its own


def _lock_free(state: Path) -> bool:
    """Whether no command holds the testbed lock in `state` (tried, then let go at once)."""
    import fcntl

    try:
        with open(state / "lock", "a+") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(fh, fcntl.LOCK_UN)
    except OSError:
        return True  # no lock file: nobody holds it
    return True


def _others_up(state: Path) -> bool:
    """Whether root's default namespaces (/run/netns) hold a testbed this state folder's journal
    did not make (another state folder's, perhaps in use): a sweep then takes a sandbox of its own."""
    from netbench.state.journal import Journal
    from netbench.testbed import netns as local

    up = set(local.list_netbench_netns())
    if not up:
        return False
    mine = {e.data.get("name") for e in Journal(state).pending() if e.kind == "netns"}
    return not up <= mine


def take_testbed(use: str, argv: Sequence[str]) -> None:
    """Put this command where its testbed is, before it changes anything; returns only where
    it already is (root on its default testbed, or inside a sandbox), else runs the command again
    inside one (and never returns):

    * root: its default testbed; a sweep (`SWEEPS`) whose default is busy gets a sandbox of its own;
    * without root: the default testbed's keeper (`UP` starts one; `USES` needs one, else
      TestbedError), and a sweep the keeper's testbed where it is up and free, else a sandbox of
      its own. PrivilegeError, naming the setting and its fix, where this host allows none.
    """
    from netbench.errors import TestbedError

    if os.environ.get(places.SANDBOX_ENV):
        holder = settle_in()
        if holder is not None and holder.kind == SWEEP and holder.pid == os.getpid():
            import atexit

            atexit.register(_leave, places.state_dir(os.environ, os.geteuid()))
        return
    base = places.base_dir(os.environ, os.geteuid())
    state = places.state_dir(os.environ, os.geteuid())
    if os.geteuid() == 0:
        if use == SWEEPS and (not _lock_free(state) or _others_up(state)):
            enter_private(base, places.ROOT, argv)
        return
    if use == PROBES and os.environ.get(NO_SANDBOX_ENV):  # the doctor outside, naming what stops it
        return
    from netbench.testbed import rootless

    limit = rootless.refusal()
    if limit is not None:
        raise PrivilegeError(f"this command needs root on this host: {limit.says} ({limit.what})", hint=limit.fix)
    if use == PROBES:
        enter_private(base, places.ROOTLESS, argv)
    kept = keeper(state)
    if use == SHOWS:
        if kept is not None:
            enter(kept, state, argv)
        return
    if use == UP:
        enter(kept or start_keeper(state, places.ROOTLESS), state, argv)
    if use == USES:
        if kept is None:
            raise TestbedError("no testbed is up", hint="start one with 'netbench testbed up'")
        enter(kept, state, argv)
    if kept is not None and _lock_free(state):
        enter(kept, state, argv)
    enter_private(base, places.ROOTLESS, argv)
