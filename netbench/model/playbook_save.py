"""A sweep's flags as the playbook that reproduces it (pure): `netbench sweep ... --save-playbook FILE`.

Each flag becomes the playbook key of its name (`--batch-size`: `batch_size`): a swept network flag with several levels a
factor (delay outermost, then rate, loss, jitter, then the per-node cpus and step_delay, as the
sweep crosses them), one level a fixed setting; the job's flags fixed settings or top-level keys;
files (--profile, --schedule, --topology) referenced by path, relative to the playbook's folder.
The design order is `as-written`, as a sweep's is. A sweep the format cannot express is refused
with the flag named (`SaveRefused`). `first_difference` compares a sweep's runs with the
playbook's, field by field, which is how a saved playbook is checked before it is kept.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from netbench import units
from netbench.model.compute import ALL, ComputeFactor
from netbench.model.job import ALGORITHM_SETTINGS, SERVER_STRATEGIES, JobSpec
from netbench.model.command_job import COMMAND


class SaveRefused(ValueError):
    """A sweep the playbook format cannot express; `flag` names the flag."""

    def __init__(self, flag: str, message: str, hint: str | None = None) -> None:
        super().__init__(f"flag {flag}: {message}")
        self.flag, self.message, self.hint = flag, message, hint


@dataclass(frozen=True)
class SweepSpec:
    """What a sweep's flags decided, in canonical units (the same values its runs are made of)."""

    job: JobSpec
    workers: int
    repeat: int = 1
    delay_us: tuple[int, ...] = ()
    rate_bps: tuple[int, ...] = ()
    loss: tuple[float, ...] = ()
    jitter_us: tuple[int, ...] = ()
    compute: tuple[ComputeFactor, ...] = ()
    profile: Path | None = None  # --profile
    schedules: tuple[Path, ...] = ()  # --schedule, each file
    topology: Path | None = None  # --topology
    scales: tuple[float, ...] = ()  # --scale
    seed: int = 0
    backend: str | None = None  # None: auto
    startup_timeout_s: float = 240.0
    step_timeout_s: float = 60.0
    congestion_control: str | None = None
    order_seed: int | None = None


def _exact(value: Any, pretty: Callable[[Any], str], plain: Callable[[Any], str], parse: Callable[[Any], Any]) -> str:
    """`pretty(value)` when it parses back to `value`, else the plain (exact) spelling."""
    text = pretty(value)
    return text if parse(text) == value else plain(value)


def _delay(us: int) -> str:
    return _exact(us, units.format_duration_us, lambda v: f"{v}us", units.parse_duration_us)


def _rate(bps: int | None) -> str:
    if bps is None:
        return "unlimited"
    return _exact(bps, units.format_rate_bps, lambda v: f"{v}bit", units.parse_rate_bps)


def _ratio(value: float) -> str:
    return _exact(value, units.format_ratio, lambda v: f"{v * 100!r}%", units.parse_ratio)


def _seconds(value: float, flag: str) -> str:
    if value < 1:  # a playbook's durations are whole seconds or more
        raise SaveRefused(flag, f"{value:g} s is under the playbook's 1 s", "give at least 1s")
    return _exact(value, lambda v: f"{v:g}s", lambda v: f"{round(v * 1e6)}us",
                  lambda t: units.parse_duration_us(t) / 1e6)


def _relative(path: Path, folder: Path) -> str:
    """`path` as the playbook at `folder` refers to it (the loader resolves it from there)."""
    return Path(os.path.relpath(Path(path).resolve(), Path(folder).resolve())).as_posix()


def _place(key: str, values: Sequence[Any], text: Callable[[Any], str], factors: dict, fixed: dict) -> None:
    if len(values) > 1:
        factors[key] = [text(v) for v in values]
    elif values:
        fixed[key] = text(values[0])


def playbook_mapping(spec: SweepSpec, folder: Path, name: str) -> dict[str, Any]:
    """The playbook (a mapping in key order) that gives `spec`'s runs; raises SaveRefused."""
    job = spec.job
    _refuse(spec)
    book: dict[str, Any] = {"name": name,
                            "description": "Saved from a netbench sweep (netbench sweep ... --save-playbook)."}
    factors: dict[str, Any] = {}
    fixed: dict[str, Any] = {}
    if spec.profile is not None:
        book["profile"] = _relative(spec.profile, folder)
    if spec.topology is not None:
        book["topology"] = _relative(spec.topology, folder)
        _place("scale", spec.scales or (1.0,), lambda v: v, factors, fixed)
    if spec.schedules:
        refs = [_relative(p, folder) for p in spec.schedules]
        book["schedule"] = refs[0] if len(refs) == 1 else refs
    _place("latency", spec.delay_us, _delay, factors, fixed)
    _place("bandwidth", spec.rate_bps, _rate, factors, fixed)
    _place("loss", spec.loss, _ratio, factors, fixed)
    _place("jitter", spec.jitter_us, _delay, factors, fixed)
    for factor in spec.compute:
        text = (lambda v: "max" if v is None else v) if factor.kind == "cpus" else (lambda v: _delay(round(v * 1e6)))
        factors.setdefault(factor.kind, {})[factor.node] = [text(v) for v in factor.levels]
    if job.command is None:
        fixed.update(strategy=job.strategy, model=job.model, batch_size=job.batch_size, data=job.data)
        if job.strategy in SERVER_STRATEGIES:
            fixed["ps"] = job.ps
        if job.strategy == "allreduce-accum":
            fixed["accum_steps"] = job.accum_steps
    fixed["workers"] = spec.workers
    fixed.update(framework=job.framework, ranks_per_node=job.ranks_per_node, collective=job.collective)
    if factors:
        book["factors"] = factors
    book["fixed"] = fixed
    book.update(repeat=spec.repeat, order="as-written", seed=spec.seed)
    if spec.order_seed is not None:
        book["order_seed"] = spec.order_seed
    book["warmup"] = job.warmup
    if job.train_steps:
        book["train_steps"] = job.train_steps
    elif job.seconds:
        book["seconds"] = _seconds(job.seconds, "--seconds")
    else:
        book["steps"] = job.steps
    book["precision"] = _ratio(job.precision) if job.precision else "off"
    book["max_seconds"] = _seconds(job.max_seconds, "--max-seconds")
    book["startup_timeout"] = _seconds(spec.startup_timeout_s, "--startup-timeout")
    book["step_timeout"] = _seconds(spec.step_timeout_s, "--step-timeout")
    book["backend"] = spec.backend or "auto"
    if spec.congestion_control:
        book["congestion_control"] = spec.congestion_control
    if job.eval_every:
        book["eval_every"] = job.eval_every
    if job.target_accuracy is not None:
        book["target_accuracy"] = job.target_accuracy
    own = {key: getattr(job, key) for key in ALGORITHM_SETTINGS.get(job.strategy, ())
           if getattr(job, key) is not None}
    if own:
        book["algorithm"] = own
    if job.command is not None:
        book["command"] = list(job.command.argv)
        if job.command.images_per_step is not None:
            book["images_per_step"] = job.command.images_per_step
        if job.command.step_regex:
            book["step_regex"] = job.command.step_regex
    return book


def _refuse(spec: SweepSpec) -> None:
    """The sweeps a playbook cannot express, each naming its flag."""
    job = spec.job
    swept = spec.delay_us or spec.rate_bps or spec.loss or spec.jitter_us
    if spec.schedules and swept:
        raise SaveRefused("--schedule", "with --latency/--bandwidth/--loss/--jitter levels a sweep runs each schedule "
                          "as one more point, where a playbook's schedule: crosses every point",
                          "save the grid and the schedules as two playbooks")
    if len(spec.schedules) > 1 and any(len(f.levels) > 1 for f in spec.compute):
        raise SaveRefused("--schedule", "several schedules crossed with --cpus/--step-delay levels run in another "
                          "order in a playbook (its schedules are innermost)", "save one schedule at a time")
    for factor in spec.compute:
        if factor.node == ALL:
            flag = "--cpus" if factor.kind == "cpus" else "--step-delay"
            raise SaveRefused(flag, "a level for every node has no playbook key (a playbook names each node)",
                              f"name the node, e.g. {flag} n2=...")
    if job.input_shape is not None:
        raise SaveRefused("--input-shape", "is not a playbook key")
    if job.classes is not None:
        raise SaveRefused("--classes", "is not a playbook key")
    if job.device != JobSpec.device or job.gpus_per_node != JobSpec.gpus_per_node:
        raise SaveRefused("--device" if job.device != JobSpec.device else "--gpus-per-node", "is not a playbook key")
    if job.strategy == COMMAND and job.command is None:
        raise SaveRefused("--strategy", "a command strategy without a command")


# ---------------------------------------------------------------- comparing runs

def _comparable_job(job: JobSpec | None) -> JobSpec | None:
    """The job with what its strategy ignores at the defaults (a sweep carries --ps and
    --accum-steps whatever the strategy; a playbook drops them: the same run either way)."""
    if job is None:
        return None
    if job.strategy not in SERVER_STRATEGIES:
        job = replace(job, ps=JobSpec.ps)
    if job.strategy != "allreduce-accum":
        job = replace(job, accum_steps=JobSpec.accum_steps)
    return job


def run_view(run: Any) -> dict[str, Any]:
    """What a run measures, as compared between a sweep and its saved playbook: its id, point,
    repetition, network (profile values, the per-pair topology), job, workers, node capacity and
    schedule with its timeline. Left out: the playbook's `settings` (a sweep has none) and the
    name of an unswept profile (a playbook names every point by its values) and the path a
    topology was read from (as written on the command line, or relative to the playbook)."""
    timeline = tuple((e.at_s, e.at_step, replace(e.profile, name="")) for e in run.timeline)
    return {"run_id": run.run_id, "point": run.point, "repeat": run.repeat,
            "profile": replace(run.profile, name="") if run.schedule is None else run.profile,
            "profile name": run.profile.name, "job": _comparable_job(run.job), "workers": run.workers,
            "compute": run.compute, "schedule": run.schedule.name if run.schedule is not None else None,
            "timeline": timeline, "pairs": replace(run.pairs, source="") if run.pairs is not None else None}


def first_difference(sweep_runs: Sequence[Any], book_runs: Sequence[Any], unswept: bool = False) -> str | None:
    """None when the runs are the same (run_view), else what differs first, in words.
    `unswept`: the sweep set no network level, so its point's profile name is not compared."""
    if len(sweep_runs) != len(book_runs):
        return f"{len(sweep_runs)} runs in the sweep, {len(book_runs)} in the playbook"
    for a, b in zip(sweep_runs, book_runs):
        va, vb = run_view(a), run_view(b)
        if unswept:
            va.pop("profile name")
            vb.pop("profile name")
        for key in va:
            if va[key] != vb[key]:
                both = f" ({va[key]!r} against {vb[key]!r})"
                return f"run {a.run_id}: its {key} differs" + (both if len(both) < 120 else "")
    return None
