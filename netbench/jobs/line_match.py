"""A user's `--step-regex` run on rank 0's output lines away from the controller's threads.

Python's `re` holds the GIL while it matches, and a pattern that backtracks (`(a+)+$`) on a
long line (a progress bar that redraws itself for minutes without a newline) can match for
hours: run in the controller's reader thread, it froze every thread of the controller
(timeouts, schedules, Ctrl-C). So:

* the pattern sees at most the last `MAX_LINE_CHARS` characters of a line (what a line ends
  with: a step line printed after a progress bar's redraws is at its end);
* it runs in a small process of its own (`python -I -S`: the standard library only, no
  netbench), which answers lines in order;
* lines stream to it: `put` queues a line and writes what the pipe takes without waiting
  (a non-blocking pipe: no thread ever blocks on a matcher that is stuck), so a line's match
  starts as soon as the one before it is answered, not a round trip after the controller
  read it; `take` returns the answers in order, each within `MATCH_TIMEOUT_S` of the moment
  its match could start. A line that takes longer is given up (no step): that process is
  killed, a new one starts, and the lines after it are sent again (`given_up` counts them).

One thread puts (a rank's reader), one takes; `search` does both for one line.
"""

from __future__ import annotations

import collections
import errno
import fcntl
import json
import os
import select
import subprocess
import sys
import threading
import time

from netbench import proc

MAX_LINE_CHARS = 4096  # the end of a line the pattern sees
MATCH_TIMEOUT_S = 0.5  # a line's match takes longer: no step (a plain pattern takes microseconds)
STARTUP_S = 10.0  # a new matcher process's start, on top of its first line's match
MAX_QUEUED = 256  # lines put and not yet taken: a reader that gets this far ahead waits

# the matcher: one JSON string per line in, the match's named groups (or null) per line out
_MATCHER = """
import json, re, sys
pattern = re.compile(sys.argv[1])
for line in sys.stdin:
    found = pattern.search(json.loads(line))
    sys.stdout.write(json.dumps(None if found is None else found.groupdict()) + "\\n")
    sys.stdout.flush()
"""

GIVEN_UP = object()  # take()'s answer for a line whose match took longer than the timeout


def bounded(line: str) -> str:
    """The part of `line` a step regex sees: its last MAX_LINE_CHARS characters."""
    return line[-MAX_LINE_CHARS:]


class LineMatcher:
    """`pattern` searched in lines by a process of its own (see the module docstring)."""

    def __init__(self, pattern: str, timeout_s: float = MATCH_TIMEOUT_S, clock=time.monotonic) -> None:
        self.pattern, self.timeout_s, self.clock = pattern, timeout_s, clock
        self.given_up = 0  # lines whose match took longer than timeout_s
        self._proc: subprocess.Popen | None = None
        self._fresh = False  # the process has not answered its first line yet
        self._lines: collections.deque[bytes] = collections.deque()  # put, not yet taken (encoded)
        self._out = bytearray()  # what the pipe has not taken yet
        self._replies = bytearray()  # read, not yet split into lines
        self._since = 0.0  # when the oldest line's match could start (its put, or the answer before)
        self._lock = threading.Condition()

    # -- the putting side -------------------------------------------------------------------

    def put(self, line: str) -> None:
        """Queue `line` for matching; never waits on the matcher (only, past MAX_QUEUED lines
        not yet taken, for the taking side to catch up)."""
        data = (json.dumps(bounded(line)) + "\n").encode()
        with self._lock:
            while len(self._lines) >= MAX_QUEUED:
                self._lock.wait()
            if not self._lines:
                self._since = self.clock()
            self._lines.append(data)
            if self._proc is None or self._proc.poll() is not None:
                self._restart()  # sends every line queued, this one included
            else:
                self._out += data
                self._flush()
            self._lock.notify_all()

    # -- the taking side --------------------------------------------------------------------

    def take(self) -> dict | None | object:
        """The oldest line's answer: its named groups ({} for a match without any), None for
        no match, GIVEN_UP when the match took longer than the timeout. Waits for a line to
        be put first."""
        with self._lock:
            while not self._lines:
                self._lock.wait()
        while True:
            with self._lock:
                answer = self._answer()
                if answer is not None:
                    return answer[0]
                matcher, deadline = self._proc, self._since + self.timeout_s + (STARTUP_S if self._fresh else 0.0)
                writing = [matcher.stdin] if self._out and matcher is not None else []
            left = deadline - self.clock()
            if matcher is None or left <= 0:
                return self._give_up(matcher)
            try:
                select.select([matcher.stdout], writing, [], left)
            except (OSError, ValueError):  # closed meanwhile: read below finds it
                pass
            with self._lock:
                if matcher is self._proc and not self._read(matcher):
                    if self._answer(peek=True) is None:  # ended without the answer
                        self._proc = None

    def search(self, line: str) -> dict | None:
        """One line put and taken: its groups, or None (no match, or given up)."""
        self.put(line)
        answer = self.take()
        return None if answer is GIVEN_UP else answer

    def _answer(self, peek: bool = False) -> tuple | None:
        """(the oldest line's answer,) once its reply line is in; popped unless `peek`."""
        end = self._replies.find(b"\n")
        if end < 0:
            return None
        if peek:
            return (True,)
        reply = bytes(self._replies[:end])
        del self._replies[:end + 1]
        self._lines.popleft()
        self._fresh = False
        self._since = self.clock()  # the next line's match starts now
        self._lock.notify_all()
        try:
            return (json.loads(reply),)
        except ValueError:
            return (None,)

    def _give_up(self, matcher) -> object:
        if matcher is not None:
            matcher.kill()  # a write or read of the other side wakes with an error
        with self._lock:
            self.given_up += 1
            self._lines.popleft()
            self._close_locked()
            if self._lines:
                self._since = self.clock()
                self._restart()  # the lines after it, again
            self._lock.notify_all()
        return GIVEN_UP

    # -- the process and its pipes (under the lock) -------------------------------------------

    def _restart(self) -> None:
        self._close_locked()
        self._proc = proc.spawn([sys.executable, "-I", "-S", "-c", _MATCHER, self.pattern],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        for stream in (self._proc.stdin, self._proc.stdout):
            fd = stream.fileno()
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        self._fresh = True
        self._replies.clear()
        self._out = bytearray(b"".join(self._lines))
        self._flush()

    def _flush(self) -> None:
        """Write what the pipe takes now (a full pipe: the rest later, when take() waits)."""
        matcher = self._proc
        while self._out and matcher is not None:
            try:
                sent = os.write(matcher.stdin.fileno(), self._out)
            except BlockingIOError:
                return
            except OSError:  # the matcher died: take() finds it
                return
            del self._out[:sent]

    def _read(self, matcher) -> bool:
        """Read what the matcher answered; False once its output has ended."""
        self._flush()
        while True:
            try:
                chunk = os.read(matcher.stdout.fileno(), 65536)
            except BlockingIOError:
                return True
            except OSError as exc:
                return exc.errno == errno.EINTR
            if not chunk:
                return False
            self._replies += chunk

    def _close_locked(self) -> None:
        matcher, self._proc = self._proc, None
        self._out.clear()
        self._replies.clear()
        if matcher is None:
            return
        for stream in (matcher.stdin, matcher.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        proc.stop(matcher, grace=0.0)

    def close(self) -> None:
        """End the matcher process (a new one starts on the next line put)."""
        with self._lock:
            self._close_locked()
