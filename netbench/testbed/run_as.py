"""Whose job processes run: never root unless asked for.

Run with sudo, netbench keeps root for itself (namespaces, qdiscs, engines, groups) and starts
every job process (the built-in workers, their calibrations, a user's command and whatever it
starts) as the user who ran sudo (SUDO_UID, SUDO_GID), or as `--run-as USER`; `--run-as root`
keeps them root, as a root shell without sudo does (there is no one else to run them as). A
user without root runs everything as themselves: their sandbox's uid 0 is their own uid.

`choose` decides (pure, given the lookups); `RunAs.argv` is the exec wrapper proc.spawn puts
in front of a job's command, after it has entered the node's namespace and group, which need
root.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import Callable, Mapping

from netbench.errors import UsageError

ROOT_NAME = "root"


@dataclass(frozen=True)
class RunAs:
    """The user job processes run as (not root)."""

    uid: int
    gid: int
    name: str
    home: str
    why: str = ""  # how it was chosen: "sudo", "--run-as"

    def argv(self) -> list[str]:
        """setpriv's arguments that drop to this user and their groups for what it execs."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups", "--"]

    def env(self) -> dict[str, str]:
        """The variables a process of this user expects (its home for framework caches)."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}

    def to_json(self) -> dict:
        return {"user": self.name, "uid": self.uid, "gid": self.gid, "why": self.why}


def _lookup(name_or_uid: str) -> pwd.struct_passwd:
    if name_or_uid.isdigit():
        return pwd.getpwuid(int(name_or_uid))
    return pwd.getpwnam(name_or_uid)


def choose(flag: str | None, privileged: bool, own_uid: int, env: Mapping[str, str],
           lookup: Callable[[str], pwd.struct_passwd] = _lookup) -> RunAs | None:
    """Whom job processes run as: None for this process's own user (`privileged` False: a user
    without root, whose sandbox runs everything as them; root asked to with --run-as root; a
    root shell with no sudo behind it); else the RunAs. A --run-as that cannot be honoured is a
    UsageError naming the flag. `own_uid`: this user's uid on the host."""
    def user(name: str) -> pwd.struct_passwd:
        try:
            return lookup(name)
        except KeyError:
            raise UsageError(f"flag --run-as: no user {name!r} on this host") from None

    if not privileged:
        if flag is not None and user(flag).pw_uid != own_uid:
            raise UsageError("flag --run-as: only root can run jobs as another user",
                             hint="without root every job process runs as you")
        return None
    if flag is not None:
        if flag in (ROOT_NAME, "0"):
            return None
        asked = user(flag)
        return None if asked.pw_uid == 0 else RunAs(asked.pw_uid, asked.pw_gid, asked.pw_name, asked.pw_dir,
                                                     "--run-as")
    sudo_uid = env.get("SUDO_UID", "")
    if sudo_uid.isdigit() and int(sudo_uid) != 0:
        try:
            invoker = lookup(sudo_uid)
        except KeyError:  # a user with no passwd entry: its ids, and no home of its own
            gid = env.get("SUDO_GID", "")
            return RunAs(int(sudo_uid), int(gid) if gid.isdigit() else int(sudo_uid),
                         env.get("SUDO_USER", sudo_uid), "/", "sudo")
        gid = int(env["SUDO_GID"]) if env.get("SUDO_GID", "").isdigit() else invoker.pw_gid
        return RunAs(invoker.pw_uid, gid, invoker.pw_name, invoker.pw_dir, "sudo")
    return None


def for_this_command(flag: str | None) -> RunAs | None:
    """`choose` for this process: root on the host is privileged; a user's sandbox is not."""
    from netbench.state import places
    from netbench.testbed.sandbox import owner_uid

    privileged = os.geteuid() == 0 and places.privilege(os.environ, os.geteuid()) == places.ROOT
    return choose(flag, privileged, owner_uid(), os.environ)


def describe(run_as: RunAs | None, privileged: bool) -> str:
    """The sweep's line about whose processes the jobs are."""
    if run_as is not None:
        via = "the user who ran sudo" if run_as.why == "sudo" else "as asked: --run-as"
        return f"job processes run as {run_as.name} (uid {run_as.uid}, {via}); netbench keeps root for the network"
    if privileged:
        return ("job processes run as root (a root shell with no sudo behind it, or --run-as root); "
                "--run-as USER runs them as another user")
    return "job processes run as you: without root, netbench holds its testbed in a sandbox of your own"


def check_usable(run_as: RunAs, python: str, pythonpath: str) -> None:
    """Refuse, before anything starts, a user who cannot run this netbench's Python and import
    it (a venv under root's home, say): one line naming the user and the fix."""
    import subprocess

    argv = run_as.argv() + ["env", f"PYTHONPATH={pythonpath}", *[f"{k}={v}" for k, v in run_as.env().items()],
                            python, "-c", "import netbench.jobs.events"]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"job processes run as {run_as.name}, who cannot start {python}: {exc}",
                         hint="--run-as root runs them as root") from None
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        raise UsageError(f"job processes run as {run_as.name}, who cannot run this netbench ({python}): "
                         f"{lines[-1] if lines else result.returncode}",
                         hint=f"install netbench where {run_as.name} can read it, or --run-as root "
                              "to run the jobs as root")
