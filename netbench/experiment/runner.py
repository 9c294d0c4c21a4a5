"""The one orchestrator: plan -> testbed -> apply -> launch -> measure -> store, always reset."""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Protocol

from netbench import interrupts, provenance
from netbench import stats as measure
from netbench.emulation.executor import BackendChoice
from netbench.jobs import accuracy, analysis, events, link_check, resources, stragglers
from netbench.model.job import OWN_PACE_STRATEGIES, SERVER_STRATEGIES, JobSpec, algorithm_settings, effective_accum_steps, images_per_step, \
    nodes_needed, plan_job
from netbench.jobs import user_results
from netbench.model.ranks import rank_nodes
from netbench.jobs.launch import JobOutcome, Timeouts, run_job
from netbench.experiment import launch as launches
from netbench.experiment.launch import PORT_RANGE, Settle
from netbench.state.journal import Journal
from netbench.model.run import Run, check_step_delays
from netbench.experiment.store import ResultStore, RunResult, environment_facts
from netbench.model.topology import Topology
from netbench.testbed.base import Target



@dataclass(frozen=True)
class SweepConfig:
    """A sweep or a playbook session: its runs (each with its own job and worker count) and
    what they share. `job` and `workers` describe the sweep as a whole (the manifest, the
    views); a run's own are on the run."""

    sweep_id: str
    runs: tuple[Run, ...]
    job: JobSpec
    workers: int
    output: Path
    backend: str | None = None
    timeouts: Timeouts = Timeouts()
    command_line: str = ""
    seed: int = 0
    verify: bool = False  # measure each point (ping, iperf3) before training on it
    # one launch (start of the job's processes) per point; False: a launch serves many points
    isolate: bool = False
    order: str = "descending"  # the points' order within a launch (experiment/launch.py ORDERS)
    settle: Settle = Settle()  # how long a point's change settles in a shared launch
    order_seed: int | None = None  # the points' order within each launch; None: drawn (and recorded)
    topology: Any = None  # model.pairs.PairTopology (unscaled) the runs apply at their scales; for the manifest
    predict: bool = False  # calibrate before the first point; each run gets predicted_step_s (experiment/predict.py)
    recalibrate: bool = False  # measure every calibration again, never reusing a cached one (--recalibrate)
    # every node's TCP congestion control for the sweep (--congestion-control; the embedded
    # testbed sets it and puts the previous one back); None: the nodes' own, reported as found
    congestion_control: str | None = None
    run_as: Any = None  # testbed/run_as.RunAs: the user job processes run as (None: this process's own)
    shard: str = ""  # "I/N": the campaign shard these runs are (every record's provenance says so)


class Observer(Protocol):
    """What the terminal (or a test) hears while a sweep runs."""

    def sweep_started(self, config: SweepConfig, backend: BackendChoice, topology: Topology) -> None: ...
    def run_started(self, run: Run) -> None: ...  # each point, whether or not it has its own launch
    # right after run_started: the point's launch (None: a launch of its own, --isolate, a
    # schedule, --verify, the hosts target) and its place in it, 1-based, of `points`
    # (1 of 1 in a launch of its own)
    def launch_point(self, run: Run, launch: int | None, position: int, points: int) -> None: ...
    def profile_applied(self, run: Run) -> None: ...
    def step(self, run: Run, event: events.Event) -> None: ...
    # once the point's measured window is over, before run_finished: the chief's first measured
    # step's start and its last one's end, as the controller saw them (Unix time, seconds); not
    # heard for a point that measured nothing
    def window(self, run: Run, start_wall: float, end_wall: float) -> None: ...
    def run_finished(self, run: Run, result: RunResult) -> None: ...
    def note(self, text: str) -> None: ...


class _Quiet:
    def sweep_started(self, *a): pass
    def run_started(self, *a): pass
    def launch_point(self, *a): pass
    def profile_applied(self, *a): pass
    def step(self, *a): pass
    def window(self, *a): pass
    def run_finished(self, *a): pass
    def note(self, *a): pass


def make_result(run: Run, backend: str, outcome: JobOutcome, started: float, ended: float,
                link: dict | None = None, nodes: tuple[str, ...] = ()) -> RunResult:
    """Turn a job's events into a run record; warm-up steps are kept but excluded. `link`: a
    user's command that reports no steps, measured in bytes on its links (experiment/link_window.py):
    the record's link_bytes, no step statistics. `nodes`: the workers' nodes in rank order
    (worker_nodes), which name the straggler."""
    job, workers = user_results.resolved_job(run.job, outcome.events, run.workers), run.workers
    status, error, stats = outcome.status, outcome.error, None
    durations = analysis.measured_durations(outcome.events, job)
    rates = analysis.per_worker_images_per_sec(outcome.events, job, workers)
    if durations:
        stats = analysis.cluster_throughput(asdict(measure.step_stats(durations, images_per_step(job, workers))),
                                            outcome.events, job, workers)
    elif status == "ok" and link is None:
        status, error = "failed", "no measured steps"
    phases = analysis.phase_times(outcome.events, job)
    scored = accuracy.summarise(outcome.events, job)
    return RunResult(run_id=run.run_id, profile=run.profile.to_record(), backend=backend,
                     strategy=job.strategy, model=job.model, batch_size=job.batch_size,
                     workers=workers, repeat=run.repeat, warmup_steps=job.warmup,
                     status=status, error=error, stats=stats,
                     per_worker_images_per_sec=rates,
                     events=tuple(events.as_record(e) for e in outcome.events), started=started, ended=ended,
                     ps=job.ps if job.strategy in SERVER_STRATEGIES else 0, accum_steps=effective_accum_steps(job),
                     data=job.data, **analysis.model_facts(outcome.events, job),
                     compute_time_mean_s=phases.compute_mean_s if phases else None,
                     comm_time_mean_s=phases.comm_mean_s if phases else None,
                     idle_ratio=phases.idle_ratio if phases else None,
                     step=analysis.step_kind(outcome.events, job), split_from=phases.source if phases else None,
                     resources=tuple({"key": u.key, **asdict(u)} for u in resources.summarise(outcome.events, job.ranks_per_node)),
                     topology=run.pairs.to_json() if run.pairs is not None else None,
                     **window_precision(durations, None if job.train_steps else job.precision),
                     wait_time_mean_s=phases.wait_mean_s if phases else None,
                     staleness_mean=phases.staleness_mean if phases else None,
                     accuracy_curve=tuple(p.to_record() for p in scored.curve),
                     test_accuracy=scored.test_accuracy, steps_to_target=scored.steps_to_target,
                     time_to_target_s=scored.time_to_target_s, target_accuracy=job.target_accuracy,
                     **user_results.origin(outcome.events, job, link),
                     link_bytes=link, link_bytes_per_s=None if link is None else link["sent_bytes_per_s_mean"],
                     **link_check.record_fields(outcome.events, job, workers),
                     algorithm=algorithm_settings(job, workers) or None,
                     stragglers=_stragglers(outcome.events, job, nodes),
                     compute=run.compute.to_record() if run.compute.limited else None)


def _stragglers(events_: tuple, job: JobSpec, nodes: tuple[str, ...]) -> dict | None:
    found = stragglers.attribute(events_, job, nodes, backup_workers=job.backup_workers)
    return None if found is None else found.to_record()


def worker_nodes(testbed: Target, run: Run) -> tuple[str, ...]:
    """Each rank's node, in rank order (model/ranks.py rank_nodes: node-major, ranks_per_node
    ranks a node; placement puts the workers' nodes first)."""
    return rank_nodes(tuple(n.name for n in testbed.nodes_for(run.job, run.workers)), run.workers,
                      run.job.ranks_per_node)


def window_precision(durations: list[float], precision: float | None) -> dict:
    """RunResult's step_time_ci_pct (the 95 % batch-means half-width in % of the mean step time)
    and precision_reached (None without a precision) for a window's measured `durations`."""
    width = measure.relative_half_width(measure.batch_means_interval(durations)) if durations else None
    reached = None if not precision else (width is not None and width <= precision)
    return {"step_time_ci_pct": None if width is None else 100 * width, "precision_reached": reached}


def _driver(run: Run, testbed: Target, seed: int, observer: Observer):
    """The RunDriver of a run with a schedule (None without): each change goes through the
    target as a run's profile does, and the observers hear it as a profile applied."""
    if run.schedule is None:
        return None
    from netbench.experiment.schedule import RunDriver
    from netbench.model.schedule import compute_at

    entries = {id(entry.profile): entry for entry in run.timeline}  # a change's node capacity goes with it

    def apply(profile) -> None:
        testbed.apply(replace(run, profile=profile, compute=compute_at(run.compute, entries.get(id(profile)))),
                      seed=seed)

    def landed(item) -> None:
        observer.profile_applied(replace(run, profile=item.profile))
        when = f"step {item.at_step}" if item.at_step is not None else f"{item.scheduled_s:.3f}s"
        observer.note(f"{run.run_id} schedule {run.schedule.name}: {when} -> {item.profile.name} ({item.profile.label()}) "
                      f"(landed {item.lateness_s * 1000:.1f} ms after due)")

    # the target's netlink sockets for the schedule's own thread, held for its life (not one per change)
    return RunDriver(run.schedule, run.timeline, run.profile, apply, on_change=landed,
                     hold=getattr(testbed, "schedule_thread", None))


def _heard(observer: Observer, run: Run, driver, event: events.Event) -> None:
    observer.step(run, event)
    if driver is not None:
        driver.event(event)


def _with_schedule(result: RunResult, driver) -> RunResult:
    """The record with its schedule section; a schedule that failed fails an ok run."""
    record = driver.record()
    if driver.error and result.status == "ok":
        return replace(result, schedule=record, status="failed", error=f"schedule: {driver.error}")
    return replace(result, schedule=record)


def _emulation_kept(result: RunResult, testbed: Target) -> RunResult:
    """A run during which part of the emulation died (a delay engine: its node's traffic was
    dropped from then on) fails, whatever its steps said: its figures are not of its profile."""
    check = getattr(testbed, "emulation_lost", None)
    lost = check() if check is not None else None
    if lost and result.status != "failed":
        return replace(result, status="failed", error=f"emulation: {lost}")
    return result


def split_runs(config: SweepConfig, testbed_kind: str) -> tuple[list[Run], list[Run]]:
    """(runs that get a launch of their own, runs that share launches).

    A run launches on its own under --isolate, with a schedule (its changes are driven from
    its own first measured step), with --verify (the measurement must not share the links with
    training), on the hosts target (workers' clocks are not the controller's), and with
    train_steps (an accuracy run trains a fresh model: it never inherits another point's). A
    user's command always runs in launches (one per point under --isolate, or when it never asks
    track.stop_requested()): the controller, not the job, decides its window. So do the own-pace
    strategies under --isolate (a launch per point): their workers step apart, and only the
    controller measures them all over one window, once all of them are in."""
    if config.verify or testbed_kind == "hosts":
        own = list(config.runs)
    else:
        own = [r for r in config.runs if r.schedule is not None or r.job.train_steps
               or (config.isolate and r.job.strategy not in OWN_PACE_STRATEGIES)]
    return [r for r in own if r.job.command is None], [r for r in config.runs if r not in own or r.job.command]


def _run_isolated(run: Run, config: SweepConfig, testbed: Target, store: ResultStore, observer: Observer,
                  backend: str, rng: random.Random, finish: Callable[[Run, RunResult], None]) -> None:
    """One point in a launch of its own: apply, start the job, run it to its end, record."""
    observer.run_started(run)
    observer.launch_point(run, None, 1, 1)
    testbed.apply(run, seed=config.seed + 100 * run.index)
    observer.profile_applied(run)
    verified = testbed.verify(run, observer) if config.verify else None
    tasks = plan_job(run.job, testbed.nodes_for(run.job, run.workers), run.workers,
                     port=rng.randrange(*PORT_RANGE))
    started = time.time()
    driver = _driver(run, testbed, config.seed + 100 * run.index, observer)
    try:
        outcome = run_job(tasks, store.log_dir(run.run_id), testbed.spawn, config.timeouts,
                          on_event=lambda e, d=driver: _heard(observer, run, d, e))
    finally:
        if driver is not None:  # however the run ended, no change is made after it
            with interrupts.held_off():
                driver.stop()
    result = replace(make_result(run, backend, outcome, started, time.time(), nodes=worker_nodes(testbed, run)),
                     verify=verified)
    if driver is not None:
        result = _with_schedule(result, driver)
    measured = launches.measured_window(analysis.reference_events(outcome.events, run.job))
    if measured is not None:
        observer.window(run, *measured)
    del outcome  # its events live on in `result` until it is stored
    finish(run, result)


def _lease_checked(testbed: Target, result: RunResult) -> RunResult:
    """`result` failed when a host lost its lease while the run had it (the host reverted
    itself: the run did not have its profile). Only a target holding leases (SSH hosts) has
    `lease_lost`; it asks every host again, after the run's end."""
    lease_lost = getattr(testbed, "lease_lost", None)
    why = lease_lost(result.ended) if lease_lost is not None else None
    if why is None:
        return result
    return replace(result, status="failed", error="; ".join(filter(None, [result.error, why])))


def where_ran(testbed: Target, shard: str = "") -> dict:
    """The runs' `provenance`: this machine's facts, or a target's own (SSH hosts: theirs)."""
    own = getattr(testbed, "provenance", None)
    return own(shard) if own is not None else provenance.machine(shard)


Testbed = Target  # where a sweep runs: the one Target protocol of every command (testbed/base.py)


def describe_congestion(by_node: dict[str, str], requested: str | None = None, default: str | None = None) -> str:
    """One line for the sweep's start: the nodes' TCP congestion control (pure; model/congestion.py)."""
    from netbench.model.congestion import describe

    return describe(by_node, requested, default)


def calibration_links(testbed: Target, note: Callable[[str], None]) -> str | None:
    """What the calibrations will measure on: "unshaped" where the target cleared its links'
    shaping first (`unshaped_links`; what a `netbench apply` left before the sweep, noted: each
    point applies its own profile anyway), None where it cannot say (nothing is cached then)."""
    unshape = getattr(testbed, "unshaped_links", None)
    if unshape is None:
        return None
    if unshape():
        note("calibration: the links held shaping from before the sweep (a 'netbench apply'): cleared, so "
             "the calibrations measure unshaped links, as the predictions assume (each point applies its own)")
    return "unshaped"


def calibration_reuse(config: SweepConfig, testbed: Target, backend: str, congestion: str | None,
                      links: str | None = None):
    """Where the sweep's calibrations may come from (experiment/predict.py's Reuse): keyed by the
    testbed kind, backend, nodes' congestion control and the links they measured on (`links`:
    calibration_links) on this host; the per-machine cache on the embedded testbed only (the
    hosts' own facts are not part of the key), and only over unshaped links: a calibration on
    shaped ones would carry their delay into every prediction that reused it."""
    from netbench.experiment import calibration_cache
    from netbench.experiment.predict import Reuse

    place = {"testbed": testbed.kind, "backend": backend, "congestion_control": congestion or "",
             "links": links or "as found"}
    if testbed.kind != "embedded":  # the hosts as `netbench node info` described them
        infos = getattr(testbed, "infos", {}) or {}
        place["hosts"] = {name: [info.get("host"), info.get("kernel"), info.get("tensorflow")]
                          for name, info in sorted(infos.items())}
    cache = calibration_cache.CalibrationCache() if testbed.kind == "embedded" and links == "unshaped" else None
    return Reuse(place=place, host=calibration_cache.host_facts(), cache=cache, recalibrate=config.recalibrate)


def check_jobs(config: SweepConfig) -> None:
    """Refuse, before anything is set up, a run whose job cannot run as asked (model.job.check_job
    names the setting); the commands check their flags first, this catches what they let through."""
    from netbench.errors import UsageError
    from netbench.model.job import check_job

    for job, workers in [(run.job, run.workers) for run in config.runs] or [(config.job, config.workers)]:
        try:
            check_job(job, workers)
        except ValueError as exc:
            raise UsageError(f"setting {exc}", hint="the flag of the same name (netbench sweep --help), "
                             "or the playbook key, says what it takes") from None
    check_step_delays(config.runs)


def run_sweep(config: SweepConfig, observer: Observer | None = None, journal: Journal | None = None,
              testbed: Testbed | None = None) -> list[RunResult]:
    """Run every planned point; whatever happens, leave the network as it was found.

    Returns each run's record without its step events (they are in the results folder's
    runs/<run>.json). `testbed`: where to run [default: the embedded testbed, journaled in
    `journal`]."""
    from netbench.testbed.embedded import EmbeddedTestbed

    observer = observer or _Quiet()
    testbed = testbed or EmbeddedTestbed(journal or Journal(), config.backend)
    check_jobs(config)
    store = ResultStore(config.output)
    results: list[RunResult] = []
    # every run's placement must fit (a playbook's runs differ in strategy and workers)
    needed = max((nodes_needed(run.job, run.workers) for run in config.runs),
                 default=nodes_needed(config.job, config.workers))
    needed = max([needed] + [len(run.pairs.nodes) for run in config.runs if run.pairs is not None])  # every pair's node
    backend = testbed.prepare(config, needed)
    manifest = {"sweep_id": config.sweep_id, "command_line": config.command_line,
                "backend": backend.name, "backend_reason": backend.reason,
                "started": time.time(), "ended": None, "runs": len(config.runs),
                "job": asdict(config.job), "workers": config.workers,
                "timeouts": asdict(config.timeouts), "testbed_kind": testbed.kind, **environment_facts()}
    if config.topology is not None:
        manifest["topology"] = config.topology.to_json()
    try:
        store.create()
        store.write_manifest(manifest)
        topology = testbed.start()
        manifest["testbed"] = topology.to_json()
        observer.sweep_started(config, backend, topology)
        congestion, nodes_cc = getattr(testbed, "congestion_control", None), None  # the nodes' or the hosts' own
        if congestion is not None:
            manifest["tcp_congestion_control"] = congestion()  # read back, after the testbed set it
            default = getattr(testbed, "congestion_default", None)  # the embedded nodes' default, set by start
            line = describe_congestion(manifest["tcp_congestion_control"], config.congestion_control, default)
            withheld = getattr(testbed, "congestion_withheld", None)  # the default a sandbox without root may not set
            observer.note(line + (f" ({withheld})" if withheld else ""))
            if withheld:
                manifest["congestion_control_withheld"] = withheld
            if default:
                manifest["congestion_control_default"] = default
            nodes_cc = ";".join(sorted(set(manifest["tcp_congestion_control"].values()) - {""})) or None
        if config.congestion_control:
            manifest["congestion_control"] = config.congestion_control
        from netbench.experiment.lossy import note as lossy_note

        if lossy_note(config.runs):  # points with loss will likely run to their cap: said before they do
            observer.note(lossy_note(config.runs))
        rng = random.Random(config.seed ^ int(time.time()))
        predictor = None
        if config.predict:
            from netbench.experiment import predict

            links = calibration_links(testbed, observer.note)
            predictor, manifest["calibration"] = predict.calibrate(
                config.runs, testbed, store.dir / "logs", observer.note, config.seed,
                calibration_reuse(config, testbed, backend.name, nodes_cc, links))
            store.write_manifest(manifest)

        where = where_ran(testbed, config.shard)

        def finish(run: Run, result: RunResult) -> None:
            result = replace(_lease_checked(testbed, result), provenance=where)
            result = _emulation_kept(result, testbed)
            if predictor is not None:
                result = predict.annotate(result, run, predictor)
            if nodes_cc is not None:
                result = replace(result, congestion_control=nodes_cc)
            store.add(result)
            observer.run_finished(run, result)
            # the stored record keeps the step events; the controller keeps only the summary, so a
            # long sweep's memory does not grow with every step of every run
            results.append(replace(result, events=()))

        own, shared = split_runs(config, testbed.kind)
        order_seed = config.order_seed if config.order_seed is not None else random.SystemRandom().randrange(2**31)
        plans = launches.plan_launches(shared, order_seed, config.order)
        ctx = launches.Context(config=config, testbed=testbed, store=store, observer=observer,
                               make_result=make_result, finish=finish, backend_name=backend.name,
                               settle=config.settle, ports=rng, started=manifest.setdefault("launches", []),
                               congestion=nodes_cc)
        manifest.update(isolate=config.isolate, order=config.order, order_seed=order_seed, settle=asdict(config.settle),
                        isolated_runs=[r.run_id for r in own],
                        launch_plan=[{"group": p.group, "seed": p.seed, "runs": [r.run_id for r in p.runs]}
                                     for p in plans])
        store.write_manifest(manifest)
        for run in own:
            _run_isolated(run, config, testbed, store, observer, backend.name, rng, finish)
        for plan in plans:
            launches.run_launch(plan, ctx)
    finally:
        with interrupts.held_off():  # a second Ctrl-C, SIGTERM or SIGHUP must not stop the clean-up
            testbed.finish(observer.note)
            if store.dir.exists():
                manifest["ended"] = time.time()
                manifest["completed_runs"] = len(results)
                store.write_manifest(manifest)
    return results
