"""A point's settle by the link: a time floor of a few round trips of its path (at most
--settle), then until the step series is stationary; each record says how long and why."""

from __future__ import annotations

import csv
import json

import pytest

from netbench.experiment import settling
from netbench.experiment.estimate import Costs, estimate_design, step_s
from netbench.experiment.launch import PointWindow
from netbench.experiment.settling import Settle
from netbench.jobs import events as ev
from netbench.model.job import JobSpec
from netbench.model.pairs import PairLink, PairTopology
from netbench.model.profile import Profile
from netbench.model.run import Run
from netbench.state.journal import Journal


def run(delay_ms: float, jitter_ms: float = 0.0, pairs=None) -> Run:
    profile = Profile(name="p", delay_us=int(delay_ms * 1000), jitter_us=int(jitter_ms * 1000))
    return Run(index=0, profile=profile, repeat=0, job=JobSpec(), workers=2, pairs=pairs)


def test_the_floor_is_a_few_round_trips_of_the_path_at_most_the_settle_seconds():
    settle = Settle()
    assert (settle.seconds, settle.round_trips) == (1.5, 8.0)
    assert settling.round_trip_s(run(1)) == pytest.approx(0.002)
    assert settling.round_trip_s(run(10, 2)) == pytest.approx(0.024)
    assert settle.floor_s(0.002) == pytest.approx(0.016)  # a 1 ms point: milliseconds
    assert settle.floor_s(0.1) == pytest.approx(0.8)  # 50 ms one-way: most of a second
    assert settle.floor_s(0.4) == 1.5  # never past --settle
    assert settle.floor_s(None) == 1.5 and Settle(round_trips=0).floor_s(0.002) == 1.5
    pairs = PairTopology(name="t", nodes=("n1", "n2", "n3"), links=(
        PairLink("n1", "n2", Profile(name="a", delay_us=5000)), PairLink("n2", "n1", Profile(name="b", delay_us=20000)),
        PairLink("n1", "n3", Profile(name="c", delay_us=30000))))
    assert settling.round_trip_s(run(0, pairs=pairs)) == pytest.approx(0.030)  # the slowest pair, there and back


def test_the_settle_ends_when_the_series_is_stationary_and_says_why():
    settle = Settle(steps=3, seconds=1.5)
    decide = settling.decide
    assert decide(settle, 3, 1.0, [0.1] * 3, False, 0.016) is None  # not past --settle-steps
    assert decide(settle, 4, 0.010, [0.1] * 4, False, 0.016) is None  # not past the floor
    assert decide(settle, 4, 0.4, [0.1] * 4, False, 0.016) == "steady"
    transient = [0.9, 0.8, 0.1, 0.7, 0.6]  # retransmissions: the last steps still far above the floor
    assert decide(settle, 5, 0.4, transient, False, 0.016) is None
    assert decide(settle, 8, 0.6, transient + [0.11, 0.1, 0.12], False, 0.016) == "steady"
    assert decide(settle, 5, 31.0, transient, False, 0.016) == "gave up"
    assert decide(settle, 4, 0.4, transient, True, 0.016) == "warm-up"
    assert decide(Settle(max_seconds=0), 4, 0.4, transient, False, 0.016) == "floor"
    assert settling.reason("steady", 0.016, 0.002, settle) == "steady; floor 0.016 s (8 round trips of 2 ms)"
    assert settling.reason("steady", 1.5, 0.4, settle) == "steady; floor 1.500 s"
    assert settling.reason(None, 1.5, None, settle) is None


def step(number: int, start: float, duration: float) -> ev.Step:
    return ev.Step(step=number, phase=ev.PHASE_MEASURED, duration=duration, worker=0, role="worker",
                   start=start, end=start + duration, recv=start + duration)


def test_a_1ms_point_settles_in_milliseconds_where_a_fixed_floor_waited_1_5_s():
    def settled_at(rtt_s):
        window = PointWindow(changed_at=0.0, settle=Settle(steps=3, seconds=1.5), steps=5, rtt_s=rtt_s)
        t = 0.0
        for k in range(100):
            window.chief(step(k, t, 0.02))
            t += 0.02
            if window.window_start is not None:
                return window.window_start, window.why
        return None, None

    start, why = settled_at(0.002)
    assert start == pytest.approx(0.06) and why == "steady"  # 3 steps dropped after the change, then steady
    assert settled_at(None)[0] == pytest.approx(1.5)  # the round trip unknown: --settle


def test_the_estimate_settles_each_point_by_its_link():
    costs = Costs(s_per_sample={"mlp": 0.001}, step_overhead_s={}, startup_s={"mlp": 4.0}, cluster_round_trips=0,
                  sync_overhead_s=0.0, point_overhead_s=0.5, stop_s=1.0, cores=64, model_bytes={"mlp": 1_000_000})
    runs = [Run(index=i, profile=Profile(name=f"p{i}", delay_us=500), repeat=0,
                job=JobSpec(model="mlp", batch_size=100, warmup=2, steps=10), workers=2) for i in range(3)]
    step = step_s(runs[0], costs)
    by_link = estimate_design(runs, False, Settle(steps=3, seconds=1.5), costs)
    fixed = estimate_design(runs, False, Settle(steps=3, seconds=1.5, round_trips=0), costs)
    assert by_link.settle_s == pytest.approx(2 * (max(0.008, 3 * step) + step / 2))
    assert fixed.settle_s == pytest.approx(2 * (max(1.5, 3 * step) + step / 2)) and fixed.settle_s > by_link.settle_s


def test_each_record_says_how_long_its_point_settled_and_why(tmp_path):
    from tests.fakes.sweep import SyntheticTestbed

    from netbench.experiment.runner import SweepConfig, run_sweep

    job = JobSpec(warmup=2, steps=5)
    runs = tuple(Run(index=i, profile=Profile(name=f"d{i}", delay_us=1000 * (3 - i)), repeat=0, job=job, workers=2)
                 for i in range(3))
    config = SweepConfig(sweep_id="s", runs=runs, job=job, workers=2, output=tmp_path / "out", order_seed=1,
                         settle=Settle(steps=2, seconds=1.5))
    results = run_sweep(config, testbed=SyntheticTestbed(Journal(tmp_path / "state"), pace=0.005))
    assert [r.status for r in results] == ["ok"] * 3
    first, *later = sorted(results, key=lambda r: r.started)
    assert first.settle_reason.startswith("warm-up")
    for result in later:  # 1 or 2 ms one-way: 8 round trips are 16-32 ms, far below 1.5 s
        assert result.settle_reason.startswith("steady; floor 0.0") and "round trips of" in result.settle_reason
        assert result.settle_s < 1.0
    with open(tmp_path / "out" / "results.csv", newline="") as fh:
        assert all(row["settle_reason"] for row in csv.DictReader(fh))
    record = json.loads((tmp_path / "out" / "runs" / f"{later[0].run_id}.json").read_text())
    assert record["settle_reason"] == later[0].settle_reason


def prof(delay_ms: float, rate_mbit: float | None = None, loss: float = 0.0, jitter_ms: float = 0.0) -> Run:
    profile = Profile(name="p", delay_us=int(delay_ms * 1000), jitter_us=int(jitter_ms * 1000), loss=loss,
                      rate_bps=None if rate_mbit is None else int(rate_mbit * 1e6))
    return Run(index=0, profile=profile, repeat=0, job=JobSpec(), workers=2)


def test_a_change_widens_the_path_where_a_launch_in_descending_order_never_goes():
    from netbench.experiment.launch_plan import run_follows

    pairs = [(prof(1), prof(10)), (prof(10), prof(1)), (prof(1, 100), prof(1, 1000)), (prof(1, 1000), prof(1, 100)),
             (prof(1, loss=0.01), prof(1)), (prof(1), prof(1, loss=0.01)), (prof(10), prof(10, jitter_ms=2)),
             (prof(10, jitter_ms=2), prof(10)), (prof(1, 100), prof(1))]  # unlimited: the widest rate
    for before, after in pairs:
        assert settling.widens(before, after) == (not run_follows(before, after)), (before.profile, after.profile)
    assert not settling.widens(None, prof(10))  # a launch's first point: its warm-up settled it


def test_under_bbr_a_longer_round_trip_waits_out_its_min_rtt_window():
    # measured (bench/live_changes.py, netem and the engine alike): 1 -> 10 ms at 1 Gbit/s under
    # bbr ran at 2-11 Mbit/s, evenly, for 5.8-7.5 s: bbr's window is sized by the shortest round
    # trip of the last 10 s
    assert settling.change_floor_s(prof(1), prof(10), "bbr") == pytest.approx(10.0 + 0.2 + 2 * 0.020)
    assert settling.change_floor_s(prof(1), prof(10), "bbr;cubic") > 10  # a node on bbr is enough
    assert settling.change_floor_s(prof(1), prof(10), "cubic") == 0.0
    assert settling.change_floor_s(prof(10), prof(1), "bbr") == 0.0  # a shorter one: nothing to wait out
    assert settling.change_floor_s(prof(1, 100), prof(1, 1000), "bbr") == 0.0
    assert settling.change_floor_s(None, prof(10), "bbr") == 0.0 and settling.change_floor_s(prof(1), prof(10), None) == 0.0


def settle_of(durations: list[float], floor_s: float = 0.0, widened: bool = False, settle: Settle = Settle()):
    """(when the first measured step starts, why) over back-to-back steps of `durations`."""
    t, seen = 0.0, []
    for k, d in enumerate(durations, start=1):
        seen.append(d)
        why = settling.decide(settle, k, t, seen, False, floor_s, widened)
        if why is not None:
            return round(t, 3), why
        t += d
    return None, None


def test_bbrs_even_slow_steps_pass_the_steadiness_test_so_its_floor_holds_them():
    # a 2.7 MB step at 11 Mbit/s takes ~2 s, evenly, until bbr's min_rtt expires; then 22 ms
    plateau = [1.95] * 5 + [0.022] * 200
    assert settle_of(plateau, floor_s=0.16) == (pytest.approx(5.85), "steady")  # inside the transient
    floor = settling.change_floor_s(prof(1), prof(10), "bbr")
    start, why = settle_of(plateau, floor_s=floor, widened=True)
    assert start >= floor and why == "steady"


def test_after_a_widening_change_steps_still_falling_have_not_settled():
    ramp = [0.1 * 0.92 ** k for k in range(20)] + [0.1 * 0.92 ** 20] * 20  # each step 8 % shorter, then flat
    early, _ = settle_of(ramp, floor_s=0.016)
    late, why = settle_of(ramp, floor_s=0.016, widened=True)
    assert early < 0.5 and late > 1.0 and why == "steady"
    assert settling.falling([1.0, 1.0, 1.0, 0.8, 0.8, 0.8], 3) and not settling.falling([1.0] * 6, 3)
    assert settling.falling([1.0] * 5, 3)  # fewer than twice the steps: not known yet
    noisy = [0.1, 0.11, 0.095, 0.1, 0.105, 0.097, 0.1, 0.102]  # a flat series: not falling
    assert settle_of(noisy, floor_s=0.016, widened=True)[1] == "steady"
    assert settling.reason("steady", 10.24, 0.02, Settle(), 10.24, True).startswith(
        "steady; floor 10.240 s (bbr: a longer round trip waits out its 10 s min_rtt window); widened")


def test_a_launch_window_after_a_widening_change_holds_its_floor_and_waits_for_the_ramp():
    window = PointWindow(changed_at=0.0, settle=Settle(), steps=5, rtt_s=0.02, widened=True, change_floor_s=10.24)
    assert window.floor_s == 10.24
    t = 0.0
    for k in range(200):
        window.chief(step(k, t, 0.5 if t < 6.0 else 0.05))
        t += 0.5 if t < 6.0 else 0.05
        if window.window_start is not None:
            break
    assert window.window_start >= 10.24 and window.why == "steady"
    assert PointWindow(changed_at=0.0, settle=Settle(), steps=5, rtt_s=0.02).floor_s == pytest.approx(0.16)


def test_a_random_order_launch_marks_the_points_its_changes_widened(tmp_path):
    from tests.fakes.sweep import SyntheticTestbed

    from netbench.experiment.runner import SweepConfig, run_sweep

    job = JobSpec(warmup=2, steps=5)
    runs = tuple(Run(index=i, profile=Profile(name=f"d{i}", delay_us=1000 * (i + 1)), repeat=0, job=job, workers=2)
                 for i in range(3))
    config = SweepConfig(sweep_id="s", runs=runs, job=job, workers=2, output=tmp_path / "out", order_seed=3,
                         order="random", settle=Settle(steps=2, seconds=1.5))
    results = sorted(run_sweep(config, testbed=SyntheticTestbed(Journal(tmp_path / "state"), pace=0.005)),
                     key=lambda r: r.started)
    assert [r.status for r in results] == ["ok"] * 3
    delays = [r.profile["delay_us"] for r in results]
    assert any(b < a for b, a in zip(delays, delays[1:])) and any(b > a for b, a in zip(delays, delays[1:])), delays
    for before, after in zip(results, results[1:]):
        rose = after.profile["delay_us"] > before.profile["delay_us"]
        assert ("widened" in after.settle_reason) == rose, (before.profile, after.profile, after.settle_reason)
