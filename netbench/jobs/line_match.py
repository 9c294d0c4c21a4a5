"""A user's `--step-regex` run on rank 0's output lines away from the controller's threads.

Python's `re` holds the GIL while it matches, and a pattern that backtracks (`(a+)+$`) on a
long line (a progress bar that redraws itself for minutes without a newline) can match for
hours: run in the controller's reader thread, it froze every thread of the controller
(timeouts, schedules, Ctrl-C). So:

* the pattern sees at most the last `MAX_LINE_CHARS` characters of a line (what a line ends
  with: a step line printed after a progress bar's redraws is at its end);
* it runs in a small process of its own (`python -I -S`: the standard library only, no
  netbench), one line at a time, while the reader thread waits without the GIL; a line
  whose match takes longer than `MATCH_TIMEOUT_S` is no step: that process is killed and
  the next line gets a new one (`given_up` counts them).
"""

from __future__ import annotations

import json
import select
import subprocess
import sys

from netbench import proc

MAX_LINE_CHARS = 4096  # the end of a line the pattern sees
MATCH_TIMEOUT_S = 0.5  # a line's match takes longer: no step (a plain pattern takes microseconds)
STARTUP_S = 10.0  # a new matcher process's start, on top of its first line's match

# the matcher: one JSON string per line in, the match's named groups (or null) per line out
_MATCHER = """
import json, re, sys
pattern = re.compile(sys.argv[1])
for line in sys.stdin:
    found = pattern.search(json.loads(line))
    sys.stdout.write(json.dumps(None if found is None else found.groupdict()) + "\\n")
    sys.stdout.flush()
"""


def bounded(line: str) -> str:
    """The part of `line` a step regex sees: its last MAX_LINE_CHARS characters."""
    return line[-MAX_LINE_CHARS:]


class LineMatcher:
    """`pattern` searched in lines by a process of its own (see the module docstring). Used
    by one thread at a time (a rank's reader)."""

    def __init__(self, pattern: str, timeout_s: float = MATCH_TIMEOUT_S) -> None:
        self.pattern, self.timeout_s = pattern, timeout_s
        self.given_up = 0  # lines whose match took longer than timeout_s
        self._proc: subprocess.Popen | None = None
        self._fresh = False

    def search(self, line: str) -> dict[str, str | None] | None:
        """The named groups of the pattern's first match in the line's last MAX_LINE_CHARS
        characters ({} for a match without any); None: no match, or none within timeout_s."""
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        matcher = self._proc
        assert matcher is not None and matcher.stdin is not None and matcher.stdout is not None
        wait = self.timeout_s + (STARTUP_S if self._fresh else 0.0)
        self._fresh = False
        try:
            matcher.stdin.write((json.dumps(bounded(line)) + "\n").encode())
            matcher.stdin.flush()
            ready = select.select([matcher.stdout], [], [], wait)[0]
            reply = matcher.stdout.readline() if ready else b""
        except (OSError, ValueError):
            reply = b""
            ready = [True]
        if not ready:
            self.given_up += 1
        if not reply:
            self.close()
            return None
        return json.loads(reply)

    def _start(self) -> None:
        self.close()
        self._proc = proc.spawn([sys.executable, "-I", "-S", "-c", _MATCHER, self.pattern],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._fresh = True

    def close(self) -> None:
        """End the matcher process (a new one starts on the next search)."""
        matcher, self._proc = self._proc, None
        if matcher is None:
            return
        for stream in (matcher.stdin, matcher.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        proc.stop(matcher, grace=0.0)
