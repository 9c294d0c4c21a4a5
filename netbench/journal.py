"""The on-disk journal: every change is recorded *before* it is made.

`netbench reset` replays the journal backwards and undoes what is still there, so it
works after the controller was killed with SIGKILL at any moment. Entries are JSON
lines, fsynced on write. A `done` line marks an entry as undone; once every entry is
undone the journal is truncated.

The state directory defaults to /run/netbench: like the namespaces and processes it
tracks, it does not survive a reboot. NETBENCH_STATE_DIR overrides it (tests do).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from netbench.errors import StateError

JOURNAL_NAME = "journal.jsonl"
LOCK_NAME = "lock"


def state_dir() -> Path:
    return Path(os.environ.get("NETBENCH_STATE_DIR", "/run/netbench"))


@dataclass(frozen=True)
class Entry:
    """One recorded change: `kind` says how to undo it, `data` what it touched."""

    id: str
    kind: str  # netns | process | qdisc | iptables
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

    def _append(self, record: dict[str, Any]) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
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
        except OSError as exc:
            raise StateError(f"cannot write journal {self.path}: {exc.strerror or exc}",
                             hint="netbench needs root; set NETBENCH_STATE_DIR to a writable folder") from None

    def record(self, kind: str, **data: Any) -> Entry:
        """Write the intent to create something; call before creating it."""
        entry = Entry(id=uuid.uuid4().hex[:12], kind=kind, data=data)
        self._append({"op": "create", "id": entry.id, "kind": kind, "data": data, "time": time.time()})
        return entry

    def done(self, entry: Entry | str) -> None:
        """Mark an entry undone (the thing it created is gone)."""
        entry_id = entry.id if isinstance(entry, Entry) else entry
        self._append({"op": "done", "id": entry_id, "time": time.time()})

    def pending(self) -> list[Entry]:
        """Entries whose creation was recorded and not yet undone, oldest first.

        A torn last line (power cut mid-write) is ignored: its change was never started.
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
        for record in _parse(complete.decode("utf-8", "replace").splitlines()):
            self._apply(record)
        self._parsed += len(complete)

    def _records(self) -> Iterator[dict[str, Any]]:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StateError(f"cannot read journal {self.path}: {exc.strerror or exc}") from None
        yield from _parse(lines)

    def compact(self) -> None:
        """Rewrite the journal with only pending entries; remove it when none are left."""
        pending = self.pending()
        if not pending:
            self.path.unlink(missing_ok=True)
            return
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            for entry in pending:
                fh.write(json.dumps({"op": "create", "id": entry.id, "kind": entry.kind,
                                     "data": entry.data}, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)


def _parse(lines: list[str]) -> Iterator[dict[str, Any]]:
    """The journal records among `lines`; a line that is not one (torn, garbage) is skipped."""
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "id" in record:
            yield record


class Lock:
    """An exclusive lock so two controllers never change the testbed at once."""

    def __init__(self, directory: Path | None = None) -> None:
        self.path = (directory or state_dir()) / LOCK_NAME
        self._fh = None

    def __enter__(self) -> "Lock":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
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
