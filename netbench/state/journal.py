"""The on-disk journal: every change is recorded *before* it is made.

`netbench reset` replays the journal backwards and undoes what is still there, so it
works after the controller was killed with SIGKILL at any moment. Entries are JSON
lines, fsynced on write. A `done` line marks an entry as undone; once every entry is
undone the journal is truncated. Appends and compaction hold a short lock of their own
(`journal.lock`), so a compaction never loses a line written beside it. A line that cannot
be read (torn, corrupt, or missing what reset needs) is skipped, and compaction moves it
to `journal.bad`.

The journal says what `netbench reset` stops and removes, so a state directory another
user could write is refused (it must belong to this user or root, and not be writable by
group or others).

The state directory defaults to /run/netbench: like the namespaces and processes it
tracks, it does not survive a reboot. NETBENCH_STATE_DIR overrides it (tests do).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from netbench.errors import StateError
from netbench.state import places

JOURNAL_NAME = "journal.jsonl"
LOCK_NAME = "lock"
JOURNAL_LOCK_NAME = "journal.lock"  # held only while a line is appended or the journal compacted
STEP_DELAY_DIR = "step-delay"  # a sweep's step-delay files (testbed/compute.py): reset removes the folder
QUARANTINE_NAME = "journal.bad"  # lines compaction could not read, kept for a person to look at

# what reset needs in each kind's data to undo it (reset.py); a create line without it is bad
REQUIRED: dict[str, dict[str, type]] = {
    "netns": {"name": str}, "attach": {"name": str}, "process": {"pid": int},
    "qdisc": {"netns": str, "ifname": str}, "ingress": {"netns": str, "dev": str, "ifb": str},
    "iptables": {"netns": str}, "sysctl": {"key": str, "previous": str},
    "cgroup": {"path": str, "root": str}, "cgroup-control": {"path": str},
}


def state_dir() -> Path:
    """NETBENCH_STATE_DIR, or when it is unset or empty (an empty one would be the current
    directory: a journal and engine sockets among the user's files) the default testbed's:
    /run/netbench for root, a folder of the user's own otherwise (state/places.py)."""
    return places.state_dir(os.environ, os.geteuid())


def check_state_dir(path: Path) -> None:
    """Refuse a state dir that someone else could have written: not this user's (or root's),
    or writable by group or others. A missing one is fine (it is created 0755)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StateError(f"cannot read state dir {path}: {exc.strerror or exc}") from None
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise StateError(f"state dir {path} belongs to uid {st.st_uid}, not to this user (uid {me}) or root",
                         hint="its journal says what 'netbench reset' stops and removes: use a folder of "
                              "your own (NETBENCH_STATE_DIR) or fix its owner") from None
    if st.st_mode & 0o022:
        raise StateError(f"state dir {path} is writable by group or others (mode {st.st_mode & 0o777:o})",
                         hint=f"its journal says what 'netbench reset' stops and removes: chmod go-w {path}")


def _bad_reason(record: Any) -> str | None:
    """Why a decoded journal line cannot be used, or None when it can."""
    if not isinstance(record, dict) or not isinstance(record.get("id"), str):
        return "not a journal record"
    if record.get("op") == "done":
        return None
    if record.get("op") != "create":
        return f"unknown op {record.get('op')!r}"
    kind, data = record.get("kind"), record.get("data", {})
    if not isinstance(kind, str) or not isinstance(data, dict):
        return "a create line without a kind or with data that is not an object"
    for key, typ in REQUIRED.get(kind, {}).items():
        value = data.get(key)
        if not isinstance(value, typ) or isinstance(value, bool):
            return f"a {kind} entry without a valid {key!r}"
    return None


@dataclass(frozen=True)
class Entry:
    """One recorded change: `kind` says how to undo it, `data` what it touched."""

    id: str
    kind: str  # netns | process | qdisc | iptables | ingress | attach | sysctl | cgroup
    data: dict[str, Any] = field(default_factory=dict)


class Journal:
    """Append-only write-ahead record of what netbench created."""

    def __init__(self, directory: Path | None = None) -> None:
        self.dir = directory or state_dir()
        self.path = self.dir / JOURNAL_NAME
        # An index of the pending entries, so that a sweep's thousands of changes do not each
        # re-read the whole file: it holds the first `_parsed` bytes of the file with inode
        # `_inode` whose first line is `_head`. This Journal's own appends update it; lines
        # others append are read from `_parsed` on; a file rewritten or replaced meanwhile
        # (compaction, reset) is read again from the start.
        self._index: dict[str, Entry] = {}
        self._parsed = 0
        self._inode: int | None = None
        self._head = b""

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The journal lock: appends and compaction never interleave (a blocking flock,
        held for one write or one rewrite; not the controller's Lock)."""
        fd = os.open(self.dir / JOURNAL_LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock

    def _append(self, record: dict[str, Any], if_pending: str | None = None) -> None:
        """Append `record` under the journal lock; with `if_pending`, only while that entry is
        still pending (checked under the same lock)."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o755)
            check_state_dir(self.dir)
            with self._locked():
                if if_pending is not None:
                    self._refresh()
                    if if_pending not in self._index:
                        return
                self._write_line(record)
        except OSError as exc:
            raise StateError(f"cannot write journal {self.path}: {exc.strerror or exc}",
                             hint="netbench needs root; set NETBENCH_STATE_DIR to a writable folder") from None

    def _write_line(self, record: dict[str, Any]) -> None:
        """One record as one line; the caller holds the journal lock."""
        with open(self.path, "a+b") as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell() > 0:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":  # a torn last line: never glue a record onto it
                    fh.write(b"\n")
            fh.flush()
            start = fh.tell()
            line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
            self._indexed(record, line, start, fh.tell(), os.fstat(fh.fileno()).st_ino)

    def record(self, kind: str, **data: Any) -> Entry:
        """Write the intent to create something; call before creating it."""
        entry = Entry(id=uuid.uuid4().hex[:12], kind=kind, data=data)
        self._append({"op": "create", "id": entry.id, "kind": kind, "data": data, "time": time.time()})
        return entry

    def done(self, entry: Entry | str) -> None:
        """Mark an entry undone (the thing it created is gone). An entry that is no longer
        pending (another process undid it and compacted the journal meanwhile, as a host's
        reset does while its `node task` stops) gets no line: a lone `done` would outlive
        the compaction that removed its entry."""
        entry_id = entry.id if isinstance(entry, Entry) else entry
        self._append({"op": "done", "id": entry_id, "time": time.time()}, if_pending=entry_id)

    def pending(self) -> list[Entry]:
        """Entries whose creation was recorded and not yet undone, oldest first.

        A line that cannot be read (a torn last line after a power cut, a corrupt one) is
        skipped: the rest is still undone. compact() moves such lines to journal.bad.
        Reads only what was appended since the last call (see `_index`).
        """
        self._refresh()
        return list(self._index.values())

    def _apply(self, record: dict[str, Any]) -> None:
        if record.get("op") == "create":
            self._index[record["id"]] = Entry(record["id"], record["kind"], record.get("data", {}))
        elif record.get("op") == "done":
            self._index.pop(record.get("id"), None)

    def _indexed(self, record: dict[str, Any], line: bytes, start: int, end: int, inode: int) -> None:
        """Add this Journal's own appended `line` (bytes start..end) to the index, when the
        index held the file up to `start` and nobody else's line came in between."""
        if end - start != len(line):
            return  # another writer's line landed at the same time: the next read picks both up
        if start == 0:
            self._index, self._inode, self._head = {}, inode, line
        elif (inode, start) != (self._inode, self._parsed):
            return
        self._apply(record)
        self._parsed = end

    def _refresh(self) -> None:
        """Bring the index up to date with the file: the lines appended since, or everything
        when the file is not the one indexed. A last line without its newline (being written,
        or torn) is left for later."""
        check_state_dir(self.dir)
        try:
            with open(self.path, "rb", buffering=0) as fh:  # unbuffered: read no more than asked
                stat = os.fstat(fh.fileno())
                if (stat.st_ino != self._inode or stat.st_size < self._parsed
                        or fh.read(len(self._head)) != self._head):
                    self._index, self._parsed, self._inode, self._head = {}, 0, stat.st_ino, b""
                fh.seek(self._parsed)
                data = fh.read()
        except FileNotFoundError:
            self._index, self._parsed, self._inode, self._head = {}, 0, None, b""
            return
        except OSError as exc:
            raise StateError(f"cannot read journal {self.path}: {exc.strerror or exc}") from None
        complete = data[:data.rfind(b"\n") + 1]
        if self._parsed == 0 and complete:
            self._head = complete[:complete.index(b"\n") + 1]
        for record in _parse(complete.splitlines()):
            self._apply(record)
        self._parsed += len(complete)

    def _scan(self) -> tuple[list[dict[str, Any]], list[tuple[int, bytes, str]]]:
        """(usable records, bad lines as (line number, raw bytes, why)); blank lines are neither."""
        check_state_dir(self.dir)
        try:
            raw_lines = self.path.read_bytes().splitlines()
        except FileNotFoundError:
            return [], []
        except OSError as exc:
            raise StateError(f"cannot read journal {self.path}: {exc.strerror or exc}") from None
        records, bad = [], []
        for number, raw in enumerate(raw_lines, start=1):
            record, why = _decode(raw)
            if record is not None:
                records.append(record)
            elif why is not None:
                bad.append((number, raw, why))
        return records, bad

    def _records(self) -> Iterator[dict[str, Any]]:
        yield from self._scan()[0]

    def compact(self) -> list[str]:
        """Rewrite the journal with only pending entries; remove it when none are left.

        Atomic against concurrent appends: under the journal lock, through a temporary file
        of a unique name renamed over the journal. Lines that cannot be read are appended to
        journal.bad; returns a warning for each.
        """
        try:
            if not self.path.exists():
                return []
            with self._locked():
                records, bad = self._scan()
                pending = _pending(records)
                warnings = self._quarantine(bad)
                if not pending:
                    self.path.unlink(missing_ok=True)
                    return warnings
                tmp = self.dir / f".{JOURNAL_NAME}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
                try:
                    with open(tmp, "w", encoding="utf-8") as fh:
                        for entry in pending:
                            fh.write(json.dumps({"op": "create", "id": entry.id, "kind": entry.kind,
                                                 "data": entry.data}, sort_keys=True) + "\n")
                        fh.flush()
                        os.fsync(fh.fileno())
                    os.replace(tmp, self.path)
                finally:
                    tmp.unlink(missing_ok=True)
        except OSError as exc:
            raise StateError(f"cannot compact journal {self.path}: {exc.strerror or exc}") from None
        return warnings

    def _quarantine(self, bad: list[tuple[int, bytes, str]]) -> list[str]:
        if not bad:
            return []
        where = self.dir / QUARANTINE_NAME
        with open(where, "ab") as fh:
            for _, raw, _ in bad:
                fh.write(raw + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        return [f"journal {self.path} line {number}: {why}; skipped (kept in {where})"
                for number, _, why in bad]


def _pending(records: list[dict[str, Any]]) -> list[Entry]:
    created: dict[str, Entry] = {}
    for record in records:
        if record["op"] == "create":
            created[record["id"]] = Entry(record["id"], record["kind"], record.get("data", {}))
        else:
            created.pop(record["id"], None)
    return list(created.values())


def _decode(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """(the record, None) for a usable journal line; (None, why) for a bad one; (None, None)
    for a blank one."""
    if not raw.strip():
        return None, None
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None, "not valid JSON"
    reason = _bad_reason(record)
    return (record, None) if reason is None else (None, reason)


def _parse(raw_lines: list[bytes]) -> Iterator[dict[str, Any]]:
    """The usable journal records among `raw_lines`; bad ones are skipped (compact() keeps them)."""
    for raw in raw_lines:
        record, _ = _decode(raw)
        if record is not None:
            yield record


class Lock:
    """An exclusive lock so two controllers never change the testbed at once."""

    def __init__(self, directory: Path | None = None) -> None:
        self.path = (directory or state_dir()) / LOCK_NAME
        self._fh = None

    def __enter__(self) -> "Lock":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            check_state_dir(self.path.parent)
            self._fh = open(self.path, "a+")
        except OSError as exc:
            raise StateError(f"cannot open lock {self.path}: {exc.strerror or exc}",
                             hint="netbench needs root") from None
        try:
            fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._fh.close()
            raise StateError("another netbench command is changing the testbed",
                             hint="wait for it to finish, or stop it and run 'netbench reset'") from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


def resolve(journal: Journal, kind: str, **match: object) -> None:
    """Mark every pending `kind` entry whose data matches `match` as undone."""
    for entry in journal.pending():
        if entry.kind == kind and all(entry.data.get(k) == v for k, v in match.items()):
            journal.done(entry)
