"""Machine-wide holds on host-wide settings that several netbench instances may share.

A few of netbench's changes are not any one testbed's: the host's list of allowed TCP
congestion controls (testbed/congestion.py) and the cpu controller in the cgroup root's
subtree_control (emulation/cgroups.py). Two sweeps (two state folders, each with its own
journal) can widen the same one at once; the first to finish must not take it away from the
other. So each netbench that relies on such a change holds it: a file per holder under
`<HOLDS>/<setting>/`, named by the hold's id (kept in the holder's journal entry), saying which
process holds it (its pid and start time). Under the setting's lock (flock on
`<HOLDS>/<setting>.lock`), a change is made by the first holder and put back by the last
live one: a holder whose process is gone (a crashed sweep, whose own reset will come or not)
does not keep it. `HOLDS` is /run/netbench-holds, one per machine whatever the state folder
(NETBENCH_HOLDS_DIR moves it, for tests).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from netbench import proc
from netbench.errors import StateError

HOLDS_ENV = "NETBENCH_HOLDS_DIR"
DEFAULT_HOLDS = Path("/run/netbench-holds")


def holds_dir() -> Path:
    return Path(os.environ.get(HOLDS_ENV) or DEFAULT_HOLDS)


def _folder_name(setting: str) -> str:
    """A setting's name as one file name (a path's slashes and the like become '_')."""
    return re.sub(r"[^A-Za-z0-9_.=+-]", "_", setting)[:200]


class Holds:
    """The holders of each shared setting, in `root` (default: holds_dir())."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else holds_dir()

    @staticmethod
    def new_id() -> str:
        return secrets.token_hex(8)

    def _folder(self, setting: str) -> Path:
        return self.root / _folder_name(setting)

    @contextmanager
    def locked(self, setting: str) -> Iterator[None]:
        """The setting's lock, machine-wide: read, decide and change under it. A user who may
        not write the folder locks its file read-only; where there is no such file to lock, no
        netbench has held the setting (nothing to read, and only root changes host settings)."""
        path = self.root / (_folder_name(setting) + ".lock")
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o755)
            fh = open(path, "a+")
        except OSError:
            try:
                fh = open(path)
            except OSError:
                yield
                return
        with fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def add(self, setting: str, hold: str, pid: int | None = None) -> None:
        """`hold` is held by process `pid` (default: this one)."""
        pid = os.getpid() if pid is None else pid
        folder = self._folder(setting)
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o755)
            (folder / hold).write_text(json.dumps({"pid": pid, "start": proc.start_time(pid), "setting": setting}))
        except OSError as exc:
            raise StateError(f"cannot record a hold on {setting} in {folder}: {exc.strerror or exc}",
                             hint="netbench changes host-wide settings as root only") from None

    def remove(self, setting: str, hold: str) -> None:
        try:
            (self._folder(setting) / hold).unlink()
        except OSError:
            pass

    def holders(self, setting: str) -> dict[str, bool]:
        """Each hold on `setting` -> whether its process still runs."""
        out = {}
        try:
            entries = list(self._folder(setting).iterdir())
        except OSError:
            return out
        for path in entries:
            try:
                said = json.loads(path.read_text())
                out[path.name] = proc.is_same_process(int(said["pid"]), said.get("start"))
            except (OSError, ValueError, KeyError, TypeError):
                out[path.name] = False  # unreadable: no live holder can be named by it
        return out

    def held(self, setting: str) -> bool:
        """Whether any netbench holds `setting` (a crashed one too: its reset puts it back)."""
        return bool(self.holders(setting))

    def others_live(self, setting: str, hold: str | None = None) -> int:
        """How many holds other than `hold` a running process holds."""
        return sum(1 for name, live in self.holders(setting).items() if live and name != hold)

    def clear(self, setting: str) -> None:
        """Forget every hold on `setting` (the last live one is putting it back)."""
        for name in self.holders(setting):
            self.remove(setting, name)
        try:
            self._folder(setting).rmdir()
        except OSError:
            pass
