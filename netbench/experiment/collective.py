"""`netbench collective`: time collectives on the testbed's links, per network point.

Each point is applied through the target as a sweep's is (Target.apply); then one
benchmark process per worker node (netbench.jobs.collective_bench) times every operation at
every size, and the all-reduce's times are fitted to alpha + beta x bytes
(netbench.model.collective). The results folder holds manifest.json, collective.csv (one row
per point, framework, operation and size) and points.json (every point's fits and sizes).

`measure` is also the sweep's collective calibration (experiment/predict.py): the same
processes on whatever the links hold.
"""

from __future__ import annotations

import csv
import importlib.util
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from netbench.errors import NetbenchError
from netbench.jobs.launch import Timeouts, run_job
from netbench.model import collective as maths
from netbench.model.job import JobSpec, plan_job
from netbench.model.run import Run

BENCH_MODULE = "netbench.jobs.collective_bench"
EVENT = "collective"
CSV_NAME = "collective.csv"
POINTS_NAME = "points.json"
CSV_COLUMNS = ("run_id", "profile", "delay_ms", "rate_mbit", "loss_pct", "framework", "workers", "op", "bytes",
               "time_s", "algbw_gbps", "busbw_gbps", "reps")
JOB = JobSpec(strategy="allreduce")  # the placement: one benchmark process per worker node


class CollectiveError(NetbenchError):
    """A benchmark's processes failed."""


def available_frameworks() -> tuple[str, ...]:
    """tf always; gloo when torch is importable in this Python."""
    return ("tf", "gloo") if importlib.util.find_spec("torch") is not None else ("tf",)


@dataclass(frozen=True)
class Settings:
    """What each point measures."""

    sizes: tuple[int, ...] = maths.doubling_sizes()
    ops: tuple[str, ...] = maths.OPS
    warmup: int = 2
    reps: int = 5
    timeout_s: float = 120.0


@dataclass(frozen=True)
class PointResult:
    """One point measured with one framework: each operation's sizes and the all-reduce's fit."""

    run_id: str
    profile: dict[str, Any]  # Profile.to_record()
    framework: str
    workers: int
    results: dict[str, tuple[maths.SizeResult, ...]]  # op -> sizes, ascending
    fit: maths.AlphaBeta | None  # the all-reduce's; None when it was not measured
    seconds: float = 0.0  # wall time of the measurement, start-up included

    def facts(self) -> dict[str, Any]:
        p = self.profile
        rate = p.get("rate_bps")
        return {"delay_ms": p.get("delay_us", 0) / 1000, "rate_mbit": None if rate is None else rate / 1e6,
                "loss_pct": round(p.get("loss", 0) * 100, 6), "workers": self.workers}

    def to_json(self) -> dict[str, Any]:
        """The --json shape: the point, the fitted terms and the all-reduce's sizes."""
        return {**self.facts(), "alpha_s": None if self.fit is None else self.fit.alpha_s,
                "beta_s_per_byte": None if self.fit is None else self.fit.beta_s_per_byte,
                "sizes": [s.to_json() for s in self.results.get("allreduce", ())]}

    def to_record(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "profile": self.profile, "framework": self.framework,
                "seconds": self.seconds, **self.to_json(),
                "ops": {op: [{**s.to_json(), "reps": s.reps} for s in sizes] for op, sizes in self.results.items()}}


def bench_argv(settings: Settings, framework: str, python: str = sys.executable) -> tuple[str, ...]:
    return (python, "-m", BENCH_MODULE, "--sizes", ",".join(str(s) for s in settings.sizes),
            "--ops", ",".join(settings.ops), "--framework", framework, "--warmup", str(settings.warmup),
            "--reps", str(settings.reps), "--timeout", f"{settings.timeout_s:g}")


def collect(events, workers: int, ops: tuple[str, ...]) -> dict[str, tuple[maths.SizeResult, ...]]:
    """Each op's sizes from the processes' collective events (pure)."""
    times: dict[tuple[str, int], list[list[float]]] = {}
    for event in events:
        if getattr(event, "kind", None) != EVENT:
            continue
        body = event.body()
        times.setdefault((body["op"], int(body["bytes"])), []).append([float(t) for t in body["times"]])
    out: dict[str, tuple[maths.SizeResult, ...]] = {}
    for op in ops:
        sizes = sorted(b for (o, b) in times if o == op)
        out[op] = tuple(maths.summarise(op, b, times[(op, b)], workers) for b in sizes)
    return out


def fit_of(results: dict[str, tuple[maths.SizeResult, ...]]) -> maths.AlphaBeta | None:
    sizes = results.get("allreduce", ())
    if not sizes:
        return None
    return maths.fit_alpha_beta([s.bytes for s in sizes], [s.time_s for s in sizes])


def measure(testbed, run: Run, settings: Settings, framework: str, log_dir: Path, port: int,
            timeouts: Timeouts = Timeouts(startup_s=240.0, step_s=300.0)) -> PointResult:
    """Time the collectives on the links as they are now (the caller applied the point)."""
    job = run.job if run.job.strategy == JOB.strategy else JOB  # its placement (ranks per node) is the run's
    nodes = testbed.nodes_for(job, run.workers)
    tasks = [replace(t, argv=bench_argv(settings, framework)) for t in plan_job(job, nodes, run.workers, port=port)]
    started = time.monotonic()
    outcome = run_job(tasks, log_dir, testbed.spawn, timeouts)
    if outcome.status != "ok":
        raise CollectiveError(f"collective benchmark at {run.profile.label()} ({framework}): {outcome.error}",
                              hint=f"the processes' logs are in {log_dir}")
    results = collect(outcome.events, run.workers, settings.ops)
    return PointResult(run_id=run.run_id, profile=run.profile.to_record(), framework=framework,
                       workers=run.workers, results=results, fit=fit_of(results),
                       seconds=time.monotonic() - started)


@dataclass(frozen=True)
class CollectiveConfig:
    runs: tuple[Run, ...]
    workers: int
    output: Path
    settings: Settings = Settings()
    frameworks: tuple[str, ...] = ("tf",)
    backend: str | None = None
    command_line: str = ""
    seed: int = 0
    topology: Any = None
    job: JobSpec = field(default=JOB)  # what Target.prepare reads (placement, messages)
    timeouts: Timeouts = Timeouts(startup_s=240.0, step_s=300.0)  # what a hosts target reads too
    run_as: Any = None  # testbed/run_as.RunAs: the user its processes run as (None: this process's own)


class Observer(Protocol):
    def started(self, config: CollectiveConfig, backend: str) -> None: ...
    def point_started(self, run: Run, framework: str) -> None: ...
    def point_finished(self, run: Run, point: PointResult) -> None: ...
    def note(self, text: str) -> None: ...


class _Quiet:
    def started(self, *a): pass
    def point_started(self, *a): pass
    def point_finished(self, *a): pass
    def note(self, *a): pass


def csv_rows(run: Run, point: PointResult) -> list[dict[str, Any]]:
    facts = point.facts()
    return [{"run_id": run.run_id, "profile": run.profile.name, "delay_ms": facts["delay_ms"],
             "rate_mbit": "" if facts["rate_mbit"] is None else facts["rate_mbit"], "loss_pct": facts["loss_pct"],
             "framework": point.framework, "workers": point.workers, "op": op, "bytes": s.bytes,
             "time_s": round(s.time_s, 9), "algbw_gbps": round(s.algbw_gbps, 6), "busbw_gbps": round(s.busbw_gbps, 6),
             "reps": s.reps}
            for op, sizes in point.results.items() for s in sizes]


def run_collective(config: CollectiveConfig, observer: Observer | None = None, testbed=None) -> list[PointResult]:
    """Every point, with every framework; whatever happens, the links are left as found."""
    import random

    from netbench.experiment.store import environment_facts, write_json
    from netbench.state.journal import Journal

    if testbed is None:
        from netbench.testbed.embedded import EmbeddedTestbed

        testbed = EmbeddedTestbed(Journal(), config.backend)
    observer = observer or _Quiet()
    needed = max([config.workers] + [len(r.pairs.nodes) for r in config.runs if r.pairs is not None])
    backend = testbed.prepare(config, needed)
    manifest = {"command_line": config.command_line, "backend": backend.name, "started": time.time(),
                "ended": None, "workers": config.workers, "frameworks": list(config.frameworks),
                "sizes": list(config.settings.sizes), "ops": list(config.settings.ops),
                "warmup": config.settings.warmup, "reps": config.settings.reps, "testbed_kind": testbed.kind,
                **environment_facts()}
    points: list[PointResult] = []
    rng = random.Random(config.seed ^ int(time.time()))
    try:
        config.output.mkdir(parents=True, exist_ok=True)
        write_json(config.output / "manifest.json", manifest)
        testbed.start()
        observer.started(config, backend.name)
        with open(config.output / CSV_NAME, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
            writer.writeheader()
            for run in config.runs:
                testbed.apply(run, seed=config.seed + 100 * run.index)
                for framework in config.frameworks:
                    observer.point_started(run, framework)
                    point = measure(testbed, run, config.settings, framework,
                                    config.output / "logs" / f"{run.run_id}-{framework}", port=rng.randrange(20000, 30000),
                                    timeouts=config.timeouts)
                    points.append(point)
                    writer.writerows(csv_rows(run, point))
                    fh.flush()
                    write_json(config.output / POINTS_NAME, [p.to_record() for p in points])
                    observer.point_finished(run, point)
    finally:
        from netbench import interrupts

        with interrupts.held_off():  # a second Ctrl-C must not stop the clean-up
            testbed.finish(observer.note)
            manifest["ended"] = time.time()
            if config.output.exists():
                write_json(config.output / "manifest.json", manifest)
    return points


def json_report(points: list[PointResult], framework: str = "tf") -> dict[str, Any]:
    """What `netbench collective --json` prints: `framework`'s points."""
    return {"points": [p.to_json() for p in points if p.framework == framework]}
