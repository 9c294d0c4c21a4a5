"""Running a schedule's timeline: each profile applied at its moment, lateness measured.

`run_schedule` is the loop (clock, sleep and the step source are injected, so tests drive it
with a fake clock); `PlanCache` plans each distinct profile once on a Target; `link_before`
reads the profile a schedule starts from and restores at the end.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, replace
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Sequence

from netbench import stats
from netbench.errors import UsageError
from netbench.model.profile import Profile, profile_from_mapping
from netbench.model.schedule import TimedProfile, due

FINE_WAIT_S = 0.002  # the last stretch before a change is one short sleep, not a coarse one
COARSE_CHUNK_S = 0.1  # the longest single sleep, so a stop event is seen within this
STEP_POLL_S = 0.05  # how often a step-triggered schedule asks for the current training step
LEAD_WINDOW = 5  # a timed change starts early by the median time of the last few changes
# apply --schedule's thread runs at SCHED_FIFO below the delay engines' (10): on a busy host
# a change then waits for the engines it asks, not for other processes' time slices
SCHEDULE_RT_PRIORITY = 5


@dataclass(frozen=True)
class Landed:
    """One change as it happened. Times are seconds from the schedule's start on its clock:
    `scheduled_s` when it was due (for a training-step trigger: when the step was seen),
    `started_s` when the apply began, `landed_s` when it returned; `lateness_s` = landed - scheduled."""

    index: int  # position in the timeline (-1: the schedule's base, in place before its first step)
    cycle: int  # the loop (0 without repeat)
    step: int  # the schedule step (or trace row) it comes from
    at_step: int | None
    scheduled_s: float
    started_s: float
    landed_s: float
    profile: Profile
    merged: tuple[int, ...] = ()  # timeline positions that were due before this one landed, skipped for it

    @property
    def lateness_s(self) -> float:
        return self.landed_s - self.scheduled_s


@dataclass(frozen=True)
class Lateness:
    changes: int
    mean_s: float
    p50_s: float
    p99_s: float
    max_s: float
    worst_s: float = 0.0  # the largest distance from its time, early or late


def lateness(landed: Sequence[Landed]) -> Lateness | None:
    """Mean, median, p99 and max lateness of the changes (None when none landed)."""
    values = [item.lateness_s for item in landed]
    if not values:
        return None
    return Lateness(changes=len(values), mean_s=statistics.fmean(values), p50_s=stats.percentile(values, 50),
                    p99_s=stats.percentile(values, 99), max_s=max(values), worst_s=max(abs(v) for v in values))


def _wait_until(deadline: float, clock: Callable[[], float], sleep: Callable[[float], None],
                stop: threading.Event | None) -> bool:
    """Sleep coarsely, then one short final sleep to `deadline`; False if `stop` was set first."""
    while True:
        if stop is not None and stop.is_set():
            return False
        remaining = deadline - clock()
        if remaining <= 0:
            return True
        sleep(min(remaining - FINE_WAIT_S, COARSE_CHUNK_S) if remaining > FINE_WAIT_S else remaining)


def _wait_for_step(target: int, current_step: Callable[[], int], sleep: Callable[[float], None],
                   stop: threading.Event | None) -> int | None:
    """The training step once it has reached `target`; None if `stop` was set first."""
    while (seen := current_step()) < target:
        if stop is not None and stop.is_set():
            return None
        sleep(STEP_POLL_S)
    return None if stop is not None and stop.is_set() else seen


def run_schedule(timeline: Sequence[TimedProfile], apply: Callable[[Profile], None], *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 repeat: bool = False, period_s: float | None = None,
                 current_step: Callable[[], int] | None = None,
                 on_change: Callable[[Landed], None] | None = None,
                 stop: threading.Event | None = None, already: Profile | None = None,
                 base: Profile | None = None, rehearse: bool = False) -> list[Landed]:
    """Apply each profile of `timeline` at its time (or once the training step reaches its
    at_step, asking `current_step`), in order; with `repeat`, loop every `period_s` (seconds,
    or training steps for a step-triggered timeline) until `stop` is set or the caller is
    interrupted. A profile equal to the one just applied (a loop's first step where the last
    one left the link) is not applied again; `already` is what the link holds at the start (an
    entry equal to it is not applied either). Returns what landed; `on_change` sees each.

    The profile in force at time 0 (the last entry due at 0, else `base`: a schedule's own
    profile, recorded with index -1) is in place before time 0: the clock starts once it has
    landed (starting a testbed's delay engines takes seconds). A change takes time to make
    (milliseconds per link): a timed change starts early by the median duration of the last
    LEAD_WINDOW changes, so it lands at its time rather than that much after it (lateness can
    then be slightly negative: early). A change whose successors are already due when it is
    made is merged into the last of them (model.schedule.due; `Landed.merged` lists them): the
    link goes straight to the state it should have now and the timeline never stretches.
    `rehearse` (timed schedules): before the clock starts, the profile the link holds then is
    applied once more (in place: nothing changes) and timed, so the first change starts early
    by what a change costs, as the later ones do (without it, it lands that much late)."""
    if not timeline:
        return []
    by_step = timeline[0].at_step is not None
    if by_step and current_step is None:
        raise UsageError("a schedule of training steps (at_step) needs the training run's step count",
                         hint="run it within a sweep, or use at: times")
    if repeat and not (period_s and period_s > 0):
        raise UsageError("a repeating schedule needs a period above 0", hint="e.g. 'period: 10s'")
    landed: list[Landed] = []
    last: Profile | None = already
    durations: list[float] = []
    first, start = 0, None
    if not by_step and timeline[0].at_s > 0 and base is not None and (last is None or not _same_link(base, last)):
        began = clock()
        apply(base)
        last, start = base, clock()
        _record(landed, on_change, Landed(index=-1, cycle=0, step=0, at_step=None, scheduled_s=0.0,
                                          started_s=began - start, landed_s=0.0, profile=base))
    elif not by_step and timeline[0].at_s <= 0:
        first = due(timeline, 0, 0.0) + 1
        entry = timeline[first - 1]
        if last is None or not _same_link(entry.profile, last):
            began = clock()
            apply(entry.profile)  # its duration (engines starting) is not a change's: no lead from it
            last, start = entry.profile, clock()
            _record(landed, on_change, Landed(index=first - 1, cycle=0, step=entry.step, at_step=None, scheduled_s=0.0,
                                              started_s=began - start, landed_s=0.0, profile=entry.profile,
                                              merged=tuple(range(first - 1))))
    if rehearse and not by_step and last is not None:
        began = clock()
        apply(last)
        durations.append(clock() - began)
        start = None  # the clock starts after the rehearsal
    start = clock() if start is None else start
    held_compute = timeline[first - 1].compute if first else ()
    cycle = 0
    while True:
        offset = cycle * period_s if repeat else 0
        index = first if cycle == 0 else 0
        while index < len(timeline):
            entry = timeline[index]
            if by_step:
                seen = _wait_for_step(int(entry.at_step + offset), current_step, sleep, stop)
                if seen is None:
                    return landed
                target = due(timeline, index, seen, offset)
                scheduled = clock() - start
            else:
                lead = statistics.median(durations[-LEAD_WINDOW:]) if durations else 0.0
                if not _wait_until(start + entry.at_s + offset - lead, clock, sleep, stop):
                    return landed
                target = due(timeline, index, clock() - start + lead, offset)
                scheduled = timeline[target].at_s + offset
            merged, index, entry = tuple(range(index, target)), target + 1, timeline[target]
            if last is not None and _same_link(entry.profile, last) and entry.compute == held_compute:
                continue  # (a node's capacity change is a change even where the link stays)
            held_compute = entry.compute
            began = clock() - start
            apply(entry.profile)
            done = clock() - start
            durations.append(done - began)
            last = entry.profile
            at_step = None if not by_step else int(entry.at_step + offset)
            _record(landed, on_change, Landed(index=target, cycle=cycle, step=entry.step, at_step=at_step,
                                              scheduled_s=scheduled, started_s=began, landed_s=done,
                                              profile=entry.profile, merged=merged))
        if not repeat or (stop is not None and stop.is_set()):
            return landed
        cycle += 1


def _record(landed: list[Landed], on_change: Callable[[Landed], None] | None, item: Landed) -> None:
    landed.append(item)
    if on_change is not None:
        on_change(item)


def _same_link(a: Profile, b: Profile) -> bool:
    return replace(a, name="", description="") == replace(b, name="", description="")


class PlanCache:
    """Plans each distinct profile once on `target` (a testbed.base.Target), then applies the
    cached plan: the schedule's changes cost only the apply."""

    def __init__(self, target: Any, backend: str) -> None:
        self.target = target
        self.backend = backend
        self.plans: dict[Profile, Any] = {}

    def plan(self, profile: Profile) -> Any:
        if profile not in self.plans:
            self.plans[profile] = self.target.plan(profile, self.backend)
        return self.plans[profile]

    def apply(self, profile: Profile) -> None:
        self.target.apply_plan(self.plan(profile))


def link_before(shown: dict[str, Any]) -> Profile:
    """The one profile every node holds now (from a Target's show()), which a schedule starts
    from and puts back at the end; an unshaped link is Profile(name="none"), which clears."""
    from netbench.testbed.base import common_profile

    rows = list(shown.get("nodes", []))
    if not rows:
        raise UsageError("no testbed is up", hint="start one with 'netbench testbed up'")
    held = [row.get("profile") for row in rows]
    if all(profile is None for profile in held):
        return Profile(name="none")
    if any(profile != held[0] for profile in held):
        raise UsageError("flag --schedule: the nodes hold different profiles, so there is no one link to start "
                         "from and put back", hint="apply one profile to every node first, or 'netbench reset'")
    return profile_from_mapping(common_profile(shown), "read-back")


class RunDriver:
    """Drives a run's schedule (its timeline after the first profile) while the job trains.

    The runner feeds it the job's events (`event`): the chief's (worker 0's) first measured
    step starts a background thread running `run_schedule` from that moment (times are
    relative to it; `at_step` N is due once the chief has finished N measured steps).
    `apply(profile)` makes each change; `on_change(landed)` hears each. `stop()` ends the
    thread and waits for it (a change being made finishes first); call it however the run
    ends. `error` holds what stopped the thread early, if anything."""

    def __init__(self, schedule: Any, entries: Sequence[TimedProfile], start: Profile,
                 apply: Callable[[Profile], None], on_change: Callable[[Landed], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] | None = None,
                 hold: Callable[[], ContextManager[Any]] | None = None) -> None:
        self.schedule, self.entries, self.start_profile = schedule, tuple(entries), start
        self.apply, self.on_change, self.clock = apply, on_change, clock
        self.hold = hold  # entered on the schedule's thread for its life (the target's sockets for it)
        self.sleep = sleep
        self.landed: list[Landed] = []
        self.error: str | None = None
        self.steps = 0  # measured steps the chief has finished
        self.measuring_since: float | None = None  # wall time (time.time()) measuring began
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def event(self, event: Any) -> None:
        from netbench.jobs import events as ev

        if not isinstance(event, ev.Step) or event.worker != 0 or event.task_role != "worker" or not event.measured:
            return
        self.steps += 1
        if self._thread is None and not self._stop.is_set():
            self.measuring_since = time.time()
            self._thread = threading.Thread(target=self._drive, name="netbench-schedule", daemon=True)
            self._thread.start()

    def _drive(self) -> None:
        sleep = self.sleep or (lambda s: self._stop.wait(s))
        try:
            with self.hold() if self.hold is not None else nullcontext():
                self._run(sleep)
        except Exception as exc:  # noqa: BLE001 - recorded and reported by the runner
            self.error = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"

    def _run(self, sleep: Callable[[float], None]) -> None:
        run_schedule(self.entries, self.apply, clock=self.clock, sleep=sleep, repeat=self.schedule.repeat,
                     period_s=self.schedule.cycle if self.schedule.repeat else None,
                     current_step=lambda: self.steps, on_change=self._landed, stop=self._stop,
                     already=self.start_profile)

    def _landed(self, item: Landed) -> None:
        self.landed.append(item)
        if self.on_change is not None:
            self.on_change(item)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def record(self) -> dict[str, Any]:
        """The run record's `schedule` section: the schedule, and every change as it landed."""
        summary = lateness(self.landed)
        return {
            "name": self.schedule.name, "source": self.schedule.source, "by_step": self.schedule.by_step,
            "repeat": self.schedule.repeat, "entries": len(self.entries), "start": self.start_profile.to_record(),
            "measuring_started": self.measuring_since,
            "changes": [{"index": item.index, "cycle": item.cycle, "step": item.step, "at_step": item.at_step,
                         "scheduled_s": round(item.scheduled_s, 6), "started_s": round(item.started_s, 6),
                         "landed_s": round(item.landed_s, 6), "lateness_ms": round(item.lateness_s * 1000, 3),
                         "merged": [{"index": i, "step": self.entries[i].step, "when": self.entries[i].when}
                                    for i in item.merged],
                         "profile": item.profile.to_record(),
                         # the node capacity changes so far (model.schedule.TimedProfile.compute), where any
                         **({"compute": [list(c) for c in self.entries[item.index].compute]}
                            if item.index >= 0 and self.entries[item.index].compute else {})}
                        for item in self.landed],
            "lateness_ms": None if summary is None else {
                "changes": summary.changes, "mean": round(summary.mean_s * 1000, 3),
                "p99": round(summary.p99_s * 1000, 3), "max": round(summary.max_s * 1000, 3)},
            "error": self.error,
        }
