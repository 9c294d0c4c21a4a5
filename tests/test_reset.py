"""netbench.reset and netbench.proc on this machine's own processes (no root, no namespaces).

Every test hides /run/netns from reset (an empty listing): the machine's real namespaces,
someone else's testbed among them, are never swept from a pure test.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from pyroute2 import netns as pnetns

from netbench import proc
from netbench.journal import Journal
from netbench.reset import reset


@pytest.fixture
def journal(tmp_path, monkeypatch):
    monkeypatch.setattr(pnetns, "listnetns", lambda *args, **kwargs: [])
    return Journal(tmp_path / "state")


@pytest.fixture
def sleeper():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield child
    if child.poll() is None:
        child.kill()
    child.wait()


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
