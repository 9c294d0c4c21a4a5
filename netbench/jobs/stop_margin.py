"""How far ahead of the last step heard a user's command is asked to stop.

netbench asks every rank of a command that checks `track.stop_requested()` to stop once it
has done a step count (jobs/user.py `request_stop`). Every rank must read that count before
it gets there: a rank that is already past it stops at its next check while a peer that
checked a moment earlier has started the next step and blocks in its collective until it
is killed. So the count lies beyond every step a rank can have reached when the request
arrives: the time since the last step heard ended on its rank (how late the controller
hears steps, and how long ago it heard the last), the time the request takes to reach the
ranks (a host's is carried over SSH), and a slack for scheduling, all over the step time
measured on the ranks (their own clocks: the spacing of the steps' ends).

`StepPace` keeps what that needs from the step events heard (behind a lock: ranks' reader
threads write it); `stop_margin` is the rule (pure).
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import deque
from dataclasses import dataclass, field

MIN_MARGIN_STEPS = 2  # the step a rank may be in, and one for a rank a step ahead of another
STOP_SLACK_S = 0.25  # beyond the lag measured: the controller's own scheduling, the ranks' reads
PACE_STEPS = 32  # the steps whose spacing gives the step time


def stop_margin(step_s: float | None, late_s: float, delivery_s: float = 0.0) -> int:
    """Steps past the last one heard at which every rank stops: enough that none has reached
    it when the request arrives. `step_s`: the ranks' step time (None: not known; then the
    minimum); `late_s`: how long before now the last step heard ended on its rank;
    `delivery_s`: how long the request takes to reach the ranks."""
    if step_s is None or not math.isfinite(step_s) or step_s <= 0:
        return MIN_MARGIN_STEPS + 1
    ahead_s = max(0.0, late_s) + max(0.0, delivery_s) + STOP_SLACK_S
    return MIN_MARGIN_STEPS + math.ceil(ahead_s / step_s)


def step_time(ends: list[float]) -> float | None:
    """The ranks' step time from consecutive steps' ends on one rank's clock: the median
    spacing (None with fewer than two, or no positive spacing)."""
    gaps = [b - a for a, b in zip(ends, ends[1:]) if b > a]
    return statistics.median(gaps) if gaps else None


@dataclass
class _Rank:
    ends: deque = field(default_factory=lambda: deque(maxlen=PACE_STEPS))  # its steps' ends, its clock
    offset_min: float = math.inf  # the least (heard - end) seen: its clock's offset plus the least lag
    offset_last: float = 0.0
    heard_last: float = 0.0  # when the controller heard its last step (the controller's clock)


class StepPace:
    """The step events heard from each rank: the step time and how late the last was heard.

    A rank's step end is on its own clock (a host's differs from the controller's), so the
    lag is measured against the least seen: (heard - end) - min(heard - end). The least lag
    itself (a pipe's, an SSH relay's) is within the slack, or in `delivery_s` for hosts.
    Ranks' reader threads call heard(); another thread asks (a lock between them)."""

    def __init__(self) -> None:
        self._ranks: dict[int, _Rank] = {}
        self._lock = threading.Lock()

    def heard(self, rank: int, end: float, at: float) -> None:
        """Rank `rank`'s step that ended at `end` (its clock) was heard at `at` (ours)."""
        with self._lock:
            state = self._ranks.setdefault(rank, _Rank())
            if state.ends and end <= state.ends[-1]:
                return  # not a later step (a rank's own numbering restarted, or a repeat)
            state.ends.append(end)
            state.offset_last = at - end
            state.offset_min = min(state.offset_min, state.offset_last)
            state.heard_last = at

    def step_s(self) -> float | None:
        """The shortest of the ranks' step times (the fastest gets furthest), None if unknown."""
        with self._lock:
            ends = [list(r.ends) for r in self._ranks.values()]
        times = [t for t in (step_time(e) for e in ends) if t is not None]
        return min(times) if times else None

    def late_s(self, now: float) -> float:
        """How long before `now` (our clock) the last step heard from each rank ended there,
        at most over the ranks: its lag when heard plus the time since."""
        with self._lock:
            return max(((r.offset_last - r.offset_min) + (now - r.heard_last) for r in self._ranks.values()
                        if r.ends), default=0.0)
