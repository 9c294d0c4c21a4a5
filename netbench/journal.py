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

    def _append(self, record: dict[str, Any]) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a+b") as fh:
                fh.seek(0, os.SEEK_END)
                if fh.tell() > 0:
                    fh.seek(-1, os.SEEK_END)
                    if fh.read(1) != b"\n":  # a torn last line: never glue a record onto it
                        fh.write(b"\n")
                fh.write((json.dumps(record, sort_keys=True) + "\n").encode("utf-8"))
                fh.flush()
                os.fsync(fh.fileno())
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
        """
        created: dict[str, Entry] = {}
        for record in self._records():
            if record.get("op") == "create":
                created[record["id"]] = Entry(record["id"], record["kind"], record.get("data", {}))
            elif record.get("op") == "done":
                created.pop(record.get("id"), None)
        return list(created.values())

    def _records(self) -> Iterator[dict[str, Any]]:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StateError(f"cannot read journal {self.path}: {exc.strerror or exc}") from None
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "id" in record:
                yield record

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
