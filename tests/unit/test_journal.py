"""netbench.state.journal: the write-ahead journal and the controller lock."""

from __future__ import annotations

import json

import pytest

from netbench.state import journal as jr
from netbench.errors import StateError
from netbench.state.journal import Journal, Lock


@pytest.fixture
def journal(tmp_path):
    return Journal(tmp_path / "state")


def test_record_then_pending(journal):
    a = journal.record("netns", name="netbench-n1")
    b = journal.record("qdisc", netns="netbench-n1", ifname="eth0")
    assert journal.pending() == [a, b]
    assert (a.kind, a.data) == ("netns", {"name": "netbench-n1"})
    assert a.id != b.id


def test_record_is_on_disk_immediately(journal):
    entry = journal.record("process", pid=123, netns="netbench-n1")
    lines = [json.loads(line) for line in journal.path.read_text().splitlines()]
    assert lines[-1]["op"] == "create" and lines[-1]["id"] == entry.id and lines[-1]["data"]["pid"] == 123
    assert Journal(journal.dir).pending() == [entry]  # a second reader (reset after a crash) sees it


def test_done_removes_from_pending(journal):
    a = journal.record("netns", name="a")
    b = journal.record("netns", name="b")
    journal.done(a)
    assert journal.pending() == [b]
    journal.done(b.id)  # by id as well
    assert journal.pending() == []


def test_empty_or_missing_journal(journal):
    assert not journal.path.exists()
    assert journal.pending() == []
    journal.compact()  # nothing to do, no error
    assert not journal.path.exists()


def test_compact_keeps_only_pending(journal):
    a = journal.record("netns", name="a")
    b = journal.record("qdisc", netns="a", ifname="eth0")
    c = journal.record("netns", name="c")
    journal.done(b)
    journal.compact()
    lines = journal.path.read_text().splitlines()
    assert len(lines) == 2
    assert journal.pending() == [a, c]
    journal.done(a)
    journal.done(c)
    journal.compact()
    assert not journal.path.exists()


def test_torn_last_line_is_ignored(journal):
    a = journal.record("netns", name="a")
    with open(journal.path, "a") as fh:
        fh.write('{"op": "create", "id": "torn", "kind": "net')  # power cut mid-write
    assert journal.pending() == [a]


def test_garbage_lines_are_ignored(journal):
    a = journal.record("netns", name="a")
    with open(journal.path, "a") as fh:
        fh.write("[1, 2]\n\n\"text\"\n{\"no_id\": 1}\n")
    assert journal.pending() == [a]


def test_a_corrupt_line_does_not_hide_later_entries(journal):
    a = journal.record("netns", name="a")
    with open(journal.path, "a") as fh:
        fh.write("{not json\n")
    b = journal.record("netns", name="b")
    assert journal.pending() == [a, b]


def test_record_after_torn_line_is_kept(journal):
    journal.record("netns", name="a")
    with open(journal.path, "a") as fh:
        fh.write('{"op": "create", "id": "torn", "kind": "net')
    b = journal.record("qdisc", netns="a", ifname="eth0")
    assert b in journal.pending()


def test_resolve_matches_kind_and_data(journal):
    q1 = journal.record("qdisc", netns="n1", ifname="eth0")
    q2 = journal.record("qdisc", netns="n2", ifname="eth0")
    ns = journal.record("netns", name="n1", netns="n1")
    jr.resolve(journal, "qdisc", netns="n1")
    assert journal.pending() == [q2, ns]
    assert q1 not in journal.pending()
    jr.resolve(journal, "qdisc")
    assert journal.pending() == [ns]


def test_unwritable_state_dir_is_a_state_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StateError, match="cannot write journal"):
        Journal(blocker / "state").record("netns", name="x")


def test_state_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("NETBENCH_STATE_DIR", str(tmp_path / "s"))
    assert Journal().path == tmp_path / "s" / jr.JOURNAL_NAME
    monkeypatch.delenv("NETBENCH_STATE_DIR")
    assert jr.state_dir() == jr.Path("/run/netbench")
    monkeypatch.setenv("NETBENCH_STATE_DIR", "")  # empty is unset, never the current directory
    assert jr.state_dir() == jr.Path("/run/netbench")


# ---------------------------------------------------------------- lock


def test_lock_is_exclusive(tmp_path):
    with Lock(tmp_path):
        with pytest.raises(StateError, match="another netbench command"):
            with Lock(tmp_path):
                pass


def test_lock_is_released_on_exit(tmp_path):
    with Lock(tmp_path):
        pass
    with Lock(tmp_path):
        pass
    with pytest.raises(RuntimeError):
        with Lock(tmp_path):
            raise RuntimeError("boom")
    with Lock(tmp_path):  # released after an exception too
        pass


def test_locks_in_different_dirs_do_not_conflict(tmp_path):
    with Lock(tmp_path / "a"), Lock(tmp_path / "b"):
        pass


def test_failed_lock_attempt_does_not_release_the_holder(tmp_path):
    with Lock(tmp_path):
        with pytest.raises(StateError):
            Lock(tmp_path).__enter__()
        with pytest.raises(StateError):  # still held
            Lock(tmp_path).__enter__()


def test_lock_in_unusable_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StateError, match="cannot open lock"):
        with Lock(blocker / "state"):
            pass


# ---------------------------------------------------------------- concurrent appends, bad lines, state dir


def test_compaction_keeps_an_entry_appended_while_it_runs(journal, monkeypatch):
    """An append that arrives while compaction rewrites the journal (the lease watcher's
    reset on a host while `node task` journals its process) is never lost."""
    import threading

    keep = journal.record("netns", name="a")
    journal.done(journal.record("netns", name="b"))
    real_replace = jr.os.replace
    appended = []
    writer = None

    def replace_with_an_append_beside(src, dst):
        nonlocal writer
        if writer is None:
            writer = threading.Thread(target=lambda: appended.append(Journal(journal.dir).record("process", pid=7)))
            writer.start()
            writer.join(timeout=2.0)  # unlocked compaction: the append lands in the file being replaced
        real_replace(src, dst)

    monkeypatch.setattr(jr.os, "replace", replace_with_an_append_beside)
    journal.compact()
    writer.join()
    assert journal.pending() == [keep, *appended]
    assert not list(journal.dir.glob("*.tmp"))


def test_an_invalid_utf8_line_is_skipped_and_quarantined(journal):
    a = journal.record("netns", name="a")
    with open(journal.path, "ab") as fh:
        fh.write(b'{"op": "create", "id": "x\xff\xfe", "kind": "netns"}\n')
    b = journal.record("netns", name="b")
    assert journal.pending() == [a, b]
    warnings = journal.compact()
    assert len(warnings) == 1 and "line 2" in warnings[0] and "not valid JSON" in warnings[0]
    assert (journal.dir / jr.QUARANTINE_NAME).read_bytes().startswith(b'{"op": "create", "id": "x\xff')
    assert journal.pending() == [a, b]
    assert journal.compact() == []  # moved out: no second warning


@pytest.mark.parametrize("line", [
    {"op": "create", "id": "k1", "data": {"name": "x"}},  # no kind
    {"op": "create", "id": "k2", "kind": "netns", "data": ["x"]},  # data not an object
    {"op": "create", "id": "k3", "kind": "process", "data": {"pid": "12"}},  # reset would fail on it
    {"op": "create", "id": "k4", "kind": "qdisc", "data": {"netns": "netbench-n1"}},
    {"op": "create", "id": 5, "kind": "netns", "data": {"name": "x"}},
    {"op": "undo", "id": "k6"},
])
def test_a_record_reset_cannot_use_is_skipped(journal, line):
    a = journal.record("netns", name="a")
    with open(journal.path, "a") as fh:
        fh.write(json.dumps(line) + "\n")
    assert journal.pending() == [a]
    warnings = journal.compact()
    assert len(warnings) == 1 and "line 2" in warnings[0]
    assert json.loads((journal.dir / jr.QUARANTINE_NAME).read_text()) == line


def test_a_journal_of_bad_lines_only_is_removed_after_quarantine(journal):
    journal.dir.mkdir()
    journal.path.write_text("{torn\n")
    assert journal.pending() == []
    assert len(journal.compact()) == 1
    assert not journal.path.exists()
    assert (journal.dir / jr.QUARANTINE_NAME).read_text() == "{torn\n"


def test_state_dir_writable_by_others_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    with pytest.raises(StateError, match="writable by group or others") as err:
        Journal(state).record("netns", name="a")
    assert "chmod go-w" in err.value.hint
    with pytest.raises(StateError, match="writable by group or others"):
        Journal(state).pending()
    with pytest.raises(StateError, match="writable by group or others"):
        Lock(state).__enter__()
    assert not (state / jr.JOURNAL_NAME).exists()


def test_state_dir_of_another_user_is_refused(tmp_path, monkeypatch):
    import os

    state = tmp_path / "state"
    state.mkdir()
    if os.geteuid() == 0:
        os.chown(state, 4242, 4242)
    else:  # the folder is ours: be someone else
        monkeypatch.setattr(jr.os, "geteuid", lambda: os.getuid() + 1)
    with pytest.raises(StateError, match="belongs to uid"):
        Journal(state).record("netns", name="a")
    with pytest.raises(StateError, match="belongs to uid"):
        Lock(state).__enter__()


def test_state_dir_is_created_without_group_or_other_write(tmp_path, monkeypatch):
    import os

    old = os.umask(0)
    try:
        journal = Journal(tmp_path / "new" / "state")
        journal.record("netns", name="a")
    finally:
        os.umask(old)
    assert journal.dir.stat().st_mode & 0o022 == 0
    assert journal.pending()  # and it is usable


def bytes_read() -> int:
    """Bytes this process has read with read(2) so far (Linux task I/O accounting)."""
    with open("/proc/self/io") as fh:
        return int(next(line for line in fh if line.startswith("rchar:")).split()[1])


def test_pending_reads_only_what_was_appended_since(journal):
    """A sweep makes thousands of changes and each asks for pending entries: the journal is
    read once, then kept as an index that appends update (not re-read for every change)."""
    for i in range(2000):
        journal.done(journal.record("qdisc", netns=f"netbench-n{i}", ifname="eth0"))
    keep = journal.record("netns", name="netbench-sw")
    assert journal.pending() == [keep]
    size = journal.path.stat().st_size
    before = bytes_read()
    for i in range(200):
        entry = journal.record("qdisc", netns="netbench-n1", ifname="eth0")
        assert journal.pending()[-1] == entry
        jr.resolve(journal, "qdisc", netns="netbench-n1")
    assert journal.pending() == [keep]
    assert bytes_read() - before < size / 4  # before: 400 reads of the whole file


def test_the_index_follows_other_writers_compaction_and_removal(tmp_path):
    mine, other = Journal(tmp_path), Journal(tmp_path)
    a = mine.record("netns", name="a")
    assert other.pending() == [a]
    b = other.record("netns", name="b")  # appended by another process: read from where mine stopped
    mine.done(a)
    assert mine.pending() == [b] and other.pending() == [b]
    other.compact()  # rewritten under mine's index
    c = other.record("netns", name="c")
    assert mine.pending() == [b, c]
    other.done(b), other.done(c)
    other.compact()  # removed
    assert mine.pending() == []
    d = other.record("netns", name="d")  # a new file in its place
    assert mine.pending() == [d]


def test_a_line_still_being_written_is_read_once_it_is_complete(journal):
    a = journal.record("netns", name="a")
    line = json.dumps({"op": "create", "id": "late", "kind": "netns", "data": {"name": "late"}})
    with open(journal.path, "a") as fh:
        fh.write(line[:20])  # another process is half-way through its write
    assert journal.pending() == [a]
    with open(journal.path, "a") as fh:
        fh.write(line[20:] + "\n")
    assert [e.id for e in journal.pending()] == [a.id, "late"]


# --- the undo registry (state/undo.py) ---------------------------------------

def _journaled_kinds() -> set[str]:
    """Every kind the code records: `record("<kind>"` anywhere under netbench/."""
    import re
    from pathlib import Path

    import netbench

    root = Path(netbench.__file__).parent
    kinds: set[str] = set()
    for path in root.rglob("*.py"):
        kinds |= set(re.findall(r"\brecord\(\s*\"([a-z_]+)\"", path.read_text()))
    return kinds


def test_every_journaled_kind_has_an_undo():
    from netbench.state.undo import UNDO

    kinds = _journaled_kinds()
    assert {"process", "qdisc", "ingress", "iptables", "netns", "attach"} <= kinds  # the scan finds them
    assert kinds <= set(UNDO), f"no undo for {sorted(kinds - set(UNDO))}"
    assert set(jr.REQUIRED) <= set(UNDO)


def test_an_unknown_kind_is_left_alone_with_a_warning(journal):
    from netbench.state.reset import undo_entry

    entry = journal.record("teleporter", where="mars")
    warnings: list[str] = []
    assert undo_entry(entry, set(), warnings.append) is None
    assert len(warnings) == 1 and "unknown kind 'teleporter'" in warnings[0] and "qdisc" in warnings[0]


def test_undo_dispatches_through_the_registry():
    from netbench.state.undo import UndoContext, undo

    seen = []
    registry = {"qdisc": lambda data, ctx: seen.append((data, ctx.existing)) or "removed"}
    ctx = UndoContext(frozenset({"ns1"}))
    assert undo("qdisc", {"netns": "ns1"}, ctx, registry) == "removed"
    assert seen == [({"netns": "ns1"}, frozenset({"ns1"}))]


def test_undo_skips_a_namespace_that_is_gone():
    from netbench.state.undo import UndoContext, undo

    ctx = UndoContext(frozenset())  # the namespace no longer exists: nothing to touch, no adapter call
    assert undo("qdisc", {"netns": "gone", "ifname": "eth0"}, ctx) is None
    assert undo("ingress", {"netns": "gone", "dev": "eth0", "ifb": "nbifb0"}, ctx) is None
    assert undo("iptables", {"netns": "gone"}, ctx) is None


def test_a_done_for_an_entry_already_undone_and_compacted_leaves_no_line(journal):
    """A host's reset undoes a task's process entry and compacts the journal while the task's
    own `node task` is still stopping; its late `done` must not leave a lone line behind
    (seen in the sshd test of a killed controller)."""
    entry = journal.record("netns", name="a")
    other = Journal(journal.dir)  # another process: the reset
    other.done(entry)
    other.compact()
    assert not journal.path.exists()
    journal.done(entry)
    assert not journal.path.exists()
    kept = journal.record("netns", name="b")
    journal.done("no-such-id")
    assert journal.pending() == [kept] and "no-such-id" not in journal.path.read_text()
