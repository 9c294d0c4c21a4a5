"""The one orchestrator: plan -> testbed -> apply -> launch -> measure -> store, always reset."""

from __future__ import annotations

import random
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from netbench import measure
from netbench.emulation import changes as ch
from netbench.emulation.apply import BackendChoice, choose_backend, real_executor
from netbench.errors import TestbedError
from netbench.jobs.cluster import JobSpec, plan_allreduce
from netbench.jobs.launch import JobOutcome, Timeouts, run_job
from netbench.journal import Journal, Lock
from netbench.plan import RunPlan
from netbench.results import ResultStore, RunResult, environment_facts
from netbench.testbed import local
from netbench.testbed.topology import Topology

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


class Observer(Protocol):
    """What the terminal (or a test) hears while a sweep runs."""

    def sweep_started(self, config: SweepConfig, backend: BackendChoice, topology: Topology) -> None: ...
    def run_started(self, run: RunPlan) -> None: ...
    def step(self, run: RunPlan, event: dict) -> None: ...
    def run_finished(self, run: RunPlan, result: RunResult) -> None: ...
    def note(self, text: str) -> None: ...


class _Quiet:
    def sweep_started(self, *a): pass
    def run_started(self, *a): pass
    def step(self, *a): pass
    def run_finished(self, *a): pass
    def note(self, *a): pass


def make_result(run: RunPlan, config: SweepConfig, backend: str, outcome: JobOutcome,
                started: float, ended: float) -> RunResult:
    """Turn a job's events into a run record; warm-up steps are kept but excluded."""
    global_batch = config.job.batch_size * config.workers
    status, error, stats, per_worker = outcome.status, outcome.error, None, []
    chief = [e for e in outcome.events if e.get("worker") == 0]
    durations = measure.measured_durations(chief)
    if durations:
        stats = asdict(measure.step_stats(durations, global_batch))
    elif status == "ok":
        status, error = "failed", "no measured steps"
    for index in range(config.workers):
        mine = measure.measured_durations([e for e in outcome.events if e.get("worker") == index])
        if mine:
            per_worker.append(measure.step_stats(mine, config.job.batch_size).images_per_sec)
    return RunResult(run_id=run.run_id, profile=run.profile.to_record(), backend=backend,
                     strategy=config.job.strategy, model=config.job.model, batch_size=config.job.batch_size,
                     workers=config.workers, repeat=run.repeat, warmup_steps=config.job.warmup,
                     status=status, error=error, stats=stats, per_worker_images_per_sec=tuple(per_worker),
                     events=outcome.events, started=started, ended=ended)


def run_sweep(config: SweepConfig, observer: Observer | None = None, journal: Journal | None = None) -> list[RunResult]:
    """Run every planned point; whatever happens, leave the network as it was found."""
    observer = observer or _Quiet()
    journal = journal or Journal()
    store = ResultStore(config.output)
    results: list[RunResult] = []
    with Lock(journal.dir):
        backend = choose_backend(config.backend)
        topology = local.discover()
        brought_up = False
        if topology is not None and len(topology.nodes) < config.workers:
            raise TestbedError(f"the testbed that is up has {len(topology.nodes)} nodes; "
                               f"{config.workers} workers need {config.workers}",
                               hint="take it down with 'netbench testbed down' or use fewer --workers")
        manifest = {"sweep_id": config.sweep_id, "command_line": config.command_line,
                    "backend": backend.name, "backend_reason": backend.reason,
                    "started": time.time(), "ended": None, "runs": len(config.runs),
                    "job": asdict(config.job), "workers": config.workers,
                    "timeouts": asdict(config.timeouts), **environment_facts()}
        store.create()
        store.write_manifest(manifest)
        executor = None
        try:
            if topology is None:
                topology = local.up(config.workers, journal)
                brought_up = True
            manifest["testbed"] = topology.to_json()
            observer.sweep_started(config, backend, topology)
            executor = real_executor(journal)
            rng = random.Random(config.seed ^ int(time.time()))
            for run in config.runs:
                observer.run_started(run)
                executor.apply(ch.plan_apply(run.profile, topology, backend.name, seed=config.seed + 100 * run.index))
                tasks = plan_allreduce(config.job, topology.nodes, config.workers, port=rng.randrange(*PORT_RANGE))
                started = time.time()
                outcome = run_job(tasks, store.logs_dir / run.run_id, journal, config.timeouts,
                                  on_event=lambda e, run=run: observer.step(run, e))
                result = make_result(run, config, backend.name, outcome, started, time.time())
                store.add(result)
                results.append(result)
                observer.run_finished(run, result)
        finally:
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not stop the clean-up
            try:
                if executor is not None and topology is not None and not brought_up:
                    executor.apply(ch.plan_clear(topology))
                if brought_up:
                    local.down(journal)
                    observer.note("took down the testbed this sweep brought up")
                manifest["ended"] = time.time()
                manifest["completed_runs"] = len(results)
                store.write_manifest(manifest)
                journal.compact()
            finally:
                signal.signal(signal.SIGINT, previous)
    return results
