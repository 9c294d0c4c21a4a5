"""Signals that stop the controller, and clean-up that they must not cut short.

The command line turns SIGTERM and SIGHUP into KeyboardInterrupt, so a terminal that closes
or a `kill` takes the same path as Ctrl-C: stop the workers, put the network back, exit.
While that clean-up runs, `held_off()` keeps a second signal from interrupting it.
"""

from __future__ import annotations

import os
import signal
import threading

# the signals a user (or a closing terminal) sends to stop a sweep
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _forked_helper(main_pid: int) -> bool:
    """pyroute2 forks short-lived helpers that inherit the controller's handlers: they must
    just exit, never unwind into the controller's clean-up code."""
    return os.getpid() != main_pid


def as_interrupt(*signums: int) -> None:
    """From now on each of `signums` raises KeyboardInterrupt in the main thread."""
    main_pid = os.getpid()

    def raise_interrupt(signum, frame):
        if _forked_helper(main_pid):
            os._exit(0)
        raise KeyboardInterrupt

    for signum in signums:
        signal.signal(signum, raise_interrupt)


class held_off:
    """A block that SIGINT, SIGTERM and SIGHUP do not interrupt (clean-up).

    A signal that arrives meanwhile is remembered, and once the block is done (the previous
    handlers are back) it is raised as KeyboardInterrupt, so a sweep still stops, after its
    clean-up. Outside the main thread (where handlers cannot be set) it does nothing.
    """

    def __init__(self) -> None:
        self.caught: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "held_off":
        if threading.current_thread() is not threading.main_thread():
            return self
        main_pid = os.getpid()

        def remember(signum, frame):
            if _forked_helper(main_pid):
                os._exit(0)
            self.caught = signum

        for signum in STOPPING:
            self._previous[signum] = signal.signal(signum, remember)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()
        if self.caught is not None and exc_type is None:
            raise KeyboardInterrupt
