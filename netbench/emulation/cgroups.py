"""CPU limits per node: one cgroup per node under a parent netbench owns (the edge).

Two adapters behind one small interface (`Cgroups`): cgroup v2 (`cpu.max` "QUOTA PERIOD",
under `<root>/netbench.slice`, a slice of netbench's own, never another service's) and v1
(`cpu.cfs_quota_us` and `cpu.cfs_period_us` under `<cpu mount>/netbench`), for hosts that
mount only v1. `detect()` picks the one this machine has; both take their root so tests
drive them against a folder of files (tests/fakes has an in-memory one too).

A node's processes are put in its group from their start: `proc.spawn(..., cgroup=FILE)`
writes the child's own pid into the group's `cgroup.procs` before it execs the command, so
every process it starts (torchrun's children, a user's shell) inherits the group.

`NodeGroups` journals each group before it is made (kind "cgroup"), so `netbench reset`
removes it after any crash (state/undo.py), and removes them at the end of a sweep. A group
still holding processes when it is removed (what a job left running: only netbench put
processes there) has them ended, never moved to the root group, where they would run on
unlimited. On v2 the cpu controller that netbench enables in the root's cgroup.subtree_control
is journaled too (kind "cgroup-control") and held machine-wide (state/holds.py): the last
netbench that relied on it turns it off again.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Callable, Protocol

from netbench import proc
from netbench.errors import TestbedError
from netbench.model.compute import Quota, quota_plan
from netbench.state.holds import Holds

V1_PARENT = "netbench"
V2_PARENT = "netbench.slice"
PARENTS = (V1_PARENT, V2_PARENT)
MOUNTS = Path("/proc/self/mounts")
HINT = "mount cgroup v2 (or v1's cpu controller) at /sys/fs/cgroup, or run without --cpus"
CONTROL = "cgroup.subtree_control"
END_GRACE_S = 1.0  # a process left in a group: SIGTERM, this long, then SIGKILL


class Cgroups(Protocol):
    """One node's group, by name, under netbench's parent."""

    version: int
    root: Path

    def path(self, name: str) -> Path: ...
    def create(self, name: str) -> Path: ...  # the parent too; an existing group is taken over
    def set_quota(self, name: str, quota: Quota) -> None: ...
    def add(self, name: str, pid: int) -> None: ...
    def remove(self, name: str) -> bool: ...  # its processes ended first; False: none
    def root_control(self) -> Path | None: ...  # v2: the root's cgroup.subtree_control; v1: None
    def throttled(self, name: str) -> dict[str, int]: ...  # cpu.stat's periods and throttled counts


def _write(path: Path, text: str) -> None:
    try:
        with open(path, "w") as fh:
            fh.write(text)
    except OSError as exc:
        raise TestbedError(f"cannot write {text!r} to {path}: {exc.strerror or exc}", hint=HINT) from None


def _mkdir(path: Path) -> None:
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        raise TestbedError(f"cannot create cgroup {path}: {exc.strerror or exc}", hint=HINT) from None


def _stat(path: Path) -> dict[str, int]:
    out = {}
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                out[key] = int(value)
    except OSError:
        pass
    return out


def _members(path: Path) -> list[int]:
    try:
        return [int(pid) for pid in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def end_members(path: Path, grace: float = END_GRACE_S) -> list[int]:
    """End every process in the group at `path` (a job's leftovers: only netbench put processes
    in its groups): SIGTERM, `grace` s, SIGKILL; v2's cgroup.kill for any that joined meanwhile.
    The pids that were there."""
    pids = _members(path)
    if pids:
        proc.stop_pids(pids, grace=grace)
    if _members(path) and (path / "cgroup.kill").exists():
        try:
            _write(path / "cgroup.kill", "1")
        except TestbedError:
            pass
    return pids


def remove_group(path: Path, root: Path, grace: float = END_GRACE_S) -> bool:
    """rmdir a group (a cgroup dir only goes when empty of processes: any still in it are
    ended first, never moved to `root`'s group, where they would run unlimited); then its
    parent if that is empty. False: it was not there."""
    if not path.is_dir():
        return False
    try:
        path.rmdir()
    except OSError as exc:
        if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
            raise TestbedError(f"cannot remove cgroup {path}: {exc.strerror or exc}") from None
        end_members(path, grace)
        deadline = time.monotonic() + 5.0  # the kernel empties a group as its processes are reaped
        while True:
            try:
                path.rmdir()
                break
            except OSError as again:
                if time.monotonic() > deadline:
                    raise TestbedError(f"cannot remove cgroup {path}: {again.strerror or again}",
                                       hint="a process is still in it: 'cat " + str(path / "cgroup.procs") + "'"
                                       ) from None
                time.sleep(0.05)
    if path.parent.name in PARENTS:
        try:
            path.parent.rmdir()
        except OSError:
            pass  # another testbed's groups are still in it
    return True


class _Groups:
    """What both versions share: a group is a folder under netbench's parent in `root`."""

    parent = ""  # the parent folder netbench owns under the root
    version = 0

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, name: str) -> Path:
        return self.root / self.parent / name

    def add(self, name: str, pid: int) -> None:
        _write(self.path(name) / "cgroup.procs", str(pid))

    def remove(self, name: str) -> bool:
        return remove_group(self.path(name), self.root)

    def _throttled(self, name: str, time_key: str, scale: int) -> dict[str, int]:
        stat = _stat(self.path(name) / "cpu.stat")
        return {"nr_periods": stat.get("nr_periods", 0), "nr_throttled": stat.get("nr_throttled", 0),
                "throttled_us": stat.get(time_key, 0) // scale}


class V1Cgroups(_Groups):
    """cgroup v1's cpu controller: `<root>/netbench/<name>` with cpu.cfs_quota_us and
    cpu.cfs_period_us (-1: no quota)."""

    version = 1
    parent = V1_PARENT

    def __init__(self, root: Path = Path("/sys/fs/cgroup/cpu")) -> None:
        super().__init__(root)

    def create(self, name: str) -> Path:
        _mkdir(self.root / V1_PARENT)
        _mkdir(self.path(name))
        return self.path(name)

    def set_quota(self, name: str, quota: Quota) -> None:
        group = self.path(name)
        # v1 checks quota against the period in force: lift the quota, set the period, then the quota
        _write(group / "cpu.cfs_quota_us", "-1")
        _write(group / "cpu.cfs_period_us", str(quota.period_us))
        if quota.quota_us is not None:
            _write(group / "cpu.cfs_quota_us", str(quota.quota_us))

    def throttled(self, name: str) -> dict[str, int]:
        return self._throttled(name, "throttled_time", 1000)  # v1 counts nanoseconds

    def root_control(self) -> Path | None:
        return None  # v1's cpu hierarchy has its controller on every group


class V2Cgroups(_Groups):
    """cgroup v2: `<root>/netbench.slice/<name>` with cpu.max; the cpu controller enabled for
    the slice's children through the root's and the slice's cgroup.subtree_control."""

    version = 2
    parent = V2_PARENT

    def __init__(self, root: Path = Path("/sys/fs/cgroup")) -> None:
        super().__init__(root)

    def create(self, name: str) -> Path:
        parent = self.root / V2_PARENT
        self._enable_cpu(self.root)
        _mkdir(parent)
        self._enable_cpu(parent)
        _mkdir(self.path(name))
        return self.path(name)

    @staticmethod
    def _enable_cpu(group: Path) -> None:
        control = group / CONTROL
        try:
            enabled = control.read_text().split()
        except OSError:
            enabled = []
        if "cpu" not in enabled:
            _write(control, "+cpu")

    def set_quota(self, name: str, quota: Quota) -> None:
        _write(self.path(name) / "cpu.max", quota.cpu_max())

    def throttled(self, name: str) -> dict[str, int]:
        return self._throttled(name, "throttled_usec", 1)

    def root_control(self) -> Path | None:
        return self.root / CONTROL


def find_roots(mounts: str) -> tuple[Path | None, Path | None]:
    """(the cgroup2 mount, the v1 mount carrying the cpu controller) in /proc/self/mounts' text
    (pure); None where there is none."""
    v2 = v1 = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        where, kind, options = fields[1], fields[2], fields[3].split(",")
        if kind == "cgroup2" and v2 is None:
            v2 = Path(where)
        elif kind == "cgroup" and "cpu" in options and v1 is None:
            v1 = Path(where)
    return v2, v1


def detect(read_mounts: Callable[[], str] | None = None) -> Cgroups:
    """This machine's cgroups: v2 where its hierarchy offers the cpu controller, else v1's
    cpu controller; neither: TestbedError with a hint."""
    try:
        mounts = read_mounts() if read_mounts else MOUNTS.read_text()
    except OSError:
        mounts = ""
    v2, v1 = find_roots(mounts)
    if v2 is not None:
        try:
            if "cpu" in (v2 / "cgroup.controllers").read_text().split():
                return V2Cgroups(v2)
        except OSError:
            pass
    if v1 is not None:
        return V1Cgroups(v1)
    raise TestbedError("no cgroup hierarchy with the cpu controller on this machine", hint=HINT)


def group_name(node_netns: str) -> str:
    """A node's group: named after its namespace (netbench-n2), unique per testbed."""
    return node_netns


def _enabled(control: Path) -> bool:
    try:
        return "cpu" in control.read_text().split()
    except OSError:
        return False


def hold_cpu_controller(journal, control: Path, holds: Holds | None = None):
    """Before netbench enables the cpu controller in `control` (the v2 root's subtree_control):
    a journal entry (kind "cgroup-control") and a machine-wide hold, so that it is turned off
    again by the last netbench that relied on it, and never by one while another still does.
    None: the host had it on already (no netbench holds it): nothing to put back."""
    holds = holds or Holds()
    setting = f"cpu-controller:{control}"
    with holds.locked(setting):
        enabled = _enabled(control)
        if enabled and not holds.held(setting):
            return None
        hold = holds.new_id()
        entry = journal.record("cgroup-control", path=str(control), controller="cpu", hold=hold)
        holds.add(setting, hold)
        if not enabled:
            try:
                _write(control, "+cpu")
            except TestbedError:
                holds.remove(setting, hold)
                journal.done(entry)
                raise
        return entry


def release_cpu_controller(data: dict, warn: Callable[[str], None], holds: Holds | None = None) -> str | None:
    """Undo of a "cgroup-control" entry: the hold given up and, when no other running netbench
    holds it, the cpu controller turned off in that file again (where no group uses it now)."""
    control = Path(data["path"])
    if control.name != CONTROL:
        warn(f"{control} left alone: not a {CONTROL} file")
        return None
    holds = holds or Holds()
    setting = f"cpu-controller:{control}"
    with holds.locked(setting):
        holds.remove(setting, str(data.get("hold", "")))
        others = holds.others_live(setting)
        if others:
            warn(f"the cpu controller in {control} left on: {others} other netbench(s) still use it")
            return None
        holds.clear(setting)
        if not _enabled(control):
            return None
        try:
            _write(control, "-cpu")
        except TestbedError as exc:  # a group made since uses it (EBUSY): it stays
            warn(f"the cpu controller in {control} left on: {exc.message}")
            return None
    return f"cpu controller in {control} (off again)"


class NodeGroups:
    """The groups of a sweep's limited nodes: each journaled before it is made, its quota set
    per point, all removed by `remove_all` (and by reset after a crash); on v2, the root's cpu
    controller held while they exist (`hold_cpu_controller`)."""

    def __init__(self, journal, cgroups: Cgroups) -> None:
        self.journal, self.cgroups = journal, cgroups
        self.entries: dict[str, object] = {}  # group name -> its journal entry
        self.control: object | None = None  # the journal entry of the root's cpu controller, if held

    def create(self, name: str) -> Path:
        """The group (journaled first); the file a child writes its pid into to join it."""
        if name not in self.entries:
            control = getattr(self.cgroups, "root_control", lambda: None)()
            if control is not None and self.control is None:
                self.control = hold_cpu_controller(self.journal, control)
            self.entries[name] = self.journal.record("cgroup", path=str(self.cgroups.path(name)),
                                                     root=str(self.cgroups.root), version=self.cgroups.version)
            self.cgroups.create(name)
        return self.cgroups.path(name) / "cgroup.procs"

    def limit(self, name: str, cpus: float | None) -> None:
        self.cgroups.set_quota(name, quota_plan(cpus))

    def remove_all(self) -> list[str]:
        """Remove every group; what could not be is left journaled for reset (its message back)."""
        problems = []
        for name, entry in list(self.entries.items()):
            try:
                self.cgroups.remove(name)
            except TestbedError as exc:
                problems.append(exc.message)
                continue
            self.journal.done(entry)
            del self.entries[name]
        if not self.entries and self.control is not None:
            problems += self._release_control()
        return problems

    def _release_control(self) -> list[str]:
        said: list[str] = []
        try:
            release_cpu_controller(self.control.data, said.append)
        except (OSError, TestbedError) as exc:
            return [f"cpu controller: {getattr(exc, 'message', exc)}"]  # left journaled for reset
        self.journal.done(self.control)
        self.control = None
        return []


def cores() -> int:
    """The cores this process (and so a node's processes) may run on: its cpuset."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def own_v2_group(read_mounts: Callable[[], str] | None = None, read_self: Callable[[], str] | None = None) -> Path | None:
    """The cgroup v2 folder this process is in (from /proc/self/cgroup's "0::" line), or None
    where v2 is not mounted."""
    try:
        mounts = read_mounts() if read_mounts else MOUNTS.read_text()
        lines = read_self() if read_self else Path("/proc/self/cgroup").read_text()
    except OSError:
        return None
    v2, _ = find_roots(mounts)
    for line in lines.splitlines():
        if line.startswith("0::") and v2 is not None:
            return v2 / line[3:].lstrip("/")
    return None


def delegated_v2() -> Path | None:
    """This process's own cgroup v2 folder where it may make CPU-limit groups without root:
    one delegated to its user (systemd's Delegate=yes) that offers the cpu controller; else None."""
    group = own_v2_group()
    if group is None:
        return None
    try:
        offers_cpu = "cpu" in (group / "cgroup.controllers").read_text().split()
    except OSError:
        return None
    writable = os.access(group, os.W_OK) and os.access(group / "cgroup.subtree_control", os.W_OK)
    return group if offers_cpu and writable else None


def cpu_on_v1(read_mounts: Callable[[], str] | None = None) -> bool:
    """Whether this host's cpu controller is on a cgroup v1 hierarchy (v2 does not offer it)."""
    try:
        return isinstance(detect(read_mounts), V1Cgroups)
    except TestbedError:
        return False
