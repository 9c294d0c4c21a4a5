"""The one orchestrator: plan -> testbed -> apply -> launch -> measure -> store, always reset."""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Protocol

from netbench import interrupts
from netbench import stats as measure
from netbench.emulation.executor import BackendChoice
from netbench.experiment import verify
from netbench.errors import NetbenchError
from netbench.jobs import analysis, resources
from netbench.model.job import JobSpec, effective_accum_steps, images_per_step, nodes_needed, plan_job
from netbench.jobs.launch import JobOutcome, Spawner, Timeouts, run_job
from netbench.state.journal import Journal
from netbench.model.design import RunPlan
from netbench.experiment.store import ResultStore, RunResult, environment_facts
from netbench.experiment.verify import verify_point  # noqa: F401  (its home is verify.py; kept importable here)
from netbench.model.topology import Node, Topology
from netbench.testbed.base import Target

PORT_RANGE = (20000, 60000)


@dataclass(frozen=True)
class SweepConfig:
    sweep_id: str
    runs: tuple[RunPlan, ...]
    job: JobSpec
    workers: int
    output: Path
    backend: str | None = None
    timeouts: Timeouts = Timeouts()
    command_line: str = ""
    seed: int = 0
    verify: bool = False  # measure each point (ping, iperf3) before training on it


class Observer(Protocol):
    """What the terminal (or a test) hears while a sweep runs."""

    def sweep_started(self, config: SweepConfig, backend: BackendChoice, topology: Topology) -> None: ...
    def run_started(self, run: RunPlan) -> None: ...
    def profile_applied(self, run: RunPlan) -> None: ...
    def step(self, run: RunPlan, event: dict) -> None: ...
    def run_finished(self, run: RunPlan, result: RunResult) -> None: ...
    def note(self, text: str) -> None: ...


class _Quiet:
    def sweep_started(self, *a): pass
    def run_started(self, *a): pass
    def profile_applied(self, *a): pass
    def step(self, *a): pass
    def run_finished(self, *a): pass
    def note(self, *a): pass


def make_result(run: RunPlan, config: SweepConfig, backend: str, outcome: JobOutcome,
                started: float, ended: float) -> RunResult:
    """Turn a job's events into a run record; warm-up steps are kept but excluded."""
    job = config.job
    status, error, stats = outcome.status, outcome.error, None
    durations = measure.measured_durations(analysis.reference_events(outcome.events, job))
    if durations:
        stats = asdict(measure.step_stats(durations, images_per_step(job, config.workers)))
    elif status == "ok":
        status, error = "failed", "no measured steps"
    phases = analysis.phase_times(outcome.events, job)
    return RunResult(run_id=run.run_id, profile=run.profile.to_record(), backend=backend,
                     strategy=config.job.strategy, model=config.job.model, batch_size=config.job.batch_size,
                     workers=config.workers, repeat=run.repeat, warmup_steps=config.job.warmup,
                     status=status, error=error, stats=stats,
                     per_worker_images_per_sec=analysis.per_worker_images_per_sec(outcome.events, job, config.workers),
                     events=outcome.events, started=started, ended=ended,
                     ps=job.ps if job.strategy == "ps" else 0, accum_steps=effective_accum_steps(job),
                     data=job.data, **analysis.model_facts(outcome.events, job),
                     compute_time_mean_s=phases.compute_mean_s if phases else None,
                     comm_time_mean_s=phases.comm_mean_s if phases else None,
                     idle_ratio=phases.idle_ratio if phases else None,
                     resources=tuple({"key": u.key, **asdict(u)} for u in resources.summarise(outcome.events)))


Testbed = Target  # where a sweep runs: the one Target protocol of every command (testbed/base.py)


def run_sweep(config: SweepConfig, observer: Observer | None = None, journal: Journal | None = None,
              testbed: Testbed | None = None) -> list[RunResult]:
    """Run every planned point; whatever happens, leave the network as it was found.

    Returns each run's record without its step events (they are in the results folder's
    runs/<run>.json). `testbed`: where to run [default: the embedded testbed, journaled in
    `journal`]."""
    from netbench.testbed.embedded import EmbeddedTestbed

    observer = observer or _Quiet()
    testbed = testbed or EmbeddedTestbed(journal or Journal(), config.backend)
    store = ResultStore(config.output)
    results: list[RunResult] = []
    # every run's placement must fit (a playbook's runs differ in strategy and workers)
    needed = max((nodes_needed(run.job or config.job, run.workers or config.workers) for run in config.runs),
                 default=nodes_needed(config.job, config.workers))
    backend = testbed.prepare(config, needed)
    manifest = {"sweep_id": config.sweep_id, "command_line": config.command_line,
                "backend": backend.name, "backend_reason": backend.reason,
                "started": time.time(), "ended": None, "runs": len(config.runs),
                "job": asdict(config.job), "workers": config.workers,
                "timeouts": asdict(config.timeouts), "testbed_kind": testbed.kind, **environment_facts()}
    try:
        store.create()
        store.write_manifest(manifest)
        topology = testbed.start()
        manifest["testbed"] = topology.to_json()
        observer.sweep_started(config, backend, topology)
        rng = random.Random(config.seed ^ int(time.time()))
        sweep_config = config
        for run in sweep_config.runs:
            observer.run_started(run)
            # a playbook run carries its own job and worker count; below, config is this run's
            config = replace(sweep_config, job=run.job or sweep_config.job,
                             workers=run.workers or sweep_config.workers)
            testbed.apply(run, seed=config.seed + 100 * run.index)
            observer.profile_applied(run)
            verified = testbed.verify(run, observer) if config.verify else None
            tasks = plan_job(config.job, testbed.nodes_for(config.job, config.workers), config.workers,
                             port=rng.randrange(*PORT_RANGE))
            started = time.time()
            outcome = run_job(tasks, store.logs_dir / run.run_id, testbed.spawn, config.timeouts,
                              on_event=lambda e, run=run: observer.step(run, e))
            result = replace(make_result(run, config, backend.name, outcome, started, time.time()),
                             verify=verified)
            del outcome  # its events live on in `result` until it is stored
            store.add(result)
            observer.run_finished(run, result)
            # the stored record keeps the step events; the controller keeps only the summary, so a
            # long sweep's memory does not grow with every step of every run
            results.append(replace(result, events=()))
            del result
    finally:
        with interrupts.held_off():  # a second Ctrl-C, SIGTERM or SIGHUP must not stop the clean-up
            testbed.finish(observer.note)
            if store.dir.exists():
                manifest["ended"] = time.time()
                manifest["completed_runs"] = len(results)
                store.write_manifest(manifest)
    return results
