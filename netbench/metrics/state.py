"""What the controller knows while a sweep runs, fed by the runner's observer calls.

`MetricsState` holds plain numbers behind a lock (observer calls come from the sweep's
thread, scrapes from the exporter's threads); `snapshot()` hands the collector a consistent
copy. `MetricsObserver` is the runner.Observer that feeds it. Nothing here does I/O, and
time comes from an injectable clock, so tests drive it with fake events.
"""

from __future__ import annotations

import bisect
import copy
import platform
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from netbench import __version__
from netbench.jobs import events as ev
from netbench.jobs.analysis import CHIEF, Tally, images_per_sec, rate_rule, summed_rate
from netbench.metrics.catalogue import PHASES, STEP_DURATION_BUCKETS_S
from netbench.metrics.ranks import RankTimes

ISOLATED = "isolated"  # the launch label of a run in a launch of its own


@dataclass
class Histogram:
    """Cumulative-ready bucket counts over STEP_DURATION_BUCKETS_S (plus +Inf), and the sum."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(STEP_DURATION_BUCKETS_S) + 1))
    total: float = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(STEP_DURATION_BUCKETS_S, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, int]]:
        """[(le, count of values <= le)], ending with +Inf, as exposition wants."""
        out, running = [], 0
        for bound, count in zip((*STEP_DURATION_BUCKETS_S, float("inf")), self.counts):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return out


@dataclass
class ActiveProfile:
    name: str
    delay_s: float
    jitter_s: float
    rate_bytes_per_s: float  # 0: no limit
    loss: float
    applied_at: float


@dataclass
class Snapshot:
    """A consistent copy of the state, taken at scrape time."""

    sweep: dict[str, str] | None = None
    state: str = "setup"
    sweep_started_at: float | None = None
    runs_planned: int = 0
    runs_completed: dict[str, int] = field(default_factory=dict)
    run: dict[str, str] | None = None
    run_started_at: float | None = None
    run_images_per_s: float | None = None
    result_images_per_s: dict[str, float] = field(default_factory=dict)
    # each run's measured window, kept for the sweep: run -> (start, end, launch, point)
    windows: dict[str, tuple[float, float, str, str]] = field(default_factory=dict)
    profile: ActiveProfile | None = None
    profile_applications: int = 0
    # when each profile of this sweep was last applied: a scraper that first comes after a
    # change (a late file_sd discovery, a short first run) still sees every change
    profile_applied_at: dict[str, float] = field(default_factory=dict)
    steps: dict[tuple[str, str], int] = field(default_factory=dict)
    samples: dict[tuple[str, str], int] = field(default_factory=dict)
    durations: dict[tuple[str, str], Histogram] = field(default_factory=dict)
    warmups_completed: int = 0
    warmup_ended_at: float | None = None
    workers_up: dict[str, int] = field(default_factory=dict)
    heartbeats: dict[str, float] = field(default_factory=dict)
    # the run in progress, per rank: (mean step s, mean time outside computation s, share of steps it
    # finished last) (metrics/ranks.py), and each rank's node
    ranks: dict[str, tuple[float, float | None, float | None]] = field(default_factory=dict)
    rank_nodes: dict[str, str] = field(default_factory=dict)
    build: dict[str, str] = field(default_factory=lambda: {"version": __version__,
                                                             "python": platform.python_version()})


class MetricsState:
    """The live numbers of one sweep. Every method is safe to call from any thread."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._s = Snapshot(sweep_started_at=clock())
        self._batch = 0  # images one step event of one reporting process stands for
        self._global_batch = 0  # images one step of the run stands for (cluster.images_per_step)
        # running sum and count of the chief's measured step times: a long run's live mean
        # costs the same at its last step as at its first
        self._chief_sum = 0.0
        self._chief_count = 0
        self._ranks = RankTimes(workers=0, aligned=False)
        # the run's own job and workers, whose rate_rule says how its images/sec comes from the
        # steps (None: the chief's), and each worker's measured steps so far (a Tally each)
        self._job, self._workers = None, 0
        self._tallies: dict[int, Tally] = {}

    def snapshot(self) -> Snapshot:
        with self._lock:
            self._s.ranks = {str(r): v for r, v in self._ranks.view().items()}
            return copy.deepcopy(self._s)

    def ranks_started(self, workers: int, aligned: bool, nodes: tuple[str, ...] = ()) -> None:
        """The run in progress has `workers` ranks (on `nodes`, in rank order); `aligned`: they
        leave each step together (a synchronous strategy), so who finished last is counted."""
        with self._lock:
            self._ranks = RankTimes(workers=workers, aligned=aligned)
            self._s.rank_nodes = {str(r): node for r, node in enumerate(nodes[:workers])}

    # -- sweep and runs -------------------------------------------------------------
    def sweep_started(self, sweep_id: str, backend: str, model: str, strategy: str, runs: int,
                      workers: int, batch_size: int) -> None:
        with self._lock:
            s = self._s
            s.sweep = {"sweep": sweep_id, "backend": backend, "model": model, "strategy": strategy}
            s.runs_planned = runs
            self._batch, self._global_batch = batch_size, batch_size * workers
            for index in range(workers):
                for phase in PHASES:  # counters exist from the start, so the first increase shows
                    key = (phase, str(index))
                    s.steps.setdefault(key, 0)
                    s.samples.setdefault(key, 0)
                    s.durations.setdefault(key, Histogram())
                s.workers_up[str(index)] = 0

    def run_started(self, run_id: str, repeat: int, images_per_worker_step: int | None = None,
                    images_per_step: int | None = None, job=None, workers: int = 0) -> None:
        """A run begins. `images_per_worker_step`: images one step event of one process trained
        on; `images_per_step`: images one step of the whole run stands for (the run's own job
        and workers: a playbook run's job differs from the sweep's, allreduce-accum steps span
        k batches, ps steps one worker's batch). Either defaults to the sweep's figure. `job`
        and `workers` (the run's own): under the own-pace strategies and ps-sync with backup
        workers its images/sec is the sum over its workers' own steps (jobs/analysis.py
        rate_rule), not the chief's rate."""
        with self._lock:
            self._job, self._workers, self._tallies = job, workers, {}
            if images_per_worker_step is not None:
                self._batch = images_per_worker_step
            if images_per_step is not None:
                self._global_batch = images_per_step
            s = self._s
            s.state = "applying"
            # launch and point until launch_point says (the runner says so for every run)
            s.run = {"run": run_id, "repeat": str(repeat), "launch": "", "point": ""}
            s.run_started_at = self._clock()
            s.run_images_per_s = None
            # warmup_ended_at is kept until this run's warm-up ends: a short run's end of warm-up
            # must stay visible for at least one scrape after the next run has started
            self._chief_sum, self._chief_count = 0.0, 0

    def set_images(self, images_per_worker_step: int, images_per_step: int) -> None:
        """The run's images per step of one process and of the whole run, once known."""
        with self._lock:
            self._batch, self._global_batch = images_per_worker_step, images_per_step

    def launch_point(self, launch: int | None, position: int, points: int) -> None:
        """The run in progress is point `position` (from 1) of `points` of launch `launch`
        (None: a launch of its own)."""
        with self._lock:
            if self._s.run is not None:
                self._s.run["launch"] = ISOLATED if launch is None else str(launch)
                self._s.run["point"] = f"{position}/{points}"

    def measured_window(self, run_id: str, start: float, end: float) -> None:
        """Run `run_id`'s measured window (Unix times), labelled with its launch and point."""
        with self._lock:
            run = self._s.run if self._s.run is not None and self._s.run["run"] == run_id else {}
            self._s.windows[run_id] = (start, end, run.get("launch", ""), run.get("point", ""))

    def profile_applied(self, name: str, delay_us: int, jitter_us: int, rate_bps: int | None, loss: float) -> None:
        with self._lock:
            s = self._s
            s.profile = ActiveProfile(name=name, delay_s=delay_us / 1e6, jitter_s=jitter_us / 1e6,
                                      rate_bytes_per_s=(rate_bps or 0) / 8, loss=float(loss),
                                      applied_at=self._clock())
            s.profile_applied_at[name] = s.profile.applied_at
            s.profile_applications += 1
            s.state = "starting"

    def worker_event(self, event: ev.Event | dict) -> None:
        """One event from a task's stdout (netbench.jobs.events; a record's JSON object is
        read as one)."""
        event = ev.as_event(event)
        worker = str(event.worker or 0)
        with self._lock:
            s = self._s
            s.heartbeats[worker] = self._clock()
            if isinstance(event, (ev.Start, ev.Step)):
                s.workers_up[worker] = 1
            elif isinstance(event, (ev.Done, ev.Error)):
                s.workers_up[worker] = 0
            if isinstance(event, ev.Step) and event.phase == ev.PHASE_SETTLE and worker == "0":
                s.state = "settle"  # a shared launch's steps after a change: dropped, not counted
            if not isinstance(event, ev.Step) or event.phase not in (ev.PHASE_WARMUP, ev.PHASE_MEASURED):
                return  # calibration steps (and phases a later version adds) are no measured steps
            phase = event.phase
            duration = event.duration
            summed = self._job is not None and rate_rule(self._job) != CHIEF
            if phase == ev.PHASE_MEASURED and event.task_role == "worker":
                self._ranks.add(event.worker or 0, event)
                if summed:
                    index = event.worker or 0
                    self._tallies[index] = self._tallies.get(index, Tally()).add(event)
                    s.run_images_per_s = summed_rate(self._job, self._tallies, self._workers)
            key = (phase, worker)
            s.steps[key] = s.steps.get(key, 0) + 1
            s.samples[key] = s.samples.get(key, 0) + max(0, self._batch)  # a counter never goes down
            s.durations.setdefault(key, Histogram()).observe(duration)
            if worker != "0":
                return
            s.state = phase
            if phase == "measured":
                if not self._chief_count:
                    s.warmups_completed += 1
                    s.warmup_ended_at = self._clock()
                if duration > 0:
                    self._chief_sum += duration
                    self._chief_count += 1
                    if not summed:
                        s.run_images_per_s = images_per_sec(self._global_batch * self._chief_count, self._chief_sum)

    def run_finished(self, status: str, profile: str, images_per_s: float | None) -> None:
        with self._lock:
            s = self._s
            s.runs_completed[status] = s.runs_completed.get(status, 0) + 1
            for worker in s.workers_up:
                s.workers_up[worker] = 0
            if images_per_s is not None:
                s.result_images_per_s[profile] = images_per_s
            if sum(s.runs_completed.values()) >= s.runs_planned:
                s.state = "finished"


class MetricsObserver:
    """runner.Observer that feeds a MetricsState."""

    def __init__(self, state: MetricsState, on_topology: Callable | None = None) -> None:
        self.state = state
        self.config = None  # the sweep's, from sweep_started
        self.on_topology = on_topology  # the network reader learns the testbed here
        self.nodes: tuple[str, ...] = ()  # the testbed's nodes in placement order (model/ranks.py rank_nodes)

    def sweep_started(self, config, backend, topology) -> None:
        self.config = config
        if self.on_topology:
            self.on_topology(topology)
        self.nodes = tuple(n.name for n in getattr(topology, "nodes", ()) or ())
        self.state.sweep_started(config.sweep_id, backend.name, config.job.model, config.job.strategy,
                                 len(config.runs), config.workers, config.job.batch_size)

    def run_started(self, run) -> None:
        from netbench.model.job import images_per_step, images_per_worker_step

        # the run's own job and workers, through the functions the live view uses too
        job, workers = run.job, run.workers
        self.state.run_started(run.run_id, run.repeat, images_per_worker_step=images_per_worker_step(job),
                               images_per_step=images_per_step(job, workers), job=job, workers=workers)
        from netbench.jobs.stragglers import SYNC, mode_of
        from netbench.model.ranks import rank_nodes

        self.state.ranks_started(workers, mode_of(job, getattr(job, "backup_workers", 0)) == SYNC,
                                 rank_nodes(self.nodes, workers, getattr(job, "ranks_per_node", 1)))

    def launch_point(self, run, launch: int | None, position: int, points: int) -> None:
        self.state.launch_point(launch, position, points)

    def window(self, run, start_wall: float, end_wall: float) -> None:
        self.state.measured_window(run.run_id, start_wall, end_wall)

    def profile_applied(self, run) -> None:
        p = run.profile
        self.state.profile_applied(p.name, p.delay_us, p.jitter_us, p.rate_bps, p.loss)

    def step(self, run, event: ev.Event) -> None:
        if getattr(run.job, "command", None) is not None and not run.job.batch_size and isinstance(event, ev.Step) \
                and event.images:
            # a user's command without --images-per-step: its track events say the cluster's images
            self.state.set_images(event.images // max(1, run.workers), event.images)
        self.state.worker_event(event)

    def run_finished(self, run, result) -> None:
        ips = (result.stats or {}).get("images_per_sec") if result.status == "ok" else None
        self.state.run_finished(result.status, run.profile.name, ips)

    def note(self, text: str) -> None:
        pass


class ObserverTee:
    """Passes every observer call to each of several observers, in order."""

    def __init__(self, *observers) -> None:
        self.observers = observers

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args, **kwargs) -> None:
            for observer in self.observers:
                getattr(observer, name)(*args, **kwargs)

        return call
