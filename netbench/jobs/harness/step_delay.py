"""A node's step delay, inside a rank: compute time added to each of its steps (stdlib only).

The controller gives a rank NETBENCH_STEP_DELAY_S (seconds, at its start) and
NETBENCH_STEP_DELAY_FILE (a file holding the seconds in force, replaced whole when a point or a
schedule changes it). `StepDelay.pause()` is called in a step's compute part: it reads the
file again only when the file changed (one stat a step) and sleeps that long, so the delay
counts as compute, as a slower accelerator's would. netbench.track keeps a copy of this logic
(it imports nothing of netbench).
"""

from __future__ import annotations

import os
import time
from typing import Mapping

ENV_SECONDS = "NETBENCH_STEP_DELAY_S"
ENV_FILE = "NETBENCH_STEP_DELAY_FILE"


def _seconds(text: str | None) -> float:
    try:
        value = float((text or "").strip() or 0)
    except ValueError:
        return 0.0
    return value if 0 < value < 3600 else 0.0


class StepDelay:
    def __init__(self, environ: Mapping[str, str] = os.environ) -> None:
        self.seconds = _seconds(environ.get(ENV_SECONDS))
        self.file = environ.get(ENV_FILE, "")
        self._seen: tuple[int, int] | None = None  # the file's (inode, mtime_ns) last read

    def current(self) -> float:
        """The delay in force (the file's, once it exists; else the start's)."""
        if self.file:
            try:
                st = os.stat(self.file)
            except OSError:
                return self.seconds
            seen = (st.st_ino, st.st_mtime_ns)
            if seen != self._seen:
                try:
                    with open(self.file, encoding="ascii") as fh:
                        self.seconds = _seconds(fh.read())
                    self._seen = seen
                except OSError:
                    pass
        return self.seconds

    def pause(self) -> float:
        """Sleep the delay in force; the seconds slept."""
        seconds = self.current()
        if seconds > 0:
            time.sleep(seconds)
        return seconds


def write(path: str, seconds: float) -> None:
    """Set the delay a node's ranks add (the controller's side): the file replaced whole."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="ascii") as fh:
        fh.write(f"{seconds:.6f}\n")
    os.replace(tmp, path)
