"""Without root: where state lives, what a host withholds, whom jobs run as, which testbed a
command takes, and a reset of sandboxes (state/places.py, testbed/rootless.py, run_as.py,
sandbox.py), with the exec into a sandbox faked."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netbench import proc
from netbench.errors import PrivilegeError, TestbedError, UsageError
from netbench.model import congestion as cc
from netbench.state import places
from netbench.state.journal import Journal
from netbench.testbed import rootless, run_as, sandbox, sandboxes
from netbench.testbed.sandbox import _others_up as others_up  # the real one (tests/unit/conftest.py fakes it)


# ---------------------------------------------------------------- places (pure)

def test_a_users_testbeds_live_in_their_runtime_folder_else_their_cache():
    assert places.base_dir({}, 0) == Path("/run/netbench")
    assert places.base_dir({"XDG_RUNTIME_DIR": "/run/user/1000"}, 1000) == Path("/run/user/1000/netbench")
    assert places.base_dir({"XDG_CACHE_HOME": "/h/c", "HOME": "/h"}, 1000) == Path("/h/c/netbench")
    assert places.base_dir({"HOME": "/home/ann"}, 1000) == Path("/home/ann/.cache/netbench")
    assert places.base_dir({"XDG_RUNTIME_DIR": "relative", "HOME": "/home/ann"}, 1000) == \
        Path("/home/ann/.cache/netbench")  # a relative folder is no place for a journal
    assert places.state_dir({"NETBENCH_STATE_DIR": "/tmp/s"}, 1000) == Path("/tmp/s")
    assert places.netns_dir({}) == Path("/run/netns")
    assert places.netns_dir({places.NETNS_DIR_ENV: "/x/netns"}) == Path("/x/netns")


def test_testbed_ids_name_their_maker_and_nothing_else():
    assert places.testbed_dir(Path("/b"), places.new_testbed_id(12, 345)) == Path("/b/testbeds/12-345")
    for bad in ("../x", "", "a/b", "X" * 40):
        with pytest.raises(ValueError):
            places.testbed_dir(Path("/b"), bad)


def test_the_privilege_a_sandbox_says_wins_over_its_uid_0():
    assert places.privilege({}, 0) == places.ROOT and places.privilege({}, 1000) == places.ROOTLESS
    assert places.privilege({places.PRIVILEGE_ENV: "rootless"}, 0) == places.ROOTLESS
    assert places.outside_uid("         0       1001          1\n") == 1001
    assert places.outside_uid("         0          0 4294967295\n") is None


# ---------------------------------------------------------------- what a host withholds (pure)

def _names(readings: rootless.Readings) -> dict[str, bool]:
    return {limit.what: limit.blocks for limit in rootless.limits(readings)}


def test_each_setting_that_withholds_something_is_named_with_its_fix():
    open_host = rootless.Readings(userns_clone="1", max_user_namespaces="15000", netem_loaded=True,
                                  cgroup_v2_delegated=True, allowed_cc=("reno", "cubic"))
    # --cpus is withheld everywhere without root (a delegated v2 subtree is not used yet), never blocking
    assert _names(open_host) == {"--cpus": False}
    assert _names(rootless.Readings(userns_clone="0", max_user_namespaces="15000", netem_loaded=True,
                                    cgroup_v2_delegated=True, allowed_cc=("cubic",))) == \
        {"kernel.unprivileged_userns_clone": True, "--cpus": False}
    assert _names(rootless.Readings(max_user_namespaces="0", netem_loaded=True, cgroup_v2_delegated=True,
                                    allowed_cc=("cubic",))) == {"user.max_user_namespaces": True, "--cpus": False}
    assert _names(rootless.Readings(apparmor_restrict="1", netem_loaded=True, cgroup_v2_delegated=True,
                                    allowed_cc=("cubic",))) == {"kernel.apparmor_restrict_unprivileged_userns": True,
                                                                "--cpus": False}
    this_host = _names(rootless.Readings(netem_loaded=False, cgroup_v1=True, allowed_cc=("reno", "bbr")))
    assert this_host == {"sch_netem": False, "cgroup v1": False, "net.ipv4.tcp_allowed_congestion_control": False}
    assert _names(rootless.Readings(netem_loaded=True, allowed_cc=("cubic",))) == {"--cpus": False}
    fixes = {limit.what: limit.fix for limit in rootless.limits(rootless.Readings(userns_clone="0"))}
    assert fixes["kernel.unprivileged_userns_clone"] == "as root: sysctl -w kernel.unprivileged_userns_clone=1"
    assert fixes["--cpus"] == "run as root for --cpus (--step-delay needs no root)"


def test_a_congestion_control_outside_the_allowed_list_is_refused_without_root():
    assert cc.rootless_refusal("bbr", ["reno", "bbr"]) is None
    assert "not in the host's allowed list (reno bbr)" in cc.rootless_refusal("cubic", ["reno", "bbr"])
    assert cc.rootless_choice(None, ["reno", "cubic"]) == ("cubic", True)
    assert cc.rootless_choice(None, ["reno", "bbr"]) == (None, False)  # the host's default, said so
    assert cc.rootless_choice("host", ["cubic"]) == (None, False)


# ---------------------------------------------------------------- whom jobs run as (pure)

def _passwd(name: str, uid: int, gid: int, home: str) -> pwd.struct_passwd:
    return pwd.struct_passwd((name, "x", uid, gid, "", home, "/bin/sh"))


USERS = {"ann": _passwd("ann", 1000, 1000, "/home/ann"), "1000": _passwd("ann", 1000, 1000, "/home/ann"),
         "root": _passwd("root", 0, 0, "/root"), "bob": _passwd("bob", 1001, 100, "/home/bob")}


def _lookup(name: str) -> pwd.struct_passwd:
    return USERS[name]


def test_with_sudo_jobs_run_as_the_user_who_ran_it_never_as_root():
    chosen = run_as.choose(None, True, 0, {"SUDO_UID": "1000", "SUDO_GID": "1000"}, _lookup)
    assert (chosen.uid, chosen.gid, chosen.name, chosen.home, chosen.why) == (1000, 1000, "ann", "/home/ann", "sudo")
    assert run_as.choose("bob", True, 0, {"SUDO_UID": "1000"}, _lookup).name == "bob"
    assert run_as.choose("root", True, 0, {"SUDO_UID": "1000"}, _lookup) is None  # only when asked for
    assert run_as.choose(None, True, 0, {}, _lookup) is None  # a root shell: nobody else to run them as
    with pytest.raises(UsageError, match="flag --run-as: no user 'eve'"):
        run_as.choose("eve", True, 0, {}, _lookup)


def test_without_root_jobs_run_as_you_and_another_user_is_refused():
    assert run_as.choose(None, False, 1000, {}, _lookup) is None
    assert run_as.choose("ann", False, 1000, {}, _lookup) is None
    with pytest.raises(UsageError, match="only root can run jobs as another user"):
        run_as.choose("bob", False, 1000, {}, _lookup)


def test_a_job_enters_its_namespace_and_group_as_root_then_drops_to_the_user():
    user = run_as.RunAs(1000, 1000, "ann", "/home/ann", "sudo")
    argv = proc.child_argv(["python", "-m", "job"], "netbench-n1", True, parent_pid=42,
                           cgroup="/sys/fs/cgroup/x/cgroup.procs", run_as=user)
    joined = " ".join(argv)
    assert joined.index("netbench-cgroup") < joined.index("nsenter") < joined.index("setpriv")
    setpriv = argv[argv.index("setpriv"):]
    assert setpriv[:4] == ["setpriv", "--reuid=1000", "--regid=1000", "--init-groups"]
    assert setpriv[4:7] == ["--pdeathsig", "KILL", "--"]  # set after the change of user, which clears it
    assert argv[-3:] == ["python", "-m", "job"] and "42" in argv
    assert user.env() == {"HOME": "/home/ann", "USER": "ann", "LOGNAME": "ann"}


# ---------------------------------------------------------------- which testbed a command takes

class Taken(Exception):
    """What take_testbed would have executed, raised instead of the exec."""


@pytest.fixture
def world(monkeypatch, tmp_path):
    """A user (or root) with no sandbox entered; every exec and keeper start recorded, none made."""
    calls = []
    monkeypatch.delenv(places.SANDBOX_ENV, raising=False)
    monkeypatch.delenv(places.STATE_ENV, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(rootless, "refusal", lambda: None)
    monkeypatch.setattr(sandbox, "_lock_free", lambda state: True)
    monkeypatch.setattr(sandbox, "_others_up", lambda state: False)
    monkeypatch.setattr(sandbox, "keeper", lambda state: None)

    def private(base, privilege, argv):
        calls.append(("private", privilege))
        raise Taken

    def enter(holder, state, argv):
        calls.append(("enter", holder.id))
        raise Taken

    def start(state, privilege):
        calls.append(("keeper", privilege))
        return sandbox.Holder(id="default", kind=sandbox.KEEPER, privilege=privilege, pid=1, start=1, uid=1000,
                              created=0.0)

    monkeypatch.setattr(sandbox, "enter_private", private)
    monkeypatch.setattr(sandbox, "enter", enter)
    monkeypatch.setattr(sandbox, "start_keeper", start)
    return calls


def _take(use: str, calls) -> list:
    try:
        sandbox.take_testbed(use, ["sweep"])
    except Taken:
        pass
    return list(calls)


def _as(monkeypatch, euid: int) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: euid)


def test_root_keeps_its_default_testbed_and_a_busy_one_sends_a_sweep_to_a_sandbox(world, monkeypatch):
    _as(monkeypatch, 0)
    for use in (sandbox.UP, sandbox.USES, sandbox.SWEEPS, sandbox.SHOWS):
        assert _take(use, world) == []
    monkeypatch.setattr(sandbox, "_lock_free", lambda state: False)
    assert _take(sandbox.USES, world) == []  # the testbed that is up: its lock says who waits
    assert _take(sandbox.SWEEPS, world) == [("private", places.ROOT)]
    world.clear()
    monkeypatch.setattr(sandbox, "_lock_free", lambda state: True)
    monkeypatch.setattr(sandbox, "_others_up", lambda state: True)  # /run/netns holds another folder's testbed
    assert _take(sandbox.SWEEPS, world) == [("private", places.ROOT)]


def test_root_s_default_testbed_is_its_own_only_when_its_journal_made_it(tmp_path, monkeypatch):
    from netbench.testbed import netns as local

    monkeypatch.setattr(local, "list_netbench_netns", lambda: ["netbench-n1", "netbench-sw"])
    assert others_up(tmp_path)  # nothing journaled here: another state folder's
    journal = Journal(tmp_path)
    for name in ("netbench-sw", "netbench-n1"):
        journal.record("netns", name=name)
    assert not others_up(tmp_path)
    monkeypatch.setattr(local, "list_netbench_netns", lambda: [])
    assert not Journal(tmp_path / "empty").pending() and not others_up(tmp_path / "empty")


def test_a_user_gets_a_keeper_for_testbed_up_and_a_sandbox_for_a_sweep(world, monkeypatch):
    _as(monkeypatch, 1000)
    assert _take(sandbox.SWEEPS, world) == [("private", places.ROOTLESS)]
    world.clear()
    assert _take(sandbox.UP, world) == [("keeper", places.ROOTLESS), ("enter", "default")]
    world.clear()
    with pytest.raises(TestbedError, match="no testbed is up"):
        sandbox.take_testbed(sandbox.USES, ["apply"])
    assert _take(sandbox.SHOWS, world) == []  # nothing to show: no error


def test_a_users_sweep_uses_the_testbed_that_is_up_unless_it_is_busy(world, monkeypatch):
    _as(monkeypatch, 1000)
    kept = sandbox.Holder(id="default", kind=sandbox.KEEPER, privilege=places.ROOTLESS, pid=1, start=1, uid=1000,
                          created=0.0)
    monkeypatch.setattr(sandbox, "keeper", lambda state: kept)
    assert _take(sandbox.SWEEPS, world) == [("enter", "default")]
    world.clear()
    monkeypatch.setattr(sandbox, "_lock_free", lambda state: False)
    assert _take(sandbox.SWEEPS, world) == [("private", places.ROOTLESS)]  # two testbeds at once
    world.clear()
    assert _take(sandbox.USES, world) == [("enter", "default")]  # apply waits on the lock inside


def test_a_host_without_user_namespaces_is_refused_naming_the_setting(world, monkeypatch):
    _as(monkeypatch, 1000)
    monkeypatch.setattr(rootless, "refusal", lambda: rootless.Limit(
        "kernel.unprivileged_userns_clone", "unprivileged user namespaces are off", "as root: sysctl -w x=1", True))
    with pytest.raises(PrivilegeError) as caught:
        sandbox.take_testbed(sandbox.SWEEPS, ["sweep"])
    assert "(kernel.unprivileged_userns_clone)" in caught.value.message and caught.value.hint == "as root: sysctl -w x=1"
    assert world == []


def test_inside_a_sandbox_a_command_stays_where_it_is(world, monkeypatch, tmp_path):
    _as(monkeypatch, 0)
    monkeypatch.setenv(places.SANDBOX_ENV, "1-2")
    monkeypatch.setenv(places.STATE_ENV, str(tmp_path / "sb"))
    assert _take(sandbox.SWEEPS, world) == [] and _take(sandbox.USES, world) == []


# ---------------------------------------------------------------- reset and listing

def _dead_pid() -> tuple[int, int | None]:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start = proc.start_time(child.pid)
    child.wait()
    return child.pid, start


def _sandbox(base: Path, holder_id: str, pid: int, start: int | None, kind: str = sandbox.SWEEP) -> Path:
    state = places.testbed_dir(base, holder_id)
    places.sandbox_netns_dir(state).mkdir(parents=True)
    (places.sandbox_netns_dir(state) / "netbench-n1").touch()  # a mount point whose namespace is gone
    sandbox.write_holder(state, sandbox.Holder(id=holder_id, kind=kind, privilege=places.ROOTLESS, pid=pid,
                                               start=start, uid=os.getuid(), created=time.time(),
                                               command="netbench sweep"))
    return state


def test_reset_removes_a_dead_sandbox_and_leaves_one_in_use(tmp_path, monkeypatch):
    base = tmp_path / "base"
    pid, start = _dead_pid()
    dead = _sandbox(base, "1-1", pid, start)
    journal = Journal(dead)
    journal.record("netns", name="netbench-n1")  # never looked up on the host: another testbed's name
    journal.record("process", pid=pid, start=start, netns="netbench-n1", role="worker0")
    removed_names = []
    monkeypatch.setattr("netbench.testbed.netns.remove_netns", lambda name: removed_names.append(name) or True)
    busy = _sandbox(base, "2-2", os.getpid(), proc.start_time(os.getpid()))
    warnings = []
    lines = sandboxes.reset_sandboxes(base, warnings.append, include_default=False)
    assert not dead.exists() and busy.exists() and removed_names == []
    assert lines == [f"state folder {dead}"]
    assert warnings == [f"testbed 2-2 left alone: in use by pid {os.getpid()} (netbench sweep); stop it first"]
    rows = sandboxes.listing([base])
    assert [(row["id"], row["kind"], row["alive"]) for row in rows] == [("2-2", "sweep", True)]
    assert sandboxes.listing([base], skip=busy) == []


def test_a_keepers_default_testbed_keeps_its_folder_but_not_its_files(tmp_path):
    base = tmp_path / "base"
    places.sandbox_netns_dir(base).mkdir(parents=True)
    pid, start = _dead_pid()
    sandbox.write_holder(base, sandbox.Holder(id="default", kind=sandbox.KEEPER, privilege=places.ROOTLESS,
                                              pid=pid, start=start, uid=os.getuid(), created=0.0))
    (base / sandbox.KEEPER_LOG).touch()
    assert sandboxes.reset_sandboxes(base, lambda line: None, include_default=False) == []  # root's: not a sandbox
    assert sandboxes.reset_sandboxes(base, lambda line: None, include_default=True) == ["testbed default"]
    assert base.is_dir() and not (base / sandbox.HOLDER_FILE).exists() and not (base / "netns").exists()
    assert not (base / sandbox.KEEPER_LOG).exists()


def test_without_root_a_name_a_root_sweep_added_to_the_allowed_list_is_not_counted_on(tmp_path, monkeypatch):
    # a root sweep beside widens the host's list by cubic for its own run and holds it: a sandbox
    # without root must neither rely on it (it goes when that sweep ends) nor try to hold it
    from netbench.state.holds import Holds
    from netbench.testbed import congestion
    from netbench.testbed import netns as local

    holds = Holds(tmp_path / "holds")
    monkeypatch.setattr(local, "read_sysctl", lambda key, name=None: "reno bbr cubic")
    assert congestion.allowed(holds) == ["reno", "bbr", "cubic"]
    holds.add(cc.allowed_setting("cubic"), holds.new_id())
    assert congestion.allowed(holds) == ["reno", "bbr"]
    monkeypatch.setenv(places.PRIVILEGE_ENV, places.ROOTLESS)
    values = {None: "reno bbr", "netbench-n1": "bbr"}  # the host's list; the node's default
    monkeypatch.setattr(local, "read_sysctl", lambda key, name=None: values[name])
    monkeypatch.setattr(local, "write_sysctl", lambda key, value, name=None: values.__setitem__(name, value))
    node = type("Node", (), {"name": "n1", "netns": "netbench-n1"})()
    congestion.set_on_nodes(Journal(tmp_path / "state"), [node], "reno", holds)
    assert values == {None: "reno bbr", "netbench-n1": "reno"}  # the node's only: the host's list as it was
    assert not holds.held(cc.allowed_setting("reno"))


def test_a_dead_sandboxs_recycled_mount_namespace_inode_is_not_the_sandbox():
    # the kernel reuses a namespace's inode number as soon as the namespace is gone: after a
    # kill -9, the next `unshare --mount` (the user's reset itself ran in one) got the sandbox's
    # number, and reset took it for the sandbox and stopped it (SIGTERM to the reset)
    pid, start = _dead_pid()
    holder = sandbox.Holder(id="7-7", kind=sandbox.SWEEP, privilege=places.ROOTLESS, pid=pid, start=start,
                            uid=os.getuid(), created=0.0, mntns=4026532242)
    inodes = {"100": 4026532242, "101": 4026532242, "102": 4026531832, str(os.getpid()): 4026532242}
    environs = {"100": b"HOME=/x\0NETBENCH_SANDBOX=7-7\0", "101": b"HOME=/x\0NETBENCH_SANDBOX=8-8\0",
                "102": b"NETBENCH_SANDBOX=7-7\0", str(os.getpid()): b"NETBENCH_SANDBOX=7-7\0"}
    found = sandboxes.processes_in(holder, list(inodes), inodes.get, lambda p: environs.get(p, b""))
    assert found == [100]  # in that namespace and started inside the sandbox; never this process
    alive = sandbox.Holder(**{**holder.to_json(), "pid": os.getpid(), "start": proc.start_time(os.getpid())})
    # while the holder lives its namespace (and inode) is pinned: whatever is in it is inside
    assert sandboxes.processes_in(alive, list(inodes), inodes.get, lambda p: b"") == [100, 101]


def test_without_root_a_cpu_limit_is_refused_in_one_line_naming_the_flag(monkeypatch):
    from netbench.emulation import cgroups
    from netbench.errors import UsageError
    from netbench.testbed import compute

    monkeypatch.setenv(places.PRIVILEGE_ENV, places.ROOTLESS)
    monkeypatch.setattr(cgroups, "cpu_on_v1", lambda: False)
    monkeypatch.setattr(cgroups, "delegated_v2", lambda: None)
    with pytest.raises(UsageError) as err:
        compute.refuse_without_root()
    assert err.value.message == ("flag --cpus: CPU limits (--cpus) are refused: this netbench does not yet make its "
                                 "groups in a cgroup v2 subtree delegated to a user (and none is delegated to you)")
    assert err.value.hint == "run as root for --cpus (--step-delay needs no root)"
    monkeypatch.setattr(cgroups, "cpu_on_v1", lambda: True)
    with pytest.raises(UsageError, match="cgroup v1, which only root may divide"):
        compute.refuse_without_root()
    monkeypatch.setenv(places.PRIVILEGE_ENV, places.ROOT)
    compute.refuse_without_root()  # root: nothing to refuse


def test_a_command_that_drops_to_the_user_itself_is_tied_to_the_controller_after_the_drop():
    # a user command's node setup runs as root, then the command drops to the user: the death
    # signal the drop clears is set again, and sh checks the controller was still there then
    user = run_as.RunAs(1000, 1000, "ann", "/home/ann", "sudo")
    assert proc.user_argv(user, ["python", "train.py"], 42) == [
        "setpriv", "--reuid=1000", "--regid=1000", "--init-groups", "--pdeathsig", "KILL", "--",
        "sh", "-c", proc._PARENT_CHECK, "netbench-child", "42", "python", "train.py"]
    assert proc.user_argv(user, ["python"], None) == ["setpriv", "--reuid=1000", "--regid=1000", "--init-groups",
                                                      "--", "python"]
