"""A launch's point measured in bytes on its nodes' links (a user's command that reports no steps).

`meter_for` arms a `LinkMeter` for the first point of a launch of a user's command without a
step regex, on a target that can read its nodes' interface counters (`link_counters(nodes)`:
node -> (rx_bytes, tx_bytes)). The launch's reading loop (experiment/launch.py) polls it
between events: it samples the counters when its `BytesWindow` (jobs/link_bytes.py) wants a
sample, and ends the point when the window is over. Any track event disarms it: the job
reports steps, and the point is measured from them.
"""

from __future__ import annotations

import time
from typing import Callable, Mapping, Sequence

from netbench.errors import NetbenchError
from netbench.jobs.link_bytes import BytesWindow, LinkSample, reports_steps

Reader = Callable[[], Mapping[str, tuple[int, int]]]


class LinkMeter:
    """Samples a launch's link counters into a BytesWindow; see the module docstring."""

    def __init__(self, read: Reader, window: BytesWindow, clock=time.monotonic, wall=time.time,
                 note: Callable[[str], None] | None = None) -> None:
        """note: told once, when the job's bytes begin and no step event has come (the live view)."""
        self.read, self.window, self.clock, self.wall, self.tell = read, window, clock, wall, note
        self.armed = True  # False once the job said it reports steps
        self.started_wall: float | None = None  # the first sample's time, as Unix time
        self.link: dict | None = None  # the record's link_bytes once the window is over
        self.note = ""  # why the links could not be measured (added to a timeout's error)

    def heard(self, event) -> None:
        """An event of the job: one that says it reports steps disarms the meter."""
        if self.armed and reports_steps(event):
            self.armed = False

    def poll(self, startup_s: float) -> tuple[str, str] | None:
        """Sample if a sample is due; (status, error) once the point is over, else None. A reading
    that fails disarms the meter (the point waits for steps, and a timeout says why)."""
        now = self.clock()
        if self.window.wait(now) <= 0:
            try:
                counters = self.read()
            except (OSError, NetbenchError) as exc:
                # the job may still report steps (its track import may come later): wait for them
                self.armed = False
                self.note = f"; its links' bytes could not be read either: {getattr(exc, 'message', exc)}"
                return None
            if self.started_wall is None:
                self.started_wall = self.wall()
            was_active = self.window.active_at is not None
            self.window.add(LinkSample.of(now, counters))
            if self.tell is not None and not was_active and self.window.active_at is not None:
                self.tell(f"no step events, bytes on the links: measuring them ({self.window.warmup_s:g} s warm-up, "
                          f"then {self.window.window_s:g} s; a job that imports netbench.track reports steps instead)")
        if self.window.done:
            try:
                self.link = self.window.result(self.started_wall)
            except ValueError as exc:
                return "failed", str(exc)
            return "ok", ""
        deadline = self.window.deadline(startup_s)
        if deadline is not None and now > deadline:
            if self.window.active_at is None:
                return "timeout", (f"no step events and under {self.window.active_bytes} bytes on the job's links "
                                   f"within {startup_s:g}s")
            return "timeout", "the links' byte window did not end in time"
        return None

    def wait(self) -> float:
        """Seconds until the next sample is due."""
        return self.window.wait(self.clock())

    def window_wall(self) -> tuple[float, float]:
        """The measured window as Unix times (once done)."""
        return self.link["window_start_wall"], self.link["window_end_wall"]


def meter_for(job, testbed, nodes: Sequence[str], note: Callable[[str], None] | None = None) -> LinkMeter | None:
    """A meter for the first point of a launch of `job` on `nodes` (None: not a user's command,
    one with a step regex, or a target that cannot read its links' counters); `note`: LinkMeter's."""
    command = getattr(job, "command", None)
    read = getattr(testbed, "link_counters", None)
    if command is None or command.step_regex or read is None:
        return None
    names = list(dict.fromkeys(nodes))
    return LinkMeter(lambda: read(names), BytesWindow(job.warmup, job.seconds), note=note)
