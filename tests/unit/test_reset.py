"""netbench.state.reset and netbench.proc on this machine's own processes (no root, no namespaces).

Every test hides /run/netns from reset (an empty listing): the machine's real namespaces,
someone else's testbed among them, are never swept from a pure test.
"""

from __future__ import annotations

import os

import subprocess
import sys

import pytest
from pyroute2 import netns as pnetns

from netbench import proc
from netbench.state.journal import Journal
from netbench.state.reset import reset


@pytest.fixture
def journal(tmp_path, monkeypatch):
    monkeypatch.setattr(pnetns, "listnetns", lambda *args, **kwargs: [])
    return Journal(tmp_path / "state")


def test_a_pid_without_a_start_time_is_never_killed(journal, sleeper):
    """The pid may have been reused by any process since: without its start time, it is left."""
    journal.record("process", pid=sleeper.pid, start=None, netns=None, role="worker0")
    warnings: list[str] = []
    removed = reset(journal, warn=warnings.append)
    assert sleeper.poll() is None, "reset killed a process it could not identify"
    assert removed == []
    assert any(str(sleeper.pid) in w and "start time" in w for w in warnings)
    assert not proc.is_same_process(sleeper.pid, None)
    assert journal.pending() == []


def test_a_pid_with_its_start_time_is_stopped(journal, sleeper):
    journal.record("process", pid=sleeper.pid, start=proc.start_time(sleeper.pid), netns=None, role="worker0")
    removed = reset(journal)
    assert sleeper.wait(timeout=30) is not None
    assert removed == [f"process {sleeper.pid} (worker0)"]


def test_a_pid_reused_by_another_process_is_left(journal, sleeper):
    journal.record("process", pid=sleeper.pid, start=proc.start_time(sleeper.pid) - 1, netns=None, role="worker0")
    assert reset(journal) == []
    assert sleeper.poll() is None


def test_one_bad_journal_line_does_not_block_the_rest(journal, sleeper):
    journal.record("process", pid=sleeper.pid, start=proc.start_time(sleeper.pid), netns=None, role="worker0")
    with open(journal.path, "ab") as fh:
        fh.write(b"\xff\xfe not a record\n")
        fh.write(b'{"op": "create", "id": "bad1", "kind": "process", "data": {}}\n')
    warnings: list[str] = []
    removed = reset(journal, warn=warnings.append)
    assert removed == [f"process {sleeper.pid} (worker0)"]
    assert sleeper.wait(timeout=30) is not None
    assert len(warnings) == 2 and "line 2" in warnings[0] and "line 3" in warnings[1]
    assert not journal.path.exists()
    assert reset(journal, warn=warnings.append) == [] and len(warnings) == 2  # quarantined, said once


def test_host_namespace_references_are_recognised(tmp_path, monkeypatch):
    """A /run/netns entry that is pid 1's or this process's namespace (here: files standing
    in for them) is the host's; an unreadable reference is skipped, not matched."""
    init_ns, own_ns, other = tmp_path / "init", tmp_path / "own", tmp_path / "other"
    for path in (init_ns, own_ns, other):
        path.write_text("")
    run_dir = tmp_path / "netns"
    run_dir.mkdir()
    (run_dir / "netbench-n1").symlink_to(init_ns)
    (run_dir / "netbench-n2").symlink_to(own_ns)
    (run_dir / "netbench-n3").symlink_to(other)
    monkeypatch.setattr(proc, "NETNS_RUN_DIR", run_dir)
    monkeypatch.setattr(proc, "HOST_NETNS_REFS", (init_ns, own_ns))
    assert [proc.is_host_netns(f"netbench-n{i}") for i in (1, 2, 3, 4)] == [True, True, False, False]
    monkeypatch.setattr(proc, "HOST_NETNS_REFS", (tmp_path / "unreadable", own_ns))
    assert [proc.is_host_netns(f"netbench-n{i}") for i in (1, 2, 3)] == [False, True, False]


def test_scratch_namespaces_are_stale_only_once_their_maker_is_gone(monkeypatch, sleeper):
    from netbench.testbed import netns as local
    from netbench.model import topology as topo

    gone = subprocess.Popen(["sleep", "60"])
    gone_start = proc.start_time(gone.pid)
    gone.kill()
    gone.wait()
    names = [topo.scratch_netns("doctor", gone.pid, gone_start),
             topo.scratch_netns("probe", sleeper.pid, proc.start_time(sleeper.pid)),
             topo.scratch_netns("probe", sleeper.pid, proc.start_time(sleeper.pid) + 1),  # pid reused
             "netbench-doctor-1", "nbscratch-doctor-x"]
    monkeypatch.setattr(pnetns, "listnetns", lambda *args, **kwargs: names)
    assert local.stale_scratch_netns() == sorted([names[0], names[2]])


def _fake_namespaces(monkeypatch, names: list[str]) -> list[str]:
    """/run/netns as `names` (none the host's own); removing one only records its name."""
    from netbench.testbed import netns as local

    present = list(names)
    gone: list[str] = []

    def remove(name):
        if name not in present:
            return False
        present.remove(name)
        gone.append(name)
        return True

    monkeypatch.setattr(pnetns, "listnetns", lambda *args, **kwargs: list(present))
    monkeypatch.setattr(proc, "is_host_netns", lambda name: False)
    monkeypatch.setattr(proc, "pids_in_netns", lambda name: [])
    monkeypatch.setattr(local, "remove_netns", remove)
    return gone


def test_reset_leaves_testbed_namespaces_its_journal_did_not_record(journal, monkeypatch):
    """Another state folder's testbed (perhaps live: removing a namespace stops every process
    in it) is left alone, with a warning naming the flag that removes it; what this journal
    recorded goes."""
    gone = _fake_namespaces(monkeypatch, ["netbench-sw", "netbench-n1", "netbench-n2", "other"])
    journal.record("netns", name="netbench-n2")
    warnings: list[str] = []
    removed = reset(journal, warn=warnings.append)
    assert gone == ["netbench-n2"] and removed == ["namespace netbench-n2"]
    assert sorted(w.split()[1] for w in warnings) == ["netbench-n1", "netbench-sw"]
    assert all("left alone" in w and "--all-namespaces" in w for w in warnings)
    assert reset(journal, warn=warnings.append, all_namespaces=True) == ["namespace netbench-n1",
                                                                          "namespace netbench-sw"]
    assert sorted(gone) == ["netbench-n1", "netbench-n2", "netbench-sw"]  # never 'other'


def test_all_namespaces_is_refused_with_an_inventory(tmp_path):
    from click.testing import CliRunner

    from netbench.cli.app import main

    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts: []\n")
    result = CliRunner().invoke(main, ["reset", "--all-namespaces", "--inventory", str(inventory)])
    assert result.exit_code == 2 and "--all-namespaces" in result.output and "only without --inventory" in result.output


def _failing_qdisc_undo(monkeypatch):
    from netbench.errors import EmulationError
    from netbench.state import undo as undo_module

    def fails(data, ctx):
        raise EmulationError(f"cannot clear the qdisc on {data['ifname']}: device busy")

    monkeypatch.setitem(undo_module.UNDO, "qdisc", fails)


def test_one_undo_that_fails_does_not_stop_the_rest(journal, monkeypatch):
    """Every other entry is still undone; the failure is named, stays journaled for the next
    reset, and the reset ends in an error that carries what it did remove."""
    from netbench.errors import ResetIncomplete

    _failing_qdisc_undo(monkeypatch)
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    second = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        journal.record("process", pid=first.pid, start=proc.start_time(first.pid), netns=None, role="worker0")
        journal.record("qdisc", netns="netbench-n1", ifname="eth0", handle="1:")
        journal.record("process", pid=second.pid, start=proc.start_time(second.pid), netns=None, role="worker1")
        with pytest.raises(ResetIncomplete) as failed:
            reset(journal)
        assert first.wait(timeout=30) is not None and second.wait(timeout=30) is not None
        assert failed.value.removed == [f"process {second.pid} (worker1)", f"process {first.pid} (worker0)"]
        assert failed.value.failures == ["qdisc eth0 in netbench-n1: cannot clear the qdisc on eth0: device busy"]
        assert "1 thing(s) in place" in failed.value.message
        assert [e.kind for e in journal.pending()] == ["qdisc"]  # the next reset tries it again
    finally:
        for child in (first, second):
            if child.poll() is None:
                child.kill()
            child.wait()


def test_a_host_reset_goes_on_past_an_undo_that_fails(tmp_path, monkeypatch, sleeper):
    from netbench.errors import ResetIncomplete
    from netbench.remote.agent import reset_host

    _failing_qdisc_undo(monkeypatch)
    host_journal = Journal(tmp_path / "host")
    host_journal.record("qdisc", netns=None, ifname="eth1", handle="1:")
    host_journal.record("process", pid=sleeper.pid, start=proc.start_time(sleeper.pid), netns=None, role="engine")
    with pytest.raises(ResetIncomplete) as failed:
        reset_host(host_journal)
    assert sleeper.wait(timeout=30) is not None
    assert failed.value.removed == [f"process {sleeper.pid} (engine)"]
    assert failed.value.failures == ["qdisc eth1: cannot clear the qdisc on eth1: device busy"]


def test_reset_shows_what_it_removed_then_fails_naming_each_failure(monkeypatch, state_dir):
    from click.testing import CliRunner

    from netbench.cli import common
    from netbench.cli.app import main
    from netbench.errors import ResetIncomplete
    from netbench.state import reset as reset_module

    def incomplete(journal, warn, all_namespaces=False):
        raise ResetIncomplete(["process 12 (worker0)"], ["qdisc eth0 in netbench-n1: busy", "namespace netbench-n2: busy"])

    from netbench.cli import emulation

    monkeypatch.setattr(common, "require_root", lambda: None)
    monkeypatch.setattr(emulation, "_reset_sandboxes", lambda include_default: [])  # none beside it
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(reset_module, "reset", incomplete)
    result = CliRunner().invoke(main, ["reset"])
    assert result.exit_code == 1
    assert "removed process 12 (worker0)" in result.output and "clean" not in result.output
    assert "reset left 2 thing(s) in place: qdisc eth0 in netbench-n1: busy; namespace netbench-n2: busy" in result.output
