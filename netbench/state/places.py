"""Where a testbed's state lives and what its privilege is (pure: every function takes the
environment it reads).

A *testbed* is a set of network namespaces with one state folder (its journal, lock, engine
sockets and step-delay files). Several can be up on one machine at once:

* root's default testbed: state in /run/netbench, namespaces in /run/netns (seen by `ip netns`);
* a *sandbox*: a testbed held in a mount namespace of its own (and, without root, a user
  namespace of its own: testbed/sandbox.py), its namespaces bound under its state folder
  (``<state>/netns``), invisible to everyone else and gone with its last process. Root gets one
  when its default testbed is busy; a user without root always works in one.

The base folder holds the default testbed's state and the others under ``testbeds/<id>``:
/run/netbench for root; for a user, ``$XDG_RUNTIME_DIR/netbench`` (gone at logout, like
/run), else the user's cache folder (``$XDG_CACHE_HOME/netbench``, ``~/.cache/netbench``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

ROOT_BASE = Path("/run/netbench")
HOST_NETNS_DIR = Path("/run/netns")
STATE_ENV = "NETBENCH_STATE_DIR"
NETNS_DIR_ENV = "NETBENCH_NETNS_DIR"  # where this testbed's namespaces are bound (a sandbox's own)
SANDBOX_ENV = "NETBENCH_SANDBOX"  # set inside a sandbox: its id
PRIVILEGE_ENV = "NETBENCH_PRIVILEGE"  # set inside a sandbox: root or rootless
TESTBEDS = "testbeds"
ROOT, ROOTLESS = "root", "rootless"
_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")


def base_dir(env: Mapping[str, str], euid: int, home: str | None = None) -> Path:
    """The folder of this user's testbeds: /run/netbench for root, else the runtime folder or
    the cache folder (see the module docstring)."""
    if euid == 0:
        return ROOT_BASE
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_absolute():
        return Path(runtime) / "netbench"
    cache = env.get("XDG_CACHE_HOME")
    if cache and Path(cache).is_absolute():
        return Path(cache) / "netbench"
    return Path(home or env.get("HOME") or "/nonexistent") / ".cache" / "netbench"


def state_dir(env: Mapping[str, str], euid: int) -> Path:
    """This process's testbed state folder: NETBENCH_STATE_DIR when set (a sandbox sets it; so
    do tests), else the base folder (the default testbed's)."""
    given = env.get(STATE_ENV)
    return Path(given) if given else base_dir(env, euid)


def netns_dir(env: Mapping[str, str]) -> Path:
    """Where this testbed's network namespaces are bound: a sandbox's own folder, else /run/netns."""
    given = env.get(NETNS_DIR_ENV)
    return Path(given) if given else HOST_NETNS_DIR


def testbed_dir(base: Path, testbed_id: str) -> Path:
    """The state folder of testbed `testbed_id` (not the default one)."""
    if not _ID.fullmatch(testbed_id):
        raise ValueError(f"not a testbed id: {testbed_id!r}")
    return base / TESTBEDS / testbed_id


def new_testbed_id(pid: int, started: int | None) -> str:
    """A testbed id no other testbed of this machine has: its maker's pid and start time."""
    return f"{pid}-{started or 0}"


def sandbox_netns_dir(state: Path) -> Path:
    return state / "netns"


def privilege(env: Mapping[str, str], euid: int) -> str:
    """ROOT for root on the host (or in a sandbox root made), ROOTLESS for a user's sandbox (or
    a user outside any)."""
    said = env.get(PRIVILEGE_ENV)
    if said in (ROOT, ROOTLESS):
        return said
    return ROOT if euid == 0 else ROOTLESS


def outside_uid(uid_map: str) -> int | None:
    """The host uid that uid 0 of this user namespace is, from /proc/self/uid_map; None when
    uid 0 is the host's own root (the initial namespace maps 0 to 0) or is not mapped."""
    for line in uid_map.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0] == "0":
            outside = int(fields[1])
            return None if outside == 0 else outside
    return None
