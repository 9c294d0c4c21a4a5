"""A user's (or root's) sandboxes seen from outside: listing them, ending one, and `netbench
reset` of those no command is using (testbed/sandbox.py makes and enters them).

A sandbox's namespaces, qdiscs and rules live only as long as some process inside it: ending
its processes is what removes them. What lies outside it (CPU-limit groups, a host sysctl) is
undone from its journal; its state folder goes last.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable, Sequence

from netbench import proc
from netbench.state import places
from netbench.testbed.sandbox import HOLDER_FILE, KEEPER_LOG, SWEEP, Holder, _ns_inode, read_holder

def testbed_states(base: Path) -> list[Path]:
    """The state folders of this user's testbeds under `base`: the default one (when it holds
    anything) and every sandbox's."""
    found = [base] if (base / HOLDER_FILE).exists() or (base / "journal.jsonl").exists() else []
    try:
        found += sorted(p for p in (base / places.TESTBEDS).iterdir() if p.is_dir())
    except OSError:
        pass
    return found


def _environ(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def processes_in(holder: Holder, pids: Sequence[str] | None = None, mntns=None, environ=_environ) -> list[int]:
    """Every process inside the sandbox (its mount namespace), the holder included; only those
    this user may see, never this process.

    A namespace's inode number is reused as soon as the namespace is gone (the kernel hands out
    the lowest free one): once the holder has died, a process in a mount namespace with that
    inode counts only if its environment names the sandbox (NETBENCH_SANDBOX, which everything
    started inside inherits). Else the next `unshare --mount` of anyone's, or this reset's own,
    would be taken for the sandbox and stopped. `pids`, `mntns(pid)`, `environ(pid)`: /proc's
    (for tests)."""
    if holder.mntns is None:
        return [holder.pid] if holder.alive() else []
    mntns = mntns or (lambda pid: _ns_inode("mnt", pid))
    if pids is None:
        pids = [entry.name for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    pinned = holder.alive()  # its namespace, and so its inode, lives while the holder does
    marker = f"{places.SANDBOX_ENV}={holder.id}".encode()
    found = []
    for pid in pids:
        if int(pid) == os.getpid() or mntns(pid) != holder.mntns:
            continue
        if pinned or marker in environ(pid).split(b"\0"):
            found.append(int(pid))
    return found


def end(holder: Holder, grace: float = 3.0) -> list[int]:
    """Stop every process inside the sandbox (SIGTERM, then SIGKILL); once they are gone, the
    kernel removes its namespaces and everything in them. Returns the pids stopped."""
    pids = processes_in(holder)
    if holder.alive() and holder.pid not in pids:
        pids.append(holder.pid)
    return proc.stop_pids(pids, grace=grace)


def remove_state(state: Path, base: Path, warn: Callable[[str], None]) -> bool:
    """Remove a sandbox's state folder (one under `base`/testbeds, all netbench's own); the
    default testbed's folder keeps everything but its testbed.json and the empty netns/."""
    if state.parent == base / places.TESTBEDS:
        shutil.rmtree(state, ignore_errors=True)
        if state.exists():
            warn(f"state folder {state} could not be removed")
            return False
        return True
    for name in (HOLDER_FILE, KEEPER_LOG):
        (state / name).unlink(missing_ok=True)
    shutil.rmtree(state / "engines", ignore_errors=True)
    try:
        netns_dir = places.sandbox_netns_dir(state)
        for left in netns_dir.iterdir():
            left.unlink()  # mount points of namespaces gone with the sandbox: empty files
        netns_dir.rmdir()
    except OSError:
        pass
    return True


def bases_to_list(euid: int, env) -> list[Path]:
    """Where `testbed show` looks for testbeds: this user's folder; root also every user's
    runtime folder (/run/user/UID/netbench; a user without one keeps theirs in their cache
    folder, which root does not search)."""
    mine = places.base_dir(env, euid)
    if euid != 0:
        return [mine]
    try:
        users = sorted(Path("/run/user").glob("*/netbench"))
    except OSError:
        users = []
    return [mine, *users]


def listing(bases: Sequence[Path], skip: Path | None = None) -> list[dict]:
    """One row per testbed under `bases` (but `skip`, the state folder already shown): its id,
    owner, kind, holder and whether it is in use."""
    import pwd

    rows = []
    for base in bases:
        for state in testbed_states(base):
            holder = read_holder(state)
            if holder is None or (skip is not None and state.resolve() == skip.resolve()):
                continue
            try:
                owner = pwd.getpwuid(holder.uid).pw_name
            except KeyError:
                owner = str(holder.uid)
            rows.append({"id": holder.id, "owner": owner, "kind": holder.kind, "privilege": holder.privilege,
                         "pid": holder.pid, "alive": holder.alive(), "state": str(state), "command": holder.command})
    return rows


def is_busy(holder: Holder | None) -> bool:
    """Whether a sandbox is in use by the command that holds it (a sweep still running)."""
    return holder is not None and holder.kind == SWEEP and holder.alive()


def reset_sandboxes(base: Path, warn: Callable[[str], None], include_default: bool) -> list[str]:
    """`netbench reset` of this user's sandboxes under `base` (and of the default testbed's
    when it is one: `include_default`, a user without root): each one not in use has every
    process inside it stopped (then the kernel removes its namespaces), what its journal holds
    outside them undone (CPU-limit groups, host sysctls), and its state folder removed. One
    line per thing removed; a sandbox in use is left alone, with a warning."""
    from netbench.errors import ResetIncomplete
    from netbench.state.journal import Journal
    from netbench.state.reset import undo_each

    removed: list[str] = []
    failures: list[str] = []
    for state in testbed_states(base):
        if state == base and not include_default:
            continue
        holder = read_holder(state)
        if is_busy(holder):
            warn(f"testbed {holder.id} left alone: in use by pid {holder.pid} ({holder.command}); stop it first")
            continue
        if holder is not None:
            stopped = end(holder)
            if stopped:
                removed.append(f"testbed {holder.id}: {len(stopped)} process(es) stopped, its namespaces with them")
        journal = Journal(state)
        # what was inside the sandbox went with its processes; only what lies outside it (groups,
        # host sysctls) is undone. Its namespaces' names are never looked up here: on the host
        # they may be another testbed's
        inside = [e for e in journal.pending() if e.kind == "netns"]
        for entry in inside:
            journal.done(entry)
        outside = [e for e in reversed(journal.pending()) if e.kind != "netns"]
        removed += undo_each(journal, outside, set(), warn, failures)
        for line in journal.compact():
            warn(line)
        if not journal.pending() and remove_state(state, base, warn):
            removed.append(f"state folder {state}" if state != base else f"testbed {holder.id if holder else 'default'}")
    if failures:
        raise ResetIncomplete(removed, failures)
    return removed
