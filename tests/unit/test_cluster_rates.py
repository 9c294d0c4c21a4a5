"""The cluster's images/sec where the workers do not leave each step together, in the results,
the live metrics and the terminal alike (jobs/analysis.py rate_rule): the own-pace strategies
sum their workers' own rates; ps-sync with backup workers sums the images of the gradients its
rounds applied and times its rounds by a worker that was in them; and the per-process image
counters count what each process trained, never going down."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from netbench.cli.render import SweepView
from netbench.experiment.runner import make_result
from netbench.jobs import events as ev
from netbench.jobs.launch import JobOutcome
from netbench.metrics.collector import NetbenchCollector
from netbench.metrics.state import MetricsObserver, MetricsState
from netbench.model.job import JobSpec
from netbench.model.profile import Profile
from netbench.model.run import Run

DROPPED, APPLIED = (("dropped", True),), (("dropped", False),)


def step(worker: int, k: int, duration: float, extra=()) -> ev.Step:
    return ev.Step(step=k, phase="measured", duration=duration, worker=worker, compute=duration * 0.9,
                   comm=duration * 0.1, wait=0.0, extra=extra)


def run_of(job: JobSpec, workers: int) -> Run:
    return Run(index=0, profile=Profile(name="lan"), repeat=0, job=job, workers=workers)


def scrape(state: MetricsState) -> dict:
    registry = CollectorRegistry()
    registry.register(NetbenchCollector(state, None))
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def observed(job: JobSpec, workers: int) -> tuple[MetricsObserver, MetricsState, Run]:
    state = MetricsState(clock=lambda: 1000.0)
    observer = MetricsObserver(state)
    run = run_of(job, workers)
    observer.sweep_started(SimpleNamespace(sweep_id="s", runs=(run,), workers=workers, job=job),
                           SimpleNamespace(name="tbf"), SimpleNamespace(nodes=()))
    observer.run_started(run)
    return observer, state, run


@pytest.mark.parametrize("backup", [1, 2])
def test_backup_workers_counters_count_each_process_s_trained_images_and_never_go_down(backup):
    """batch x (1 - B) per step was 0 at B = 1 and negative at B = 2: a counter reset to Prometheus."""
    job = JobSpec(strategy="ps-sync", batch_size=16, backup_workers=backup)
    observer, state, run = observed(job, 3)
    seen = []
    for k in range(4):
        for worker in range(3):
            observer.step(run, step(worker, k, 0.1, DROPPED if worker == 2 else APPLIED))
        seen.append(scrape(state)["netbench_samples_total"])
    for worker in range(3):
        counts = [s[(("phase", "measured"), ("worker", str(worker)))] for s in seen]
        assert counts == [16.0, 32.0, 48.0, 64.0]  # its batch a step, dropped or not


def backup_run_events() -> list[ev.Step]:
    """ps-sync, 3 workers, 1 backup: worker 0 is the slow one (0.4 s steps, every gradient
    dropped as late); workers 1 and 2 make every round, one every 0.1 s."""
    events = [step(0, k, 0.4, DROPPED) for k in range(3)]
    events += [step(w, k, 0.1, APPLIED) for w in (1, 2) for k in range(12)]
    return events


def test_ps_sync_with_backup_workers_times_its_rounds_by_a_worker_that_was_in_them():
    from netbench.jobs import analysis

    job = JobSpec(strategy="ps-sync", batch_size=10, backup_workers=1)
    events = backup_run_events()
    result = make_result(run_of(job, 3), "tbf", JobOutcome("ok", tuple(events)), 0.0, 1.0)
    # a round every 0.1 s, each applying 2 gradients of 10 images: 200 images/s (worker 0's
    # steps said a round every 0.4 s: 50 images/s)
    assert result.stats["mean_s"] == pytest.approx(0.1) and result.stats["steps"] == 12
    assert result.stats["images_per_sec"] == pytest.approx(200.0)
    assert analysis.round_worker(events) == 1
    # drops spread over every worker: the images the rounds applied, each worker over its own time
    spread = [step(w, k, 0.1, DROPPED if (k + w) % 3 == 0 else APPLIED) for w in range(3) for k in range(9)]
    result = make_result(run_of(job, 3), "tbf", JobOutcome("ok", tuple(spread)), 0.0, 1.0)
    assert result.stats["images_per_sec"] == pytest.approx(3 * 10 * 6 / 0.9)


def own_pace_steps(observer: MetricsObserver, run, view: SweepView | None = None) -> None:
    """The chief steps every 10 ms, worker 1 every 40 ms (64 images each): 6,400 + 1,600 images/s."""
    for k in range(8):
        for worker, duration in ((0, 0.01), (1, 0.04)):
            if worker == 1 and k % 4:
                continue
            event = step(worker, k, duration)
            observer.step(run, event)
            if view is not None:
                view.step(run, event)


@pytest.fixture
def unthrottled(monkeypatch):
    """The terminal's line redrawn at every chief step (it is at most every 0.1 s)."""
    from netbench.cli import render

    monkeypatch.setattr(render, "REFRESH_S", 0.0)


def test_the_live_rate_of_an_own_pace_strategy_is_the_sum_of_its_workers_own_rates(unthrottled):
    job = JobSpec(strategy="ps-async", batch_size=64)
    observer, state, run = observed(job, 2)
    view = SweepView(SimpleNamespace(runs=(run,), sweep_id="s"))
    shown = []
    view.progress = SimpleNamespace(update=lambda task, **kw: shown.append(kw.get("info", "")))
    own_pace_steps(observer, run, view)
    assert scrape(state)["netbench_run_images_per_second"][()] == pytest.approx(8000.0)  # not 2 x 6,400
    assert "8,000 img/s" in shown[-1]
    # the results say the same (jobs/analysis.py cluster_throughput)
    events = [step(0, k, 0.01) for k in range(8)] + [step(1, k, 0.04) for k in range(2)]
    result = make_result(run, "tbf", JobOutcome("ok", tuple(events)), 0.0, 1.0)
    assert result.stats["images_per_sec"] == pytest.approx(8000.0)


def test_the_live_rate_waits_for_every_worker_and_follows_ps_sync_s_applied_gradients(unthrottled):
    job = JobSpec(strategy="gosgd", batch_size=64)
    observer, state, run = observed(job, 2)
    observer.step(run, step(0, 0, 0.01))
    assert "netbench_run_images_per_second" not in scrape(state)  # worker 1 has not stepped yet
    backup = JobSpec(strategy="ps-sync", batch_size=10, backup_workers=1)
    observer, state, run = observed(backup, 3)
    view = SweepView(SimpleNamespace(runs=(run,), sweep_id="s"))
    shown = []
    view.progress = SimpleNamespace(update=lambda task, **kw: shown.append(kw.get("info", "")))
    for event in sorted(backup_run_events(), key=lambda e: (e.step, e.worker)):
        observer.step(run, event)
        view.step(run, event)
    assert scrape(state)["netbench_run_images_per_second"][()] == pytest.approx(200.0)
    assert shown[-1].endswith("200 img/s")
