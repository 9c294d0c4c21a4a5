"""netbench.stats: a window's precision (batch-means intervals) and how long it must go on."""

from __future__ import annotations

import math
import random
import statistics
import time

import pytest

from netbench import stats as measure
from netbench.experiment.launch import PointWindow, Settle
from netbench.jobs import events as ev


@pytest.mark.parametrize("confidence, df, expected", [
    (0.95, 1, 12.7062), (0.95, 4, 2.7764), (0.95, 9, 2.2622), (0.99, 30, 2.7500), (0.95, 200, 1.9719),
])
def test_t_critical_matches_the_tables(confidence, df, expected):
    assert measure.t_critical(confidence, df) == pytest.approx(expected, abs=1e-4)


def test_t_critical_refuses_no_degrees_of_freedom():
    with pytest.raises(ValueError):
        measure.t_critical(0.95, 0)


@pytest.mark.parametrize("n, batches", [(0, 0), (7, 0), (8, 4), (16, 4), (20, 5), (30, 7), (32, 8), (63, 8),
                                        (64, 8), (81, 9), (100, 10), (1000, 31)])
def test_batch_count_cuts_4_step_batches_up_to_8_then_grows_as_the_square_root(n, batches):
    assert measure.batch_count(n) == batches


def test_batch_count_never_falls_as_a_window_grows():
    counts = [measure.batch_count(n) for n in range(8, 2000)]
    assert counts == sorted(counts)
    assert all(n // measure.batch_count(n) >= 2 for n in range(8, 2000))  # no batch of a single step


def test_batch_means_interval_of_a_short_series_has_no_bounds():
    interval = measure.batch_means_interval([1.0] * 7)
    assert interval.low is None and interval.mean == 1.0
    assert measure.relative_half_width(interval) is None


def test_batch_means_interval_by_hand():
    # 9 values -> 4 batches at edges 0, 2, 4, 6, 9: means 1.5, 3.5, 5.5, 8
    values = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    interval = measure.batch_means_interval(values)
    means = [1.5, 3.5, 5.5, 8.0]
    half = measure.t_critical(0.95, 3) * statistics.stdev(means) / 2
    assert interval.mean == pytest.approx(5.0)
    assert interval.high == pytest.approx(5.0 + half) and interval.low == pytest.approx(5.0 - half)


def test_batch_means_are_wider_than_the_naive_interval_for_correlated_steps():
    # an AR(1) series (each step 0.9 like the one before): s/sqrt(n) overstates precision
    rng, value, series = random.Random(3), 0.0, []
    for _ in range(2000):
        value = 0.9 * value + rng.gauss(0, 1)
        series.append(10 + value)
    naive = measure.t_interval(series, 0.95)
    batched = measure.batch_means_interval(series, 0.95)
    assert batched.half_width > 2 * naive.half_width


def test_batch_means_match_the_naive_interval_for_independent_steps():
    rng = random.Random(5)
    series = [10 + rng.gauss(0, 1) for _ in range(4000)]
    naive = measure.t_interval(series, 0.95).half_width
    assert measure.batch_means_interval(series, 0.95).half_width == pytest.approx(naive, rel=0.35)


def test_steps_to_precision_is_zero_once_reached():
    steady = [0.1 + 0.0001 * (i % 3) for i in range(30)]
    assert measure.steps_to_precision(steady, 0.02, elapsed_s=3.0, max_seconds=60) == 0


def test_steps_to_precision_asks_for_the_square_of_the_shortfall():
    rng = random.Random(1)
    noisy = [0.1 * (1 + 0.5 * rng.random()) for _ in range(30)]
    width = measure.relative_half_width(measure.batch_means_interval(noisy))
    assert width > 0.02
    more = measure.steps_to_precision(noisy, 0.02, elapsed_s=3.0, max_seconds=1000)
    assert more == math.ceil(30 * (width / 0.02) ** 2) - 30


def test_steps_to_precision_stops_at_the_time_limit_and_never_asks_past_it():
    rng = random.Random(1)
    noisy = [0.1 * (1 + rng.random()) for _ in range(30)]
    assert measure.steps_to_precision(noisy, 0.001, elapsed_s=60.0, max_seconds=60) == 0
    # 1 s left at a mean of about 0.15 s: at most 7 more steps
    assert 1 <= measure.steps_to_precision(noisy, 0.001, elapsed_s=59.0, max_seconds=60) <= 7


def test_steps_to_precision_fills_a_short_window_first():
    assert measure.steps_to_precision([0.1, 0.2], 0.02, elapsed_s=0.3, max_seconds=60) == 6
    assert measure.steps_to_precision([0.1], 0.02, elapsed_s=0.1, max_seconds=60, min_steps=30) == 29


def test_steps_to_precision_asks_for_at_least_a_tenth_more():
    rng = random.Random(2)
    series = [0.1 * (1 + 0.03 * rng.random()) for _ in range(200)]
    width = measure.relative_half_width(measure.batch_means_interval(series))
    more = measure.steps_to_precision(series, width * 0.999, elapsed_s=20, max_seconds=1000)
    assert more == 20


def test_steps_to_precision_refuses_a_precision_outside_0_1():
    with pytest.raises(ValueError):
        measure.steps_to_precision([0.1] * 10, 0, elapsed_s=1, max_seconds=10)


# ---------------------------------------------------------------- a launch's point window (pure)

def _feed(window, durations, at=0.0):
    """The chief's measured steps of `durations`, back to back from `at`, until the window is done;
    returns how many it took."""
    for k, duration in enumerate(durations):
        window.chief(ev.Step(step=k, phase="measured", start=at, end=at + duration, duration=duration,
                             recv=at + duration, worker=0, role="worker"))
        at += duration
        if window.done:
            return k + 1
    return None


def _noisy(n, spread, seed=4):
    rng = random.Random(seed)
    return [0.01 * (1 + spread * rng.random()) for _ in range(n)]


def test_a_window_with_a_precision_goes_on_until_it_is_reached():
    durations = _noisy(5000, 0.6)
    window = PointWindow(changed_at=-1.0, settle=Settle(steps=0, seconds=0.0), steps=10, precision=0.02)
    taken = _feed(window, durations)
    assert taken is not None and taken > 10
    width = measure.relative_half_width(measure.batch_means_interval(durations[:taken]))
    assert width <= 0.02
    # it stopped at the first check that saw it: the window before it had not reached it
    assert window.measured_durations == pytest.approx(durations[:taken])


def test_a_window_without_a_precision_stops_at_its_steps():
    window = PointWindow(changed_at=-1.0, settle=Settle(steps=0, seconds=0.0), steps=10)
    assert _feed(window, _noisy(100, 0.6)) == 10


def test_a_window_stops_at_max_seconds_whatever_its_precision():
    window = PointWindow(changed_at=-1.0, settle=Settle(steps=0, seconds=0.0), steps=10, precision=0.0001,
                         max_seconds=2.0)
    taken = _feed(window, _noisy(5000, 0.6))
    elapsed = window.window_end - window.window_start
    assert 2.0 <= elapsed < 2.0 + 0.05  # no more than a few steps past it
    assert taken == window.measured


def test_a_window_checks_its_precision_a_few_times_only(monkeypatch):
    calls = []
    real = measure.steps_to_precision
    monkeypatch.setattr(measure, "steps_to_precision", lambda *a, **k: calls.append(1) or real(*a, **k))
    window = PointWindow(changed_at=-1.0, settle=Settle(steps=0, seconds=0.0), steps=10, precision=0.005,
                         max_seconds=1e6)
    taken = _feed(window, _noisy(50000, 0.6))
    assert taken > 100 and len(calls) < 25


# ---------------------------------------------------------------- run-to-run against within-run

def _group(values, within):
    from netbench.report.groups import Group
    from netbench.report.load import Observation

    observations = tuple(Observation(run_id=f"r{i}", factors=(("model", "mlp"),), repeat=i, status="ok",
                                     images_per_sec=v, within_pct=within) for i, v in enumerate(values))
    return Group(factors=(("model", "mlp"),), observations=observations, interval=None)


def test_a_point_reports_its_run_to_run_spread_against_its_runs_own_interval():
    group = _group([100.0, 110.0, 90.0], within=1.96)
    assert group.run_to_run_pct == pytest.approx(10.0)
    assert group.within_run_pct == pytest.approx(1.96)
    assert group.excess == pytest.approx(10.0)  # 10 % between runs against a 1 % standard error within
    lone = _group([100.0], within=2.0)
    assert lone.run_to_run_pct is None and lone.excess is None


def test_a_record_without_an_interval_reads_as_none():
    from netbench.report.load import observation_from_record

    record = {"run_id": "r000", "status": "ok", "stats": {"images_per_sec": 5.0}, "profile": {}}
    assert observation_from_record(record).within_pct is None
    assert observation_from_record({**record, "step_time_ci_pct": 1.5}).within_pct == 1.5


# ---------------------------------------------------------------- the workers' extensions (isolated runs)

def test_workers_extend_their_window_until_the_precision_and_agree_on_every_extension():
    from argparse import Namespace

    from netbench.jobs.harness.loop import extend_for_precision

    series = iter(_noisy(100000, 0.6, seed=9))
    durations = [next(series) for _ in range(10)]
    asked, ran = [], []

    def agree(need: int) -> float:  # a peer that needs 3 more steps than this worker, while it needs any
        asked.append(need)
        return (need + (need + 3 if need else 0)) / 2

    def steps(count: int) -> list[float]:
        ran.append(count)
        return [next(series) for _ in range(count)]

    args = Namespace(precision=0.02, max_seconds=1e6)
    added = extend_for_precision(args, durations, started=time.monotonic(), agree=agree, steps=steps)
    assert added == sum(ran) and len(durations) == 10 + added
    assert asked[-1] == 0 and all(n > 0 for n in asked[:-1])  # it stopped once this worker needed none
    assert all(count == math.ceil(need + 1.5) for count, need in zip(ran, asked))  # the agreed count, not its own
    assert measure.relative_half_width(measure.batch_means_interval(durations)) <= 0.02


def test_without_a_precision_workers_run_exactly_their_window():
    from argparse import Namespace

    from netbench.jobs.harness.loop import extend_for_precision

    def never(*_):
        raise AssertionError("no collective without --precision")

    assert extend_for_precision(Namespace(precision=None), [0.1] * 5, 0.0, never, never) == 0


def test_the_sweep_summary_gives_each_repeated_points_run_to_run_spread():
    from types import SimpleNamespace

    from netbench.cli.render import run_to_run_line

    def result(name, ips, width, status="ok"):
        return SimpleNamespace(status=status, stats={"images_per_sec": ips}, profile={"name": name},
                               step_time_ci_pct=width)

    line = run_to_run_line([result("d1ms", 100.0, 1.0), result("d1ms", 110.0, 2.0), result("d1ms", 90.0, 3.0),
                            result("d10ms", 50.0, 1.0), result("d10ms", 0.0, None, status="failed")])
    assert line == "run to run: d1ms sd 10.0 % (within-run ±2.0 %)"  # d10ms has one ok run: no spread
    assert run_to_run_line([result("d1ms", 100.0, 1.0)]) == ""


def test_the_default_precision_and_its_environment_variable(monkeypatch):
    """3 % by default; NETBENCH_PRECISION (as the suite sets it, tests/conftest.py) changes the
    default and a flag still wins."""
    from click.testing import CliRunner

    from netbench.cli.app import main

    def header(*args: str, env: str | None) -> str:
        if env is None:
            monkeypatch.delenv("NETBENCH_PRECISION", raising=False)
        else:
            monkeypatch.setenv("NETBENCH_PRECISION", env)
        result = CliRunner().invoke(main, ["sweep", "--latency", "1ms", "--dry-run", *args])
        assert result.exit_code == 0, result.output
        return result.output.splitlines()[0]

    assert "until ±3 % (95 %, at most 60 s)" in header(env=None)
    assert "until ±" not in header(env="off") and "30 measured steps;" in header(env="off")
    assert "until ±2 %" in header("--precision", "2%", env="off")


def test_the_sweep_summary_and_the_report_say_plainly_which_runs_the_cap_stopped():
    from types import SimpleNamespace

    from netbench.cli.render import capped_line
    from netbench.report.load import observation_from_record
    from netbench.report.summary import precision_blocks

    def result(run_id, reached, width=2.3, status="ok"):
        return SimpleNamespace(run_id=run_id, status=status, precision_reached=reached, step_time_ci_pct=width)

    job = SimpleNamespace(precision=0.02, max_seconds=60.0)
    results = [result("r000", False), result("r001", True, 1.5), result("r002", False, status="failed")]
    assert capped_line(results, job) == ("[yellow]precision not reached[/]: 1 of 2 runs stopped at --max-seconds "
                                         "(60 s) short of ±2 %: r000 (±2.3 %)")
    assert capped_line([result("r001", True)], job) == "" and capped_line([result("r0", None)], job) == ""

    record = {"run_id": "r000", "status": "ok", "stats": {"images_per_sec": 5.0}, "profile": {},
              "step_time_ci_pct": 2.3, "precision_reached": False}
    capped, reached = observation_from_record(record), observation_from_record({**record, "run_id": "r001",
                                                                                "precision_reached": True})
    old = observation_from_record({k: v for k, v in record.items() if k != "precision_reached"})
    assert (capped.precision_reached, reached.precision_reached, old.precision_reached) == (False, True, None)
    (warning,) = precision_blocks([capped, reached, old])
    assert warning.text.startswith("**Precision not reached in 1 of 2 runs** (r000): --max-seconds stopped")
    assert precision_blocks([reached, old]) == []
    assert _group_of([capped, reached]).precision_text == "cap: 1 of 2 runs not reached"
    assert _group_of([reached]).precision_text == "reached" and _group_of([old]).precision_text == "-"


def _group_of(observations):
    from netbench.report.groups import Group

    return Group(factors=(("model", "mlp"),), observations=tuple(observations), interval=None)


def test_the_compute_calibration_runs_fixed_steps_whatever_precision_the_sweep_asks():
    """A --precision would stretch the calibration's short, noisy window of 1-ms steps to its
    cap (48,952 steps in 62 s before this): the calibration's processes take none."""
    from netbench.experiment.predict import COMPUTE_STEPS, _compute_tasks
    from netbench.model.job import JobSpec
    from netbench.model.topology import Node

    nodes = [Node(name=f"n{i}", netns=f"ns{i}", ifname="eth0", address=f"10.0.0.{i}", prefixlen=24, port=f"p{i}")
             for i in (1, 2)]
    tasks = _compute_tasks(JobSpec(precision=0.02, max_seconds=60.0), nodes, 2, port=20000)
    assert len(tasks) == 2
    for task in tasks:
        assert "--precision" not in task.argv and task.argv[task.argv.index("--steps") + 1] == str(COMPUTE_STEPS)
