"""A precision's least window: the floor in batch means (stats.least_steps), how the sweep, a
playbook and the worker choose it when no steps are given, and both paths that honour it (a
launch's PointWindow, the workers' extend_for_precision)."""

from __future__ import annotations

import random
import time

import pytest
from click.testing import CliRunner

from netbench import stats
from netbench.experiment.launch import PointWindow, Settle
from netbench.model.job import DEFAULT_STEPS, JobSpec, window_steps

FLOOR = stats.LEAST_BATCHES * stats.LEAST_BATCH_STEPS


# ---------------------------------------------------------------- the function

def test_the_floor_is_8_batch_means_of_4_steps():
    assert FLOOR == 32 and stats.least_steps(0.02) == 32
    assert stats.batch_count(FLOOR) == stats.LEAST_BATCHES  # its first check has 8 batches, t(7)
    assert stats.batch_count(FLOOR - 1) < stats.LEAST_BATCHES


@pytest.mark.parametrize("precision, cv, steps", [
    (0.02, 0.01, 32), (0.03, 0.05, 32),  # quiet steps: the floor
    (0.02, 0.05, 35),  # 8 batches: 2.365 x 0.05 / sqrt(35) = 1.999 %
    (0.03, 0.10, 63), (0.02, 0.10, 125), (0.01, 0.10, 439),  # what the precision needs
])
def test_least_steps_with_a_known_cv_is_what_the_precision_needs_or_the_floor(precision, cv, steps):
    assert stats.least_steps(precision, cv) == steps
    assert stats.least_steps(precision, cv) == max(FLOOR, stats.steps_for_precision(cv, precision))


def test_least_steps_never_falls_as_the_precision_tightens_or_the_steps_grow_noisier():
    precisions = [0.2, 0.1, 0.05, 0.03, 0.02, 0.015, 0.01, 0.005]
    cvs = [0.0, 0.01, 0.03, 0.05, 0.1, 0.2, 0.4]
    for cv in cvs:
        by_precision = [stats.least_steps(p, cv) for p in precisions]
        assert by_precision == sorted(by_precision) and min(by_precision) >= FLOOR
    for p in precisions:
        by_cv = [stats.least_steps(p, cv) for cv in cvs]
        assert by_cv == sorted(by_cv) and by_cv[0] == FLOOR


def test_least_steps_refuses_a_precision_outside_0_1():
    for bad in (0, 1, -0.1):
        with pytest.raises(ValueError):
            stats.least_steps(bad)


def test_window_steps_given_steps_are_kept_else_the_precision_decides():
    assert window_steps(None, 0.03) == FLOOR
    assert window_steps(None, None) == DEFAULT_STEPS == 30  # precision off: exactly 30, as before
    assert window_steps(12, 0.03) == 12 and window_steps(300, 0.03) == 300  # given: the least window
    assert window_steps(None, 0.03, seconds=5.0) == DEFAULT_STEPS  # a --seconds window: steps unused


# ---------------------------------------------------------------- the sweep, a playbook, the worker

def _sweep_job(monkeypatch, *flags: str) -> JobSpec:
    """The job `netbench sweep --dry-run FLAGS` plans (NETBENCH_PRECISION unset: 3 %)."""
    from netbench.cli import app as cli
    from netbench.cli import experiment

    monkeypatch.delenv("NETBENCH_PRECISION", raising=False)
    seen = []
    monkeypatch.setattr(experiment, "_print_sweep_plan", seen.append)
    result = CliRunner().invoke(cli.main, ["sweep", "--dry-run", "--latency", "1ms", *flags])
    assert result.exit_code == 0, result.output
    return seen[0].job


def test_a_sweep_without_steps_measures_the_least_window_the_precision_needs(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert _sweep_job(monkeypatch).steps == FLOOR
    assert _sweep_job(monkeypatch, "--precision", "2%").steps == FLOOR
    assert _sweep_job(monkeypatch, "--precision", "off").steps == 30  # exactly --steps' default
    assert _sweep_job(monkeypatch, "--steps", "30").steps == 30  # given with a precision: honoured
    assert _sweep_job(monkeypatch, "--steps", "12", "--precision", "2%").steps == 12
    job = _sweep_job(monkeypatch, "--seconds", "5")
    assert job.seconds == 5.0 and job.precision == 0.03


def test_the_sweep_header_says_the_least_window(monkeypatch, tmp_path):
    from netbench.cli import app as cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NETBENCH_PRECISION", raising=False)
    out = CliRunner().invoke(cli.main, ["sweep", "--dry-run", "--latency", "1ms"])
    assert out.exit_code == 0 and "10 warm-up + 32 measured steps at least, until ±3 %" in out.output


def test_the_job_argv_carries_the_least_window_to_the_workers():
    import ipaddress

    from netbench.jobs import worker
    from netbench.model.job import plan_job
    from netbench.model.topology import plan_topology

    job = JobSpec(steps=window_steps(None, 0.02), precision=0.02)
    nodes = plan_topology(2, ipaddress.ip_network("10.213.7.0/24")).nodes
    argv = list(plan_job(job, nodes, 2, port=4000)[0].argv)
    assert argv[argv.index("--steps") + 1] == str(FLOOR)
    parsed = worker.parse_args(argv[argv.index("-m") + 2:])  # after python -m netbench.jobs.worker
    assert parsed.steps == FLOOR and parsed.precision == 0.02


def test_the_worker_alone_chooses_the_same_least_window():
    from netbench.jobs import worker

    assert worker.parse_args(["--precision", "0.02"]).steps == FLOOR
    assert worker.parse_args([]).steps == 30
    assert worker.parse_args(["--precision", "0.02", "--steps", "12"]).steps == 12


def test_a_playbook_without_steps_measures_the_least_window_and_keeps_its_digest():
    from dataclasses import replace

    from netbench.model import design
    from netbench.model.playbook import playbook_from_mapping

    def runs_steps(**data):
        book = playbook_from_mapping({"factors": {"latency": ["1ms"]}, **data}, "pb.yaml")
        return {r.job.steps for r in design.expand(book, seed=1)}, book

    steps, book = runs_steps()  # precision: 3 % unless it says otherwise
    assert steps == {FLOOR}
    # the digest holds the steps as written (30 without the key), so a folder written before resumes
    legacy = replace(book, steps_written=True)
    assert design.design_digest(book, design.expand(book, 1)) == design.design_digest(legacy, design.expand(legacy, 1))
    assert runs_steps(steps=30)[0] == {30}  # written: honoured
    assert runs_steps(precision="off")[0] == {30}


# ---------------------------------------------------------------- the launch's window honours it

from tests.unit.test_precision import _feed  # noqa: E402 - the chief's steps, back to back


def _window(steps: int, precision: float = 0.02) -> PointWindow:
    return PointWindow(changed_at=-1.0, settle=Settle(steps=0, seconds=0.0), steps=steps, precision=precision,
                       max_seconds=1e6)


def test_a_launch_window_measures_its_least_window_even_when_fewer_steps_look_precise():
    quiet = [0.05 * (1 + 0.01 * random.Random(1).random()) for _ in range(200)]
    assert stats.relative_half_width(stats.batch_means_interval(quiet[:8])) < 0.02  # 8 steps would look precise
    assert _feed(_window(window_steps(None, 0.02)), quiet) == FLOOR
    assert _feed(_window(12), quiet) == 12  # a --steps given with the precision is its least window


def test_a_launch_window_first_judges_its_precision_at_the_floor(monkeypatch):
    seen = []
    real = stats.steps_to_precision
    monkeypatch.setattr(stats, "steps_to_precision", lambda d, *a, **k: seen.append(len(d)) or real(d, *a, **k))
    rng = random.Random(7)
    noisy = [0.05 * (1 + 0.6 * rng.random()) for _ in range(20000)]
    taken = _feed(_window(window_steps(None, 0.02)), noisy)
    assert seen[0] == FLOOR and taken > FLOOR
    assert stats.relative_half_width(stats.batch_means_interval(noisy[:taken])) <= 0.02


# ---------------------------------------------------------------- the workers' loop honours it

def test_the_workers_extend_from_the_least_window():
    from netbench.jobs import worker
    from netbench.jobs.harness.loop import extend_for_precision

    args = worker.parse_args(["--precision", "0.02", "--max-seconds", "1000000"])
    rng = random.Random(3)
    series = iter([0.05 * (1 + 0.6 * rng.random()) for _ in range(20000)])
    durations = [next(series) for _ in range(args.steps)]  # the loop's measured window: --steps of them
    assert len(durations) == FLOOR
    added = extend_for_precision(args, durations, time.monotonic(), agree=float,
                                 steps=lambda n: [next(series) for _ in range(n)])
    assert added > 0 and len(durations) == FLOOR + added
    assert stats.relative_half_width(stats.batch_means_interval(durations)) <= 0.02
    quiet = [0.05] * FLOOR
    assert extend_for_precision(args, quiet, time.monotonic(), agree=float,
                                steps=lambda n: pytest.fail("no extension")) == 0


def test_the_least_window_simulation_runs(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "least_window.py"
    spec = importlib.util.spec_from_file_location("least_window", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--reps", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("== ") == len(module.SCENARIOS) and out.count("coverage ") == 3 * len(module.SCENARIOS)
    assert stats.batch_count is not module.sqrt_batches  # the comparison's rule was put back
