"""Launches: one start of a job's processes serving many network points.

A sweep's runs that share a job configuration (everything but the network: strategy, model,
batch, workers, ps, data, accumulation, warm-up and window) and a repetition form one
*launch*: the controller starts the job's processes once, with ``--until-stopped``, and
moves them through the launch's points (`plan_launches`; the order's seed is recorded).
For each point it applies the profile in place, drops the chief's steps that overlap the
change plus a settle window (`Settle`: at least `steps` steps AND at least `seconds` after
the change, or a few round trips where that is shorter, AND until the step time is steady:
experiment/settling.py; the dropped steps are kept with phase
"settle"), measures the next `job.steps` steps (or `job.seconds`; with `job.precision`, more
until the mean step time is known to it or `job.max_seconds` have passed), and goes on
(`PointWindow` decides each step).

Launches go "descending" by default: a job configuration's points are cut into chains in
which every change only narrows the path (rate and delay and jitter lower or the same, loss
higher or the same: `follows`), as few chains as a first-fit over the points sorted widest
first gives, and each chain is one launch (ties in a seeded random order). The job's TCP
connections live through the whole launch and carry their congestion state from point to
point, and every change that widens the path is biased (bench/tcp_carryover.py: cubic leaves
slow start early on a short path and grows slowly after; bbr sizes its window by the shortest
round trip of the last 10 s and probes for more rate 25 % per cycle). Measured here, 50 ms at
1gbit gave 364 img/s right after 1 ms at 1gbit against 485 under --isolate, and 341 after a
warm-up on unshaped links (so a launch starts on its first point, not unshaped); in chains
that only narrow, all six points of the same sweep came within 0.96-1.07 of --isolate.
"random" puts every point of a configuration in one launch, shuffled (the textbook
split-plot; it measures the carry-over, and is biased wherever a point follows a narrower one).
"""

from __future__ import annotations

import bisect
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from netbench import stats
from netbench.experiment import settling
from netbench.experiment.link_window import LinkMeter, meter_for
from netbench.experiment.settling import Settle  # noqa: F401 - its home before settling.py; callers import it here
from netbench.jobs import events as ev
from netbench.jobs.launch import JobOutcome, TaskLost, exchange_env
from netbench.jobs.live import JobBroken, LiveJob
from netbench.jobs.user import UserSpawner, checks_stop
from netbench.model.job import OWN_PACE_STRATEGIES, JobSpec, plan_job
from netbench.model.run import Run

from netbench.experiment.launch_plan import (ORDERS, LaunchPlan, describe_launches, descending_chains,  # noqa: F401
                                             follows, group_key, head_cost_s, plan_launches, run_follows)

UNTIL_STOPPED = "--until-stopped"
PORT_RANGE = (20000, 60000)
LATER = "later"  # not a phase: another task's step that belongs to the next point (it is carried)
OTHERS_LEAST = 2  # an own-pace point's window lasts until every other worker has this many measured steps


def controller_start(step: ev.Step) -> float:
    """When the step started on the controller's monotonic clock: its arrival less its duration
    (workers' clocks need not be the controller's)."""
    if step.recv is None:
        return step.start
    return step.recv - (step.end - step.start)


def wall_time(monotonic: float) -> float:
    """A time on the controller's monotonic clock as Unix time (seconds), as of now."""
    return time.time() - (time.monotonic() - monotonic)


def measured_window(events) -> tuple[float, float] | None:
    """(start, end) in Unix time of the measured steps among one process's `events`: the
    first one's start and the last one's arrival on the controller; None without any."""
    steps = sorted((e for e in events if isinstance(e, ev.Step) and e.phase == ev.PHASE_MEASURED),
                   key=lambda e: e.step)
    if not steps:
        return None
    last = steps[-1]
    return wall_time(controller_start(steps[0])), wall_time(last.recv if last.recv is not None else last.end)


class PointWindow:
    """Which of a launch's steps belong to one point, and in which phase (pure).

    Feed it the chief's steps in order (`chief`); `place` gives any other task's step its
    phase: by the chief's step of the same number where the workers leave each step together,
    by when it ran where they step at their own pace (`by_time`: OWN_PACE_STRATEGIES, whose
    step numbers drift apart). Warm-up steps stay warm-up (and count as settled steps: the
    first point of a launch is applied before the processes start).

    With `by_time`, the window starts only once every other worker (`others`) has been heard
    past its warm-up (`heard`: a worker slowed by its node's limits starts seconds late, and the
    chief alone is another cluster), and lasts until each has OTHERS_LEAST measured steps of its
    own (or max_seconds have passed), so a slow worker's rate is measured in the point, never
    left out of the cluster's images/sec."""

    def __init__(self, changed_at: float, settle: Settle, steps: int, seconds: float | None = None,
                 precision: float | None = None, max_seconds: float = 60.0, rtt_s: float | None = None,
                 by_time: bool = False, others: tuple = (), widened: bool = False,
                 change_floor_s: float = 0.0) -> None:
        self.changed_at, self.settle, self.steps, self.seconds = changed_at, settle, steps, seconds
        # the path's round trip (None: unknown); a change that widened the path (settling.widens)
        # settles only once its steps stop falling, and waits at least what its kind's transient
        # lasts (settling.change_floor_s: bbr after a longer round trip)
        self.rtt_s, self.widened, self.change_floor_s = rtt_s, widened, change_floor_s
        self.floor_s, self.why = max(settle.floor_s(rtt_s), change_floor_s), None
        # with a precision, `steps`/`seconds` is the least window: it goes on until the mean step
        # time is known to it (stats.steps_to_precision) or has lasted max_seconds
        self.precision, self.max_seconds = precision, max_seconds
        self.measured_durations: list[float] = []  # the chief's measured steps, in order
        self._next_check = 0  # the measured step count at which precision is checked next
        self._finished = False
        self.phase_of: dict[int, str] = {}
        self.first_index: int | None = None
        self.after = 0  # chief steps started after the change
        self.dropped = 0  # chief steps dropped to settle
        self.measured = 0
        self.window_start: float | None = None
        self.window_end: float | None = None
        self.last_index: int | None = None
        self.durations: list[float] = []  # the chief's settle steps started after the change
        self.warmed = False  # warm-up steps came in this point (a launch's first): they settled it
        self.by_time = by_time
        self.others_measured = {key: 0 for key in others} if by_time else {}  # (role, index) -> measured steps
        self.others_waiting = set(others) if by_time else set()  # not heard past their warm-up yet

    @property
    def done(self) -> bool:
        if self._finished:
            return True
        if self.window_start is None or self.window_end is None:
            return False
        if self.seconds:
            least = self.window_end - self.window_start >= self.seconds
        else:
            least = self.measured >= self.steps
        self._finished = least and self._others_in() and (not self.precision or self._precise())
        return self._finished

    def _others_in(self) -> bool:
        """Whether every other worker of an own-pace point has its least measured steps (or the
        window has lasted max_seconds: a worker that stopped stepping must not hold it forever)."""
        if all(n >= OTHERS_LEAST for n in self.others_measured.values()):
            return True
        return self.window_end - self.window_start >= self.max_seconds

    def _precise(self) -> bool:
        """Whether the window has its precision (or its time is up); checked only when the
        steps asked for at the last check have come, so a long window costs a few checks."""
        elapsed = self.window_end - self.window_start
        if elapsed >= self.max_seconds:
            return True
        if self.measured < self._next_check:
            return False
        need = stats.steps_to_precision(self.measured_durations, self.precision, elapsed, self.max_seconds)
        self._next_check = self.measured + need
        return need == 0

    def chief(self, step: ev.Step) -> str:
        """The phase of the chief's `step` in this point (it must not be done yet)."""
        start = controller_start(step)
        if self.first_index is None:
            self.first_index = step.step
        if start >= self.changed_at:
            self.after += 1
        if step.phase == ev.PHASE_WARMUP:
            phase = ev.PHASE_WARMUP
            self.warmed = True
        elif self.window_start is None and (not self._settled(step, start) or self.others_waiting):
            phase = ev.PHASE_SETTLE
            self.dropped += 1
        else:
            phase = ev.PHASE_MEASURED
            if self.window_start is None:
                self.window_start = start
            self.window_end = step.recv if step.recv is not None else step.end
            self.measured += 1
            self.last_index = step.step
            self.measured_durations.append(step.end - step.start)
        self.phase_of[step.step] = phase
        return phase

    def _settled(self, step: ev.Step, start: float) -> bool:
        """Whether the settle window ends before `step` (settling.decide): the step time's
        steadiness counts `step` itself."""
        if start < self.changed_at:
            return False
        self.durations.append(step.end - step.start)
        self.why = settling.decide(self.settle, self.after, start - self.changed_at, self.durations, self.warmed,
                                   self.floor_s, self.widened)
        return self.why is not None

    def phase_for(self, index: int) -> str | None:
        """A step's phase by its number: None while the chief has not reached it."""
        if index in self.phase_of:
            return self.phase_of[index]
        if self.first_index is not None and index < self.first_index:
            return ev.PHASE_SETTLE  # late from before this point's first step
        return None

    def heard(self, step: ev.Step) -> None:
        """Another task's `step` has arrived (placed or not): past its warm-up, that task is in."""
        if step.phase != ev.PHASE_WARMUP:
            self.others_waiting.discard((step.role, step.worker))

    def place(self, step: ev.Step) -> str | None:
        """Another task's `step` in this point: its phase, LATER (the next point's: only once the
        window is done), or None while that is not known yet. Counts the measured steps of an
        own-pace point's other workers (call it once a step, when the answer is not None)."""
        phase = self._phase_at(step) if self.by_time else self._phase_by_number(step)
        if phase == ev.PHASE_MEASURED and (step.role, step.worker) in self.others_measured:
            self.others_measured[(step.role, step.worker)] += 1
        return phase

    def _phase_by_number(self, step: ev.Step) -> str | None:
        if self.last_index is not None and step.step > self.last_index and self.done:
            return LATER
        return self.phase_for(step.step)

    def _phase_at(self, step: ev.Step) -> str | None:
        """By when the step ran (its start on the controller's clock): before the change, or after
        it and before the chief's window, it settles; inside the window it is measured; after
        the window it is the next point's."""
        if step.phase == ev.PHASE_WARMUP:
            return ev.PHASE_WARMUP
        start = controller_start(step)
        if start < self.changed_at:
            return ev.PHASE_SETTLE  # ran under the point before (heard late)
        if self.window_start is None:
            return None
        if start < self.window_start:
            return ev.PHASE_SETTLE
        if start <= self.window_end:
            return ev.PHASE_MEASURED
        return LATER if self._finished else None

    def past(self, step: ev.Step) -> bool:
        """Whether another task's `step` shows that every step of its in this (done) window has
        been heard: it reached the chief's last measured step, or (own pace) it started after
        the window (a task's steps arrive in order)."""
        if self.by_time:
            return step.phase != ev.PHASE_WARMUP and controller_start(step) > self.window_end
        return step.step >= self.last_index

    def settle_s(self) -> float | None:
        return None if self.window_start is None else max(0.0, self.window_start - self.changed_at)


@dataclass
class Context:
    """What a launch needs from the runner: where it runs and where each point's result goes."""

    config: Any  # runner.SweepConfig
    testbed: Any  # testbed.base.Target
    store: Any  # experiment.store.ResultStore
    observer: Any  # runner.Observer
    make_result: Callable  # runner.make_result
    finish: Callable  # (run, result): store it, tell the observers, keep its summary
    backend_name: str = ""
    settle: Settle = Settle()
    congestion: str | None = None  # the nodes' TCP congestion control as read back ("a;b": they differ; None: unknown)
    ports: random.Random = field(default_factory=random.Random)
    started: list = field(default_factory=list)  # the manifest's record of every launch started

    def seed_of(self, run: Run) -> int:
        return self.config.seed + 100 * run.index


@dataclass
class _Clock:
    """When the chief last stepped (None: not yet, the start-up timeout applies), from when."""

    since: float
    stepped: bool = False


def run_launch(plan: LaunchPlan, ctx: Context) -> None:
    """Every run of `plan`, in its order, through as few launches as failures allow."""
    left = list(plan.runs)
    while left:
        # numbered after every launch the folder holds (an earlier session's, on --append or
        # a playbook's resume) and every one this sweep started
        number = max([ctx.store.next_launch()] + [s["launch"] + 1 for s in ctx.started])
        this = {"launch": number, "group": plan.group, "seed": plan.seed,
                "runs": [r.run_id for r in left], "started": time.time()}
        ctx.started.append(this)
        ctx.observer.note(f"launch {number}: {len(left)} point(s), order " + " ".join(r.run_id for r in left))
        left = _one_launch(number, left, ctx)
        this["ended"] = time.time()


def _one_launch(number: int, runs: list[Run], ctx: Context) -> list[Run]:
    """Start the job once and measure `runs` in order; returns the runs left after a failure."""
    job, workers = runs[0].job, runs[0].workers
    tasks = plan_job(job, ctx.testbed.nodes_for(job, workers), workers, port=ctx.ports.randrange(*PORT_RANGE))
    if job.command is None:
        tasks = [replace(t, argv=t.argv + (UNTIL_STOPPED,)) for t in tasks]
    # workers that step at their own pace have their steps placed by time, not by number; the
    # chief is the first task that is not a server (LiveJob.clock)
    own_pace = job.command is None and job.strategy in OWN_PACE_STRATEGIES
    others = tuple((t.role, t.index) for t in tasks if not t.serves)[1:]
    spawn = user_spawner(job, ctx, ctx.store.log_dir(f"launch{number:03d}")) if job.command else ctx.testbed.spawn
    keeps = False  # a user's command that asks stop_requested() serves many points
    live: LiveJob | None = None
    starts: list[ev.Event] = []  # the processes' start events: every point's record has them
    carry: list[ev.Event] = []  # events read after a point's window, before the next change
    clock = _Clock(since=time.monotonic())
    meter: LinkMeter | None = None  # a user's command that reports no steps: its links' bytes
    try:
        for i, run in enumerate(runs):
            ctx.observer.run_started(run)
            ctx.observer.launch_point(run, number, i + 1, len(runs))
            started = time.time()
            ctx.testbed.apply(run, seed=ctx.seed_of(run))
            # the change is in place once apply returns: a step that started while it was being
            # made ran partly under the point before, so the settle counts from here
            changed_at = time.monotonic()
            ctx.observer.profile_applied(run)
            before = runs[i - 1] if i else None  # the point this change came from (none: the launch's start)
            window = PointWindow(changed_at, ctx.settle, job.steps, job.seconds, job.precision, job.max_seconds,
                                 rtt_s=settling.round_trip_s(run), by_time=own_pace, others=others,
                                 widened=settling.widens(before, run),
                                 change_floor_s=settling.change_floor_s(before, run, ctx.congestion))
            if live is None:
                try:
                    live = LiveJob(tasks, ctx.store.log_dir(f"launch{number:03d}"), spawn,
                                   env=exchange_env(ctx.config.timeouts))
                except TaskLost as exc:
                    _record(ctx, run, number, window, JobOutcome("failed", (), exc.message), started)
                    return runs[i + 1:]
                clock = _Clock(since=time.monotonic())
                meter = meter_for(job, ctx.testbed, [t.node for t in tasks], lambda text, r=run: ctx.observer.note(
                    f"{r.run_id}: {text}"))
            status, error, got = _measure(live, run, window, starts, carry, clock, ctx, meter if i == 0 else None)
            link = meter.link if meter is not None and meter.armed and i == 0 else None
            if link is not None:
                ctx.observer.window(run, *meter.window_wall())
            elif window.window_start is not None:
                ctx.observer.window(run, wall_time(window.window_start), wall_time(window.window_end))
            _record(ctx, run, number, window, JobOutcome(status, tuple(got), error), started, link)
            if status != "ok":
                return runs[i + 1:]
            keeps = keeps or (job.command is not None and checks_stop(got))
            if ctx.config.isolate or (job.command is not None and not keeps):
                return runs[i + 1:]  # one launch per point; it is stopped once measured
        return []
    finally:
        if live is not None:
            if keeps and not live.broken:
                spawn.request_stop()
            live.stop()


def user_spawner(job: JobSpec, ctx: Context, log_dir) -> UserSpawner:
    """The spawner of a user's command's ranks (jobs/user.py): own hostnames on the embedded
    testbed (hosts have their own), rank 0's lines read with the step regex if there is one."""
    command = job.command
    return UserSpawner(ctx.testbed.spawn, log_dir, command.step_regex, command.images_per_step or 0, job.warmup,
                       own_hostnames=getattr(ctx.testbed, "kind", "") == "embedded")


def _record(ctx: Context, run: Run, number: int, window: PointWindow, outcome: JobOutcome, started: float,
            link: dict | None = None) -> None:
    from netbench.model.ranks import rank_nodes

    nodes = rank_nodes(tuple(n.name for n in ctx.testbed.nodes_for(run.job, run.workers)), run.workers,
                       run.job.ranks_per_node)  # each rank's node, in rank order
    result = ctx.make_result(run, ctx.backend_name, outcome, started, time.time(), link=link, nodes=nodes)
    ctx.finish(run, replace(result, launch=number, settle_s=window.settle_s(), settle_steps=window.dropped,
                            settle_reason=settling.reason(window.why, window.floor_s, window.rtt_s, window.settle,
                                                          window.change_floor_s, window.widened)))


def _measure(live: LiveJob, run: Run, window: PointWindow, starts: list, carry: list, clock: _Clock,
             ctx: Context, meter: LinkMeter | None = None) -> tuple[str, str, list[ev.Event]]:
    """Read the launch's events into this point until its window is measured (or it fails);
    with an armed `meter`, until its bytes window is over, unless the job reports steps."""
    timeouts = ctx.config.timeouts
    chief = (live.clock_task.role, live.clock_task.index)
    got: list[ev.Event] = list(starts)
    # other tasks' steps not placed yet, in the order they are placed in: by step number, or
    # (own pace) by when they started
    waiting: list[ev.Step] = []
    order = controller_start if window.by_time else (lambda s: s.step)

    def take(event: ev.Event) -> None:
        got.append(event)
        ctx.observer.step(run, event)

    def settle_others() -> None:
        # `waiting` is in placing order and the chief's steps come in order, so the steps it has
        # placed are at the front: each chief step costs what it settles, not the whole list
        while waiting:
            phase = window.place(waiting[0])
            if phase is None or phase == LATER:  # the next point's, or not known yet: so are those behind it
                break
            take(ev.evolve(waiting.pop(0), phase=phase))

    def handle(event: ev.Event) -> None:
        if meter is not None:
            meter.heard(event)
        if isinstance(event, ev.Start):
            starts.append(event)
            take(event)
        elif isinstance(event, ev.Step) and (event.role, event.worker) == chief:
            take(ev.evolve(event, phase=window.chief(event)))
            clock.since, clock.stepped = time.monotonic(), True
            settle_others()
        elif isinstance(event, ev.Step):
            window.heard(event)
            bisect.insort(waiting, event, key=order)
            settle_others()
        else:
            take(event)

    pending, carry[:] = list(carry), []
    for event in pending:
        if window.done:
            carry.append(event)
        else:
            handle(event)
    while not window.done:
        ended = meter.poll(timeouts.startup_s) if meter is not None and meter.armed else None
        if ended is not None:
            return (*ended, got)
        limit = timeouts.step_s if clock.stepped else timeouts.startup_s
        wait = meter.wait() if meter is not None and meter.armed else clock.since + limit - time.monotonic()
        if wait <= 0 and not (meter is not None and meter.armed):
            what = "next step" if clock.stepped else "first step"
            note = meter.note if meter is not None else ""
            return "timeout", f"no {what} within {limit:g}s{note}", got + _unmeasured(waiting)
        try:
            event = live.read(min(wait, 1.0))
        except JobBroken as exc:
            return "failed", exc.message, got + _unmeasured(waiting)
        if event is not None:
            handle(event)
    _drain(live, window, chief, waiting, carry, timeouts.step_s, take)
    return "ok", "", got


def _unmeasured(steps: list[ev.Step]) -> list[ev.Step]:
    """Other tasks' steps past the chief's last one when a point fails: kept, never measured."""
    return [replace(s, phase=ev.PHASE_SETTLE) for s in steps]


def _drain(live: LiveJob, window: PointWindow, chief, waiting: list, carry: list, limit: float, take) -> None:
    """After the window, read until every other stepping task has shown it sent all its steps of
    the window (`PointWindow.past`; at most `limit` s); what belongs after the window (LATER, and
    everything else read) is carried to the next point."""
    if window.last_index is None:
        return
    others = {s for s in live.steppers() if s != chief}
    backlog, carry[:] = waiting + carry, []
    waiting.clear()
    shown: set = set()

    def sort(event: ev.Event) -> None:
        key = (event.role, event.worker) if isinstance(event, ev.Step) else None
        if key not in others:
            carry.append(event)
            return
        if window.past(event):
            shown.add(key)
        phase = window.place(event)
        if phase is None or phase == LATER:
            carry.append(event)
        else:
            take(ev.evolve(event, phase=phase))

    for event in backlog:
        sort(event)
    deadline = time.monotonic() + limit
    while others - shown and time.monotonic() < deadline:
        try:
            event = live.read(min(deadline - time.monotonic(), 1.0))
        except JobBroken:
            return  # the next point hears of it
        if event is not None:
            sort(event)
