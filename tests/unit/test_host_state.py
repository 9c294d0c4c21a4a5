"""What netbench changes on the host beyond its testbed, and puts back (issue 38): the cpu
controller in the cgroup v2 root's subtree_control (journaled, held machine-wide, turned off by
the last netbench that relied on it), the processes a removed group still held (ended, never
moved to the root group), and the state folder's step-delay files (gone after reset).

The cgroup adapters run against a folder of files; `kernel` below gives its subtree_control
files the kernel's semantics ("+cpu" and "-cpu" change the set a read shows; "-cpu" is refused
while a child group has it on), and a group folder the kernel's rmdir (EBUSY while a process
is in it)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from pyroute2 import netns as pnetns

from netbench.emulation import cgroups as cg
from netbench.errors import TestbedError
from netbench.state.journal import Journal
from netbench.state.reset import reset


@pytest.fixture
def kernel(monkeypatch):
    """subtree_control files with the kernel's "+cpu"/"-cpu" semantics; every write recorded."""
    writes: list[tuple[str, str]] = []
    real_write = cg._write

    def write(path: Path, text: str) -> None:
        writes.append((str(path), text))
        if path.name != cg.CONTROL:
            return real_write(path, text)
        now = set(path.read_text().split()) if path.exists() else set()
        sign, name = text[0], text[1:]
        if sign == "-" and any(name in (child / cg.CONTROL).read_text().split()
                               for child in path.parent.iterdir() if (child / cg.CONTROL).exists()):
            raise TestbedError(f"cannot write {text!r} to {path}: Device or resource busy")
        now = now | {name} if sign == "+" else now - {name}
        path.write_text(" ".join(sorted(now)))

    monkeypatch.setattr(cg, "_write", write)
    monkeypatch.setattr(pnetns, "listnetns", lambda *a, **k: [])
    return writes


def _root(tmp_path: Path, controllers: str = "memory") -> Path:
    root = tmp_path / "sys"
    root.mkdir()
    (root / cg.CONTROL).write_text(controllers)
    return root


def _enabled(root: Path) -> set[str]:
    return set((root / cg.CONTROL).read_text().split())


def test_the_cpu_controller_netbench_turns_on_in_the_root_is_journaled_first_and_turned_off_after(kernel, tmp_path):
    root = _root(tmp_path)
    journal = Journal(tmp_path / "state")
    groups = cg.NodeGroups(journal, cg.V2Cgroups(root))
    seen: list = []
    write = cg._write
    cg._write = lambda path, text: (seen.append((path.name, text, [e.kind for e in journal.pending()])),
                                    write(path, text))[1]
    try:
        groups.create("netbench-n2")
    finally:
        cg._write = write
    assert seen[0] == (cg.CONTROL, "+cpu", ["cgroup-control"])  # journaled before it was turned on
    assert [e.kind for e in journal.pending()] == ["cgroup-control", "cgroup"]
    assert _enabled(root) == {"cpu", "memory"}
    (root / cg.V2_PARENT / cg.CONTROL).unlink()  # the slice goes with its last group (kernel)
    assert groups.remove_all() == []
    assert _enabled(root) == {"memory"} and journal.pending() == []


def test_reset_turns_the_cpu_controller_off_after_a_crash(kernel, tmp_path):
    root = _root(tmp_path)
    journal = Journal(tmp_path / "state")
    cg.NodeGroups(journal, cg.V2Cgroups(root)).create("netbench-n2")  # then the controller is killed
    (root / cg.V2_PARENT / cg.CONTROL).unlink()
    removed = reset(journal)
    assert f"cpu controller in {root / cg.CONTROL} (off again)" in removed, removed
    assert _enabled(root) == {"memory"} and journal.pending() == [] and reset(journal) == []


def test_two_sweeps_with_cpu_limits_at_once_keep_the_controller_until_the_last_is_done(kernel, tmp_path):
    root = _root(tmp_path)
    first = cg.NodeGroups(Journal(tmp_path / "a"), cg.V2Cgroups(root))
    second = cg.NodeGroups(Journal(tmp_path / "b"), cg.V2Cgroups(root))
    first.create("netbench-a-n2")
    second.create("netbench-b-n2")
    assert second.control is not None  # it relies on it too: held, though it was on already
    assert first.remove_all() == []
    assert "cpu" in _enabled(root)  # the other sweep's group still needs it
    (root / cg.V2_PARENT / cg.CONTROL).unlink()  # the slice goes with its last group (kernel)
    assert second.remove_all() == []
    assert _enabled(root) == {"memory"}


def test_a_controller_the_host_had_on_is_never_journaled_nor_turned_off(kernel, tmp_path):
    root = _root(tmp_path, "cpu memory")
    journal = Journal(tmp_path / "state")
    groups = cg.NodeGroups(journal, cg.V2Cgroups(root))
    groups.create("netbench-n2")
    assert [e.kind for e in journal.pending()] == ["cgroup"] and groups.control is None
    (root / cg.V2_PARENT / cg.CONTROL).unlink()
    assert groups.remove_all() == [] and _enabled(root) == {"cpu", "memory"}
    assert not [w for w in kernel if w[0] == str(root / cg.CONTROL)]


def test_a_controller_another_group_uses_now_is_left_on_with_a_word(kernel, tmp_path):
    root = _root(tmp_path)
    journal = Journal(tmp_path / "state")
    cg.NodeGroups(journal, cg.V2Cgroups(root)).create("netbench-n2")
    (root / "system.slice").mkdir()
    (root / "system.slice" / cg.CONTROL).write_text("cpu")  # a service enabled it below meanwhile
    (root / cg.V2_PARENT / cg.CONTROL).unlink()
    warnings: list[str] = []
    reset(journal, warn=warnings.append)
    assert "cpu" in _enabled(root) and any("left on" in w for w in warnings), warnings
    assert journal.pending() == []


def test_a_group_that_still_holds_a_process_ends_it_and_never_moves_it_to_the_root(tmp_path, monkeypatch, sleeper):
    """A job's leftover in its node's group: removing the group used to write its pid into the
    root group's cgroup.procs, where it ran on without any limit."""
    root = tmp_path / "sys"
    group = root / cg.V1_PARENT / "netbench-n2"
    group.mkdir(parents=True)
    (group / "cgroup.procs").write_text(f"{sleeper.pid}\n")
    real_rmdir = Path.rmdir

    def rmdir(path: Path) -> None:  # the kernel's: busy while a member runs
        if path == group:
            if sleeper.poll() is None:
                raise OSError(errno.EBUSY, "Device or resource busy")
            (group / "cgroup.procs").unlink()
        real_rmdir(path)

    monkeypatch.setattr(Path, "rmdir", rmdir)
    assert cg.remove_group(group, root, grace=0.5)
    assert sleeper.wait(timeout=10) is not None  # ended
    assert not group.exists() and not (root / "cgroup.procs").exists()  # nothing moved to the root


def test_reset_removes_the_state_folders_step_delay_files(tmp_path, monkeypatch):
    """A sweep killed while it gave a node a step delay leaves <state>/step-delay/<netns>."""
    monkeypatch.setattr(pnetns, "listnetns", lambda *a, **k: [])
    journal = Journal(tmp_path / "state")
    folder = journal.dir / "step-delay"
    folder.mkdir(parents=True)
    (folder / "netbench-n2").write_text("0.04")
    reset(journal)
    assert not folder.exists()


def test_a_user_who_cannot_write_the_holds_folder_reads_no_holder_and_is_told_when_it_would_hold():
    """Without root (a folder it cannot make): nothing is held there, so a setting the host has
    on already is left to the host; recording a hold says why it cannot, in one line."""
    from netbench.errors import StateError
    from netbench.state.holds import Holds

    holds = Holds(Path("/proc/netbench-holds-cannot-exist"))
    with holds.locked("cpu-controller:/sys/fs/cgroup/cgroup.subtree_control"):
        assert not holds.held("cpu-controller:/sys/fs/cgroup/cgroup.subtree_control")
    with pytest.raises(StateError, match="cannot record a hold"):
        holds.add("cpu-controller:/sys/fs/cgroup/cgroup.subtree_control", holds.new_id())
