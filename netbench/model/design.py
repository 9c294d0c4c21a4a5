"""Designs -> the ordered tuple of runs, for sweep flags and playbooks alike (pure).

A design is factors and their levels crossed over fixed settings (its distinct points,
each a profile with its job and worker count), repeated, in an order (as written, or
shuffled with a recorded seed). Sweep flags give a `Design` over the network factors with
one job (`sweep_design`); a playbook gives one over every setting (`playbook_design`).
`Design.runs` turns either into `Run`s, so ids, order and each run's job and worker count
are resolved in one place, once.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from netbench import units
from netbench.model import algorithm_keys
from netbench.model.job import SERVER_STRATEGIES, JobSpec, command_spec, window_steps
from netbench.model.playbook import FIELD_TO_KEY, Playbook, PlaybookError, design_points, fail, profile_for
from netbench.model.profile import Profile, validate
from netbench.model.pairs import PairTopology, scaled
from netbench.model.run import Run, Settings, profile_name, scaled_name
from netbench.model.compute import NONE, Compute
from netbench.model.schedule import Schedule, timeline

__all__ = ["COMPLETE_STATUSES", "Design", "Point", "Run", "Settings", "SweepLevels", "check_resume", "check_supported",
           "describe_settings", "setting_cell", "design_digest", "expand", "fields_of", "job_fields", "order_seed",
           "pending", "plan_record", "plan_sweep", "playbook_design", "profile_name", "scheduled_point", "sweep_design",
           "sweep_points", "sweep_runs", "topology_design", "topology_point"]

COMPLETE_STATUSES = ("ok", "timeout")  # a timeout is a result (a cross on the figure), not a crash
ORDERS = ("as-written", "random")


@dataclass(frozen=True)
class Point:
    """One distinct design point: the network and the job, with its worker count."""

    profile: Profile
    job: JobSpec
    workers: int
    settings: Settings | None = None  # the playbook settings it came from; None for sweep flags
    schedule: Any = None  # model.schedule.Schedule: the link changes during the run (profile: where it starts)
    timeline: tuple = ()  # the schedule's TimedProfile entries over its base
    pairs: Any = None  # model.pairs.PairTopology (scaled) applied instead of `profile`, a null one named after it
    compute: Compute = NONE  # each node's CPU limit and step delay (model/compute.py)


@dataclass(frozen=True)
class Design:
    """Distinct points in written order, each repeated `repeat` times, in `order`.

    as-written keeps a point's repetitions adjacent; random shuffles every (point,
    repetition) with random.Random(seed), the same on every machine."""

    points: tuple[Point, ...]
    repeat: int = 1
    order: str = "as-written"
    seed: int = 0

    def runs(self, first: int = 0) -> tuple[Run, ...]:
        """Every run in run order, numbered from `first` (r<first>, r<first+1>, ...)."""
        if self.repeat < 1:
            raise ValueError("repeat must be at least 1")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {self.order!r}")
        pairs = [(p, rep) for p in range(len(self.points)) for rep in range(self.repeat)]
        if self.order == "random":
            random.Random(self.seed).shuffle(pairs)
        return tuple(Run(index=first + i, profile=self.points[p].profile, repeat=rep, job=self.points[p].job,
                         workers=self.points[p].workers, point=p, settings=self.points[p].settings,
                         schedule=self.points[p].schedule, timeline=self.points[p].timeline,
                         pairs=self.points[p].pairs, compute=self.points[p].compute)
                     for i, (p, rep) in enumerate(pairs))


# ---------------------------------------------------------------- sweep flags

@dataclass(frozen=True)
class SweepLevels:
    """Levels per factor in canonical units; an empty tuple keeps the base profile's value."""

    delay_us: tuple[int, ...] = ()
    rate_bps: tuple[int, ...] = ()
    loss: tuple[float, ...] = ()
    jitter_us: tuple[int, ...] = ()


def _levels(values: Sequence, base_value) -> tuple:
    return tuple(values) if values else (base_value,)


def sweep_points(base: Profile, levels: SweepLevels) -> tuple[Profile, ...]:
    """The cartesian product of the levels over `base`, each point validated.

    Order: delay outermost, then rate, loss, jitter. A swept point is named by its values."""
    grid = itertools.product(_levels(levels.delay_us, base.delay_us), _levels(levels.rate_bps, base.rate_bps),
                             _levels(levels.loss, base.loss), _levels(levels.jitter_us, base.jitter_us))
    swept = bool(levels.delay_us or levels.rate_bps or levels.loss or levels.jitter_us)
    points = []
    for delay, rate, loss, jitter in grid:
        point = replace(base, delay_us=delay, rate_bps=rate, loss=loss, jitter_us=jitter)
        if swept:
            point = replace(point, name=profile_name(point))
        points.append(validate(point, "sweep"))
    return tuple(points)


def scheduled_point(schedule: Schedule, base: Profile, job: JobSpec, workers: int,
                    settings: Settings | None = None) -> Point:
    """A point whose link follows `schedule` (its timeline expanded over `base`).

    The run starts on the timeline's first entry when that is due at once (at: 0 or
    at_step: 0), else on the schedule's own profile (or `base`); the runner makes the
    rest of the changes once measuring begins. The starting profile is named after the
    schedule, which labels the point."""
    entries = timeline(schedule, base)
    first = entries[0]
    starts_at_once = (first.at_s or 0) == 0 and (first.at_step or 0) == 0
    start = first.profile if starts_at_once else (schedule.profile or base)
    return Point(profile=replace(start, name=schedule.name), job=job, workers=workers, settings=settings,
                 schedule=schedule, timeline=entries)


def sweep_design(points: Sequence[Profile], repeat: int, job: JobSpec, workers: int,
                 schedules: Sequence[Schedule] = (), base: Profile | None = None,
                 computes: Sequence[Compute] = (NONE,)) -> Design:
    """The design sweep flags give: every profile point with the one job, as written, then
    one point per schedule (its timeline over `base`); each crossed with the node capacities
    `computes` (--cpus, --step-delay; innermost)."""
    scheduled = tuple(scheduled_point(s, base or Profile(name="base"), job, workers) for s in schedules)
    return Design(points=with_computes(tuple(Point(profile, job, workers) for profile in points) + scheduled,
                                       computes), repeat=repeat)


def with_computes(points: Sequence[Point], computes: Sequence[Compute]) -> tuple[Point, ...]:
    """Every point crossed with every node capacity (innermost); a limited one's profile is
    named after both ("d1ms+n2c0.5"), which labels the point in views and results."""
    out = []
    for point in points:
        for compute in computes:
            if not compute.limited:
                out.append(point)
                continue
            name = f"{point.profile.name}+{compute.suffix()}"
            out.append(replace(point, profile=replace(point.profile, name=name), compute=compute))
    return tuple(out)


def sweep_runs(points: Sequence[Profile], repeat: int, job: JobSpec, workers: int, first: int = 0,
               schedules: Sequence[Schedule] = (), base: Profile | None = None,
               computes: Sequence[Compute] = (NONE,)) -> tuple[Run, ...]:
    """Each point repeated `repeat` times (repetitions adjacent), numbered from `first`."""
    return sweep_design(points, repeat, job, workers, schedules, base, computes).runs(first)


def topology_point(pairs: PairTopology, scale: float, job: JobSpec, workers: int,
                   settings: Settings | None = None) -> Point:
    """A point that applies `pairs` with every delay times `scale`; its profile is a null
    one named after the point ("world", "world-x2"), which labels it in views and results."""
    point = Point(profile=Profile(name=scaled_name(pairs.name, scale)), job=job, workers=workers, settings=settings,
                  pairs=scaled(pairs, scale))
    return with_computes((point,), (pairs.compute or NONE,))[0]  # the file's compute: its nodes' capacity


def topology_design(pairs: PairTopology, scales: Sequence[float], repeat: int, job: JobSpec,
                    workers: int) -> Design:
    """The design `sweep --topology` gives: one point per scale level, as written."""
    return Design(points=tuple(topology_point(pairs, s, job, workers) for s in scales), repeat=repeat)


def plan_sweep(base: Profile, levels: SweepLevels, repeat: int = 1, job: JobSpec = JobSpec(), workers: int = 2,
               first: int = 0) -> tuple[Run, ...]:
    """The runs of a sweep from flags: `sweep_points`, each repeated, all with one job."""
    if repeat < 1:
        raise ValueError("repeat must be at least 1")
    return sweep_runs(sweep_points(base, levels), repeat, job, workers, first)


# ---------------------------------------------------------------- playbooks

def playbook_design(book: Playbook, seed: int, sample_resources_s: float = 0.0) -> Design:
    """The design a playbook gives: its distinct points (factors crossed, first factor
    outermost, then the extra runs), each with the job its settings make; every job
    carries `seed` (data and draws) and the sampling interval of --sample-resources. The
    order is shuffled with the playbook's order_seed, else with `seed`."""
    available = fields_of(JobSpec)
    schedules = dict(book.schedules)
    points = []
    for s in design_points(book):
        job = JobSpec(**job_fields(book, s, available), seed=seed, sample_resources_s=sample_resources_s)
        if book.command is not None:
            job = command_spec(job, book.command, s.workers)
        if book.topology is not None:
            points.append(topology_point(book.topology, s.scale, job, s.workers, s))
        elif s.schedule:
            points.append(scheduled_point(schedules[s.schedule], profile_for(book, s), job, s.workers, s))
        else:
            points.append(Point(profile=profile_for(book, s), workers=s.workers, settings=s, job=job))
    points = tuple(with_computes((p,), (p.settings.compute,))[0] for p in points)
    return Design(points=points, repeat=book.repetitions, order=book.order, seed=order_seed(book, seed))


def order_seed(book: Playbook, seed: int) -> int:
    """The seed of the order (of the runs under order: random, of the points within a launch):
    the playbook's order_seed, else `seed`, the run's seed (as a playbook's seed was before
    order_seed, so folders written before it resume)."""
    return book.order_seed if book.order_seed is not None else seed


def expand(book: Playbook, seed: int, sample_resources_s: float = 0.0) -> tuple[Run, ...]:
    """Every run of the playbook, in run order, each with its own job and worker count.

    Design points in written order, each repeated `repeat` times; with order: random the
    whole list is shuffled with random.Random(order_seed(book, seed)), so the same seed gives
    the same order on every machine."""
    return playbook_design(book, seed, sample_resources_s).runs()


def book_steps(book: Playbook) -> int:
    """Its runs' measured steps: with train_steps, the rest after warm-up; its steps: as written;
    without the key, with a precision, the least window (model.job.window_steps), else 30."""
    train = dict(book.job_extra).get("train_steps")
    if train:
        return train - book.warmup
    return window_steps(book.steps if book.steps_written else None, book.precision, book.seconds)


def design_digest(book: Playbook, runs: Sequence[Run]) -> str:
    """A fingerprint of what was measured: run ids, settings, repetitions and the window.

    A results folder only resumes a playbook whose digest is the same, so a playbook
    edited between sessions never mixes two designs in one folder."""
    # steps as written (30 without the key: the least window follows from the precision, fingerprinted
    # apart), so folders written before least windows resume
    doc = {"window": [book.warmup, book.steps, book.seconds], "base_profile": book.base_profile.to_record(),
           "runs": [[r.run_id, r.point, r.repeat, _settings_record(r.settings)] for r in runs]}
    doc.update(_measurement_record(book))
    if book.schedules:  # a schedule edited between sessions is another design too
        doc["schedules"] = {ref: [schedule.repeat, schedule.cycle, [[e.at_s, e.at_step, e.profile.to_record()]
                                                                    + ([list(e.compute)] if e.compute else [])
                                                                    for e in timeline(schedule, None)]]
                            for ref, schedule in book.schedules}
    if book.topology is not None:  # so is a topology file edited between sessions
        doc["topology"] = book.topology.to_json()
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _measurement_record(book: Playbook) -> dict[str, Any]:
    """What else decides what a run measures: the precision its window goes on to (and its cap),
    the accuracy run's and algorithm's keys, the user's command, the nodes' congestion control.
    Each is left out at its default (3 %, 60 s; none), so folders written before it was
    fingerprinted resume."""
    doc: dict[str, Any] = {}
    window = _precision_window(book.precision, book.max_seconds)
    if window != (Playbook.precision, Playbook.max_seconds):
        doc["precision"] = list(window)
    if book.job_extra:
        doc["job_extra"] = [list(pair) for pair in book.job_extra]
    if book.command is not None:
        doc["command"] = asdict(book.command)
    if book.congestion_control is not None:
        doc["congestion_control"] = book.congestion_control
    return doc


def _precision_window(precision: float | None, max_seconds: float | None) -> tuple:
    """(precision, cap) as they decide a window: the cap matters only with a precision."""
    return (precision, max_seconds if precision else None)


def _settings_record(settings: Settings) -> dict[str, Any]:
    """asdict(settings), without an unset schedule or a scale of 1 (so folders written before
    schedules and topologies resume)."""
    record = asdict(settings)
    if not record.get("schedule"):
        record.pop("schedule", None)
    if record.get("scale") == 1:
        record.pop("scale", None)
    if not settings.compute.limited:  # folders written before node capacities resume
        record.pop("compute", None)
    if record.get("framework") == Settings.framework:  # folders written before frameworks resume
        record.pop("framework", None)
    for name in ("ranks_per_node", "collective"):  # at their defaults: as before ranks per node
        if record.get(name) == getattr(Settings, name):
            record.pop(name, None)
    for name in algorithm_keys.ALGORITHM_KEYS:  # unset: as before they were settings
        if record.get(name) is None:
            record.pop(name, None)
    return record


def pending(runs: Sequence[Run], statuses: Mapping[str, str]) -> Sequence[Run]:
    """The runs still to do: those without a record whose status is ok or timeout."""
    return [r for r in runs if statuses.get(r.run_id) not in COMPLETE_STATUSES]


def plan_record(book: Playbook, seed: int, runs: Sequence[Run]) -> dict[str, Any]:
    """What a results folder keeps about its playbook (playbook.json)."""
    return {"name": book.name, "source": book.source, "description": book.description, "seed": seed,
            "order": book.order, **({"order_seed": book.order_seed} if book.order_seed is not None else {}),
            "repetitions": book.repetitions, "digest": design_digest(book, runs),
            "precision": book.precision, "max_seconds": book.max_seconds,
            **({"congestion_control": book.congestion_control} if book.congestion_control else {}),
            "factors": [k for k, _ in book.factors],
            **({"topology": book.topology.to_json()} if book.topology is not None else {}),
            "runs": [{"run_id": r.run_id, "point": r.point, "repeat": r.repeat, "profile": r.profile.name,
                      **_settings_record(r.settings)} for r in runs]}


def check_resume(book: Playbook, runs: Sequence[Run], recorded: Mapping[str, Any] | None,
                 results_dir: Path, has_runs: bool) -> None:
    """Refuse to resume into a folder that holds another design's results."""
    if recorded is None:
        if has_runs:
            raise PlaybookError(f"{results_dir}: holds run records but no playbook.json, so they are not "
                                f"from playbook {book.name}", hint="give another folder with --output")
        return
    if recorded.get("digest") != design_digest(book, runs):
        raise PlaybookError(f"{results_dir}: holds results of a different design than {book.source} "
                            f"({_what_changed(book, recorded)})",
                            hint="give another folder with --output, or restore the playbook as it was")


def _what_changed(book: Playbook, recorded: Mapping[str, Any]) -> str:
    """Why a digest differs, where the record says: the precision or its cap, the congestion
    control (a record that holds the precision holds it too, where it was set); else in general."""
    was = _precision_window(recorded.get("precision"), recorded.get("max_seconds"))
    numbers = all(isinstance(v, (int, float, type(None))) and not isinstance(v, bool) for v in was)
    if "precision" in recorded and numbers and was != _precision_window(book.precision, book.max_seconds):
        def text(precision, cap) -> str:
            return "off" if not precision else f"{precision * 100:g} % within {cap:g} s"

        return f"its precision was {text(*was)}, now {text(book.precision, book.max_seconds)}"
    if "precision" in recorded and recorded.get("congestion_control") != book.congestion_control:
        def named(cc) -> str:
            return cc or "the nodes' own"

        return (f"its congestion control was {named(recorded.get('congestion_control'))}, "
                f"now {named(book.congestion_control)}")
    return "the playbook or its seed changed since"


# Settings field -> JobSpec field, for the settings that reach the training job
_JOB_FIELDS = {"strategy": "strategy", "model": "model", "batch": "batch_size", "ps": "ps",
               "accum_steps": "accum_steps", "data": "data", "framework": "framework",
               "ranks_per_node": "ranks_per_node", "collective": "collective"}


def job_fields(book: Playbook, settings: Settings, available: Iterable[str]) -> dict[str, Any]:
    """The JobSpec keyword arguments for a run, given the fields this build's JobSpec has.

    A setting the run depends on that JobSpec cannot carry yet (e.g. ps before the
    parameter-server strategy exists) is an error naming the playbook key, never dropped.
    """
    available = set(available)
    used = settings.effective()
    out: dict[str, Any] = {}
    for name, job_field in _JOB_FIELDS.items():
        value = getattr(used, name)
        if job_field in available:
            out[job_field] = value
            continue
        needed = (name == "ps" and settings.strategy in SERVER_STRATEGIES) or \
            (name == "accum_steps" and settings.strategy == "allreduce-accum") or \
            (name == "data" and value != Settings.data) or \
            (name == "framework" and value != Settings.framework) or \
            (name in ("ranks_per_node", "collective") and value != getattr(Settings, name))
        if needed:
            raise fail(book.source, book.where(FIELD_TO_KEY.get(name, name)), f"this netbench cannot run it yet: its job has no "
                       f"'{job_field}' field", "run a playbook without it, or update netbench")
    out.update(warmup=book.warmup, steps=book_steps(book), seconds=book.seconds)
    if "precision" in available:
        out.update(precision=book.precision, max_seconds=book.max_seconds)
    out.update(algorithm_keys.job_fields(book.job_extra, book.warmup, book.steps))  # issue 21's keys
    # an algorithm's setting as a factor or fixed (never with the same key under algorithm:, which
    # the loader refuses); None: unset, or ignored by this strategy (Settings.effective)
    out.update((name, getattr(used, name)) for name in algorithm_keys.ALGORITHM_KEYS
               if getattr(used, name) is not None)
    return out


def check_supported(book: Playbook, runs: Sequence[Run], strategies: Iterable[str],
                    models: Iterable[str]) -> None:
    """Fail before the first run when a run needs a strategy or model this build lacks."""
    strategies, models = set(strategies), set(models)
    for run in runs:
        if run.settings.strategy not in strategies:
            raise fail(book.source, book.where("strategy"), f"strategy {run.settings.strategy} is not available "
                       f"in this netbench (available: {', '.join(sorted(strategies))})")
        if run.settings.model not in models:
            raise fail(book.source, book.where("model"), f"model {run.settings.model} is not available in this "
                       f"netbench (available: {', '.join(sorted(models))})")


def describe_settings(settings: Settings) -> dict[str, str]:
    """Settings as people write them (by playbook key), for tables: {'latency': '10ms', 'batch_size': '32', ...}."""
    s = settings
    out = {"strategy": s.strategy, "model": s.model, "batch_size": str(s.batch), "workers": str(s.workers),
           "ps": str(s.ps) if s.strategy in SERVER_STRATEGIES else "-",
           "accum_steps": str(s.accum_steps) if s.strategy == "allreduce-accum" else "-", "data": s.data,
           "latency": units.format_duration_us(s.delay_us), "bandwidth": units.format_rate_bps(s.rate_bps),
           "loss": units.format_ratio(s.loss), "jitter": units.format_duration_us(s.jitter_us),
           "schedule": Path(s.schedule).name if s.schedule else "-", "scale": f"{s.scale:g}",
           "framework": s.framework, "ranks_per_node": str(s.ranks_per_node), "collective": s.collective}
    for key, strategy in algorithm_keys.OWNERS.items():  # unset: the job's default, "-" where unused
        value = getattr(s, key)
        out[key] = "-" if s.strategy != strategy else "default" if value is None else f"{value:g}"
    for node in s.compute.nodes():  # a playbook's per-node keys: cpus.n2, step_delay.n2 (max, 0ms: no limit)
        cpus, delay = s.compute.cpus_of(node), s.compute.delay_of(node)
        out[f"cpus.{node}"] = "max" if cpus is None else f"{cpus:g}"
        out[f"step_delay.{node}"] = units.format_duration_us(round(delay * 1e6))
    return out


def setting_cell(cells: dict[str, str], key: str) -> str:
    """A describe_settings cell, where a per-node key the run does not limit reads max or 0ms."""
    if key in cells:
        return cells[key]
    return "max" if key.startswith("cpus.") else "0ms" if key.startswith("step_delay.") else "-"


def fields_of(cls) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))
