"""Launches: a job's processes started once per job configuration and repetition, serving
many network points (netbench.experiment.launch, through runner.run_sweep on the synthetic
testbed of tests/fakes/sweep.py)."""

from __future__ import annotations

import csv
import json
import threading
from dataclasses import replace

import pytest

from netbench.experiment import launch
from netbench.experiment.launch import PointWindow, Settle, plan_launches
from netbench.experiment.runner import SweepConfig, describe_congestion, run_sweep, split_runs
from netbench.jobs import events as ev
from netbench.jobs.launch import Timeouts
from netbench.model import design
from netbench.model.job import JobSpec
from netbench.model.profile import Profile
from netbench.state.journal import Journal
from tests.fakes.sweep import SyntheticTestbed

JOB = JobSpec(warmup=2, steps=5)
FAST = Settle(steps=3, seconds=0.0)


def _runs(delays=(1, 2, 3), repeat=1, job=JOB, workers=2):
    levels = design.SweepLevels(delay_us=tuple(1000 * d for d in delays))
    return design.plan_sweep(Profile(name="base"), levels, repeat, job, workers)


def _config(tmp_path, runs, **kw):
    kw.setdefault("settle", FAST)
    kw.setdefault("order_seed", 7)
    kw.setdefault("order", "random")  # most tests here are about the shuffled order's bookkeeping
    return SweepConfig(sweep_id="s", runs=tuple(runs), job=runs[0].job, workers=runs[0].workers,
                       output=tmp_path / "out", **kw)


def _record(tmp_path, run_id):
    return json.loads((tmp_path / "out" / "runs" / f"{run_id}.json").read_text())


def _steps(record, phase=None, role="worker", worker=None):
    return [e for e in record["events"] if e["event"] == "step" and (phase is None or e["phase"] == phase)
            and e.get("role", "worker") == role and (worker is None or e["worker"] == worker)]


# ---------------------------------------------------------------- planning (pure)

def test_runs_are_grouped_by_job_configuration_and_repetition():
    small, big = JOB, replace(JOB, batch_size=128)
    runs = design.Design(points=tuple(design.Point(Profile(name=f"p{i}", delay_us=i * 1000), job, 2)
                                      for i, job in enumerate([small, big, small, big])), repeat=2).runs()
    plans = plan_launches(runs, seed=1)
    assert len(plans) == 4  # two job configurations x two repetitions
    for plan in plans:
        assert len({(r.job, r.workers, r.repeat) for r in plan.runs}) == 1
        assert len(plan.runs) == 2
    assert sorted(r.run_id for p in plans for r in p.runs) == sorted(r.run_id for r in runs)


def test_each_launch_has_its_own_order_from_the_recorded_seed():
    runs = _runs(delays=range(1, 9), repeat=3)
    plans = plan_launches(runs, seed=5, order="random")
    assert plan_launches(runs, seed=5, order="random") == plans  # the same seed, the same order
    orders = [[r.point for r in p.runs] for p in plans]
    assert all(sorted(o) == list(range(8)) for o in orders)
    assert len({tuple(o) for o in orders}) > 1  # each launch its own order
    assert orders != [[r.point for r in p.runs] for p in plan_launches(runs, seed=6, order="random")]
    assert [r.repeat for r in plans[2].runs] == [2] * 8  # the launch is the replicate


def _point(name, delay_ms=0, rate=None, loss=0.0):
    return Profile(name=name, delay_us=int(delay_ms * 1000), rate_bps=rate, loss=loss)


def test_a_point_follows_another_only_when_the_path_narrows():
    wide = _point("wide", 10, 10**9)
    assert launch.follows(wide, _point("slower", 10, 10**8)) and launch.follows(wide, _point("nearer", 1, 10**9))
    assert launch.follows(wide, _point("lossier", 10, 10**9, 0.01)) and launch.follows(wide, wide)
    assert not launch.follows(wide, _point("farther", 50, 10**9))
    assert not launch.follows(wide, _point("slower-but-farther", 50, 10**8))  # measured: 30 % low
    assert not launch.follows(wide, _point("uncapped", 10))
    assert not launch.follows(_point("lossy", 10, 10**9, 0.01), wide)


def test_descending_order_cuts_a_grid_into_chains_that_only_narrow():
    profiles = [_point(f"{d}ms-{r // 10**6}m", d, r) for d in (1, 10, 50) for r in (10**8, 10**9)]
    runs = design.Design(points=tuple(design.Point(p, JOB, 2) for p in profiles), repeat=2).runs()
    plans = plan_launches(runs, seed=3)
    assert len(plans) == 4  # two chains (the grid's width) per repetition
    for plan in plans:
        assert plan.order == "descending"
        assert all(launch.follows(a.profile, b.profile) for a, b in zip(plan.runs, plan.runs[1:]))
    assert sorted(r.run_id for p in plans for r in p.runs) == sorted(r.run_id for r in runs)
    # of the two covers of two chains, the one whose second launch starts (and warms up) on the
    # faster path: 10 ms at 1 Gbit/s, not 50 ms at 100 Mbit/s
    assert [r.profile.name for r in plans[0].runs] == ["50ms-1000m", "50ms-100m", "10ms-100m", "1ms-100m"]
    assert [r.profile.name for r in plans[1].runs] == ["10ms-1000m", "1ms-1000m"]
    with pytest.raises(ValueError):
        plan_launches(runs, seed=3, order="sideways")


def test_of_two_covers_the_fewer_chains_win_before_the_faster_heads():
    # a rate-only sweep is one chain whatever the sort; a delay-only one too
    rates = [_point(f"r{r}", 10, r * 10**6) for r in (100, 500, 1000)]
    delays = [_point(f"d{d}", d, 10**9) for d in (1, 10, 100)]
    for profiles in (rates, delays):
        runs = design.Design(points=tuple(design.Point(p, JOB, 2) for p in profiles), repeat=1).runs()
        assert len(plan_launches(runs, seed=1)) == 1
    # the heads' cost: a round trip and a megabyte at the rate
    assert launch.head_cost_s(design.Point(_point("x", 50, 10**8), JOB, 2)) == pytest.approx(0.1 + 0.08)


def test_descending_order_shuffles_equal_points_with_the_seed():
    runs = design.Design(points=tuple(design.Point(_point(f"p{i}", 10, 10**8), JOB, 2) for i in range(6)),
                         repeat=1).runs()
    orders = {tuple(r.point for r in plan_launches(runs, seed=s)[0].runs) for s in range(6)}
    assert len(orders) > 1 and len(plan_launches(runs, seed=0)) == 1
    assert plan_launches(runs, seed=2) == plan_launches(runs, seed=2)


def _feed(window: PointWindow, durations, at: float) -> list[str]:
    """The chief's steps of `durations`, back to back from `at`, until the window is done."""
    phases = []
    for k, duration in enumerate(durations):
        step = ev.Step(step=k, phase="measured", start=at, end=at + duration, duration=duration, recv=at + duration,
                       worker=0, role="worker")
        at += duration
        phases.append(window.chief(step))
        if window.done:
            break
    return phases


def test_the_window_waits_for_the_step_time_to_steady_after_a_change():
    # retransmissions after a fall in rate: the first steps after the change take seconds
    window = PointWindow(changed_at=0.0, settle=Settle(steps=3, seconds=0.5), steps=2)
    phases = _feed(window, [2.0, 0.8, 1.5, 0.05, 0.06, 0.05, 0.05, 0.06], at=0.1)
    # three slow steps (past the 3-step, 0.5 s minimum), then fast ones: measured once the median of
    # the last three is within 1.5x the fastest
    assert phases == ["settle"] * 4 + ["measured"] * 2
    assert window.dropped == 4 and window.done


def test_the_steadiness_rule_gives_up_after_max_seconds():
    window = PointWindow(changed_at=0.0, settle=Settle(steps=1, seconds=0.0, steady=1.5, max_seconds=3.0), steps=1)
    phases = _feed(window, [0.1, 1.0, 1.0] * 4, at=0.0)  # two slow steps in every three: never steady
    assert phases[-1] == "measured" and window.window_start >= 3.0


def test_schedules_verify_isolate_and_the_hosts_target_launch_each_point_alone(tmp_path):
    runs = list(_runs())
    runs[1] = replace(runs[1], schedule=object())
    own, shared = split_runs(_config(tmp_path, runs), "embedded")
    assert [r.run_id for r in own] == ["r001"] and [r.run_id for r in shared] == ["r000", "r002"]
    for config, kind in [(_config(tmp_path, runs, isolate=True), "embedded"),
                         (_config(tmp_path, runs, verify=True), "embedded"), (_config(tmp_path, runs), "hosts")]:
        own, shared = split_runs(config, kind)
        assert len(own) == 3 and shared == []


def _step(k, recv, phase=ev.PHASE_MEASURED, duration=0.1):
    return ev.Step(step=k, phase=phase, start=100.0 + k, end=100.0 + k + duration, duration=duration,
                   recv=recv, worker=0, role="worker")


def test_the_window_drops_the_overlapping_step_and_settles_by_steps_and_seconds():
    window = PointWindow(changed_at=10.0, settle=Settle(steps=2, seconds=1.0), steps=3)
    # started before the change (it overlaps it), then 2 settle steps, then not yet 1 s after
    phases = [window.chief(_step(k, recv)) for k, recv in
              [(20, 10.05), (21, 10.2), (22, 10.4), (23, 10.9), (24, 11.15), (25, 11.3), (26, 11.5)]]
    assert phases == ["settle", "settle", "settle", "settle", "measured", "measured", "measured"]
    assert window.done and window.dropped == 4 and window.last_index == 26
    assert window.settle_s() == pytest.approx(1.05)
    assert window.phase_for(22) == "settle" and window.phase_for(25) == "measured" and window.phase_for(27) is None
    assert window.phase_for(3) == "settle"  # a late step from before the point


def test_warm_up_steps_count_as_settled_in_a_launchs_first_point():
    window = PointWindow(changed_at=0.0, settle=Settle(steps=2, seconds=0.0), steps=2)
    phases = [window.chief(_step(k, 5.0 + k, phase)) for k, phase in
              [(0, "warmup"), (1, "warmup"), (2, "measured"), (3, "measured")]]
    assert phases == ["warmup", "warmup", "measured", "measured"] and window.dropped == 0


def _worker_step(k, start, duration, index=1, phase=ev.PHASE_MEASURED):
    return ev.Step(step=k, phase=phase, start=start, end=start + duration, duration=duration,
                   recv=start + duration, worker=index, role="worker")


def test_an_own_pace_workers_steps_belong_to_the_point_they_ran_under_not_to_the_chiefs_number():
    # the chief at 1 step/s (step k at t = k), another worker at 4 steps/s (step k at t = k / 4),
    # point P+1 applied at t = 100 s: by number, the worker's steps 102-104, run at t = 25.5-26 s
    # under P, were P+1's measured ones
    for by_time in (False, True):
        window = PointWindow(changed_at=100.0, settle=Settle(steps=2, seconds=0.0, round_trips=0), steps=3,
                             by_time=by_time, others=(("worker", 1),))
        window.heard(_worker_step(99, 99 / 4, 0.25))
        for k in range(100, 105):
            window.chief(_worker_step(k, float(k), 1.0, index=0))
        placed = {k: window.place(_worker_step(k, k / 4, 0.25)) for k in range(100, 105)}
        measured = [k for k, phase in placed.items() if phase == "measured"]
        if not by_time:
            assert measured == [102, 103, 104]  # the fault, kept for the steps of workers that step together
        else:
            assert measured == [] and set(placed.values()) == {"settle"}
    # by time, the worker's steps inside the chief's window are measured, and after it they wait
    window = PointWindow(changed_at=100.0, settle=Settle(steps=2, seconds=0.0, round_trips=0), steps=3,
                         by_time=True, others=(("worker", 1),))
    # the window waits for the other worker to be heard past its warm-up (a launch's first point:
    # a worker on a slowed node starts seconds late)
    phases = [window.chief(_worker_step(k, 100.0 + k, 1.0, index=0)) for k in range(3)]
    window.heard(_worker_step(3, 100.6, 0.25, phase="warmup"))
    phases.append(window.chief(_worker_step(3, 103.0, 1.0, index=0)))
    window.heard(_worker_step(4, 101.5, 0.25))
    phases += [window.chief(_worker_step(k, 100.0 + k, 1.0, index=0)) for k in range(4, 7)]
    assert phases == ["settle"] * 4 + ["measured"] * 3
    assert window.window_start == 104.0
    assert not window.done  # the other worker has no measured step yet
    assert window.place(_worker_step(50, 103.5, 0.25)) == "settle"
    assert window.place(_worker_step(51, 104.5, 0.25)) == "measured"
    assert window.place(_worker_step(52, 107.3, 0.25)) is None  # after the chief's last so far: not known yet
    assert window.place(_worker_step(53, 105.0, 0.25)) == "measured" and window.done
    assert window.place(_worker_step(54, 107.5, 0.25)) == "later" and window.past(_worker_step(54, 107.5, 0.25))


# ---------------------------------------------------------------- sweeps on the synthetic testbed

@pytest.mark.parametrize("other_pace", [0.0025, 0.04])  # a worker 4x faster than the chief, and one 4x slower
def test_an_own_pace_launch_measures_each_workers_steps_under_the_point_they_ran_in(tmp_path, other_pace):
    job = JobSpec(strategy="ps-async", warmup=2, steps=5)
    testbed = SyntheticTestbed(Journal(tmp_path / "state"), pace=0.01, paces={1: other_pace})
    runs = _runs(delays=(3, 2, 1), job=job)
    results = run_sweep(_config(tmp_path, runs, order="descending"), testbed=testbed)
    assert [r.status for r in results] == ["ok"] * 3 and {r.launch for r in results} == {0}
    bounds = list(zip(testbed.applied_at, testbed.applied_at[1:] + [float("inf")]))
    for result, (changed, next_change) in zip(results, bounds):
        record = _record(tmp_path, result.run_id)
        for worker in (0, 1):
            measured = _steps(record, "measured", worker=worker)
            assert len(measured) >= launch.OTHERS_LEAST
            starts = [e["recv"] - (e["end"] - e["start"]) for e in measured]
            assert all(changed <= t < next_change for t in starts), (result.run_id, worker, changed, starts)
        assert len(result.per_worker_images_per_sec) == 2  # every worker's own rate is in the point
        assert {e["phase"] for e in _steps(record)} <= {"warmup", "settle", "measured"}
    fast, slow = (1, 0) if other_pace < 0.01 else (0, 1)
    record = _record(tmp_path, results[-1].run_id)
    assert len(_steps(record, "measured", worker=fast)) > len(_steps(record, "measured", worker=slow))



def test_a_launch_starts_the_job_once_and_measures_every_point(tmp_path):
    testbed = SyntheticTestbed(Journal(tmp_path / "state"))
    results = run_sweep(_config(tmp_path, _runs()), testbed=testbed)
    assert [r.status for r in results] == ["ok"] * 3
    assert len(testbed.spawned) == 2 and all("--until-stopped" in t.argv for t in testbed.spawned)
    assert {r.launch for r in results} == {0} and all(r.stats["steps"] == 5 for r in results)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["order_seed"] == 7 and manifest["settle"] == {"steps": 3, "seconds": 0.0, "steady": 1.5, "max_seconds": 30.0,
                                                                  "round_trips": 8.0}
    order = manifest["launches"][0]["runs"]
    assert order == [r.run_id for r in plan_launches(_runs(), 7, "random")[0].runs] == [r.run_id for r in results]
    assert [p.name for p in testbed.applied] == [r.profile.name for r in plan_launches(_runs(), 7, "random")[0].runs]
    pids = set()
    for result in results:
        record = _record(tmp_path, result.run_id)
        pids |= {e["pid"] for e in record["events"] if e["event"] == "start"}
        for worker in (0, 1):  # every worker's steps of the window are in the point's record
            assert len(_steps(record, "measured", worker=worker)) == 5
        assert len(_steps(record, "settle", worker=0)) == result.settle_steps
    assert len(pids) == 2
    later = [r for r in results if r.run_id != order[0]]
    assert all(r.settle_steps >= 3 for r in later)  # at least --settle-steps after each change
    with open(tmp_path / "out" / "results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [row["launch"] for row in rows] == ["0"] * 3 and all(row["settle_steps"] for row in rows)


def test_the_settle_window_holds_for_its_seconds(tmp_path):
    testbed = SyntheticTestbed(Journal(tmp_path / "state"), pace=0.005)
    results = run_sweep(_config(tmp_path, _runs(delays=(1, 2)), settle=Settle(steps=1, seconds=0.08, round_trips=0)),
                        testbed=testbed)
    assert [r.status for r in results] == ["ok", "ok"]
    for result in results:
        assert result.settle_s >= 0.08
        record = _record(tmp_path, result.run_id)
        assert len(_steps(record, "settle", worker=0)) == result.settle_steps
        measured = _steps(record, "measured", worker=0)
        assert min(e["step"] for e in measured) > max(e["step"] for e in _steps(record, "settle", worker=0))
    assert min(r.settle_steps for r in results[1:]) >= 8  # 0.08 s of 0.005 s steps, not just 1 step


def test_repeat_gives_a_launch_per_repetition_each_with_its_own_order(tmp_path):
    testbed = SyntheticTestbed(Journal(tmp_path / "state"))
    results = run_sweep(_config(tmp_path, _runs(delays=range(1, 6), repeat=2)), testbed=testbed)
    assert len(results) == 10 and all(r.status == "ok" for r in results)
    assert len(testbed.spawned) == 4
    by_launch = {}
    for r in results:
        by_launch.setdefault(r.launch, []).append(r)
    assert sorted(by_launch) == [0, 1]
    assert all({r.repeat for r in rs} == {n} for n, rs in by_launch.items())  # repeat = launch index
    assert [r.profile["name"] for r in by_launch[0]] != [r.profile["name"] for r in by_launch[1]]


def test_a_point_whose_processes_die_fails_and_a_new_launch_serves_the_rest(tmp_path):
    # the chief dies after 12 steps in every launch: a launch's first point (2 warm-up + 1
    # settle + 5) fits, its second does not
    testbed = SyntheticTestbed(Journal(tmp_path / "state"), chief_stops_after=12)
    results = run_sweep(_config(tmp_path, _runs()), testbed=testbed)
    assert [r.status for r in results] == ["ok", "failed", "ok"]
    assert [r.launch for r in results] == [0, 0, 1]
    assert "exited with 1" in results[1].error
    assert len(testbed.spawned) == 4  # two launches of two workers
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [len(entry["runs"]) for entry in manifest["launches"]] == [3, 1]
    failed = _record(tmp_path, results[1].run_id)
    assert _steps(failed, "measured", worker=0) == [] or len(_steps(failed, "measured", worker=0)) < 5


def test_a_point_whose_steps_stop_coming_times_out_and_the_rest_relaunch(tmp_path):
    release = threading.Event()
    launches_seen = []

    def hold(task, k):  # the first launch's chief stalls at step 12
        if task.index == 0 and k == 0:
            launches_seen.append(task)
        if task.index == 0 and k == 12 and len(launches_seen) == 1:
            release.wait(10)

    testbed = SyntheticTestbed(Journal(tmp_path / "state"), hold=hold)
    config = _config(tmp_path, _runs(), timeouts=Timeouts(startup_s=10, step_s=0.3))
    try:
        results = run_sweep(config, testbed=testbed)
    finally:
        release.set()
    assert [r.status for r in results] == ["ok", "timeout", "ok"]
    assert results[1].error == "no next step within 0.3s"
    assert [r.launch for r in results] == [0, 0, 1]


def test_an_interrupted_launch_resumes_with_only_the_points_left(tmp_path):
    runs = _runs(delays=range(1, 5))

    class StopAfterTwo:
        def __init__(self):
            self.done = 0

        def __getattr__(self, name):
            return lambda *a: None

        def run_finished(self, run, result):
            self.done += 1
            if self.done == 2:
                raise KeyboardInterrupt

    testbed = SyntheticTestbed(Journal(tmp_path / "state"))
    with pytest.raises(KeyboardInterrupt):
        run_sweep(_config(tmp_path, runs), StopAfterTwo(), testbed=testbed)
    assert testbed.finished  # the testbed was cleaned up
    from netbench.experiment.store import ResultStore

    statuses = ResultStore(tmp_path / "out").statuses()
    assert len(statuses) == 2
    left = design.pending(runs, statuses)
    assert len(left) == 2 and not {r.run_id for r in left} & set(statuses)
    testbed = SyntheticTestbed(Journal(tmp_path / "state2"))
    config = replace(_config(tmp_path, runs), runs=tuple(left))
    results = run_sweep(config, testbed=testbed)
    assert sorted(r.run_id for r in results) == sorted(r.run_id for r in left)
    assert len(ResultStore(tmp_path / "out").statuses()) == 4


def test_isolate_starts_the_job_anew_for_every_point(tmp_path):
    testbed = SyntheticTestbed(Journal(tmp_path / "state"))
    results = run_sweep(_config(tmp_path, _runs(), isolate=True), testbed=testbed)
    assert [r.status for r in results] == ["ok"] * 3 and [r.run_id for r in results] == ["r000", "r001", "r002"]
    assert len(testbed.spawned) == 6 and not any("--until-stopped" in t.argv for t in testbed.spawned)
    assert all(r.launch is None and r.settle_steps is None for r in results)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["isolate"] is True and manifest["launches"] == []


def test_observers_hear_each_point_start_and_no_settle_step_as_measured(tmp_path):
    heard = []

    class Observer:
        def __getattr__(self, name):
            return lambda *a: heard.append((name, a))

    testbed = SyntheticTestbed(Journal(tmp_path / "state"))
    run_sweep(_config(tmp_path, _runs()), Observer(), testbed=testbed)
    assert [n for n, _ in heard].count("run_started") == 3
    assert [n for n, _ in heard].count("profile_applied") == 3
    notes = [a[0] for n, a in heard if n == "note"]
    assert any(note.startswith("launch 0: 3 point(s)") for note in notes)
    settle = [a[1] for n, a in heard if n == "step" and isinstance(a[1], ev.Step) and a[1].phase == "settle"]
    assert settle


def test_the_worker_accepts_until_stopped():
    from netbench.jobs import worker

    assert worker.parse_args(["--until-stopped"]).until_stopped is True
    assert worker.parse_args([]).until_stopped is False


def test_dry_run_lines_list_each_launch_in_its_order():
    runs = _runs(repeat=2)
    lines = launch.describe_launches(runs, 7, order="random")
    plans = plan_launches(runs, 7, "random")
    assert lines[1:] == [f"  launch {n} (job configuration {p.group}): " + " ".join(r.run_id for r in p.runs)
                         for n, p in enumerate(plans)]
    assert launch.describe_launches(runs, 7, isolate=True)[0].startswith("--isolate")


def test_live_metrics_count_no_settle_step():
    from netbench.metrics.state import MetricsState

    state = MetricsState(clock=lambda: 1.0)
    state.sweep_started("s", "userspace", "mlp", "allreduce", runs=2, workers=2, batch_size=32)
    state.run_started("r001", 0)
    state.profile_applied("d10ms", 10_000, 0, None, 0.0)
    for phase in ("settle", "settle", "measured"):
        state.worker_event({"event": "step", "worker": 0, "phase": phase, "duration": 0.04})
    snap = state.snapshot()
    assert {k: v for k, v in snap.steps.items() if v} == {("measured", "0"): 1} and snap.warmups_completed == 1


# ---------------------------------------------------------------- the nodes' TCP congestion control

class _CongestionTestbed(SyntheticTestbed):
    def congestion_control(self):
        return {"n1": "cubic", "n2": "cubic"}


def test_the_manifest_records_the_nodes_congestion_control_and_the_sweep_says_it(tmp_path):
    heard = []

    class Notes:
        def __getattr__(self, name):
            return (lambda text: heard.append(text)) if name == "note" else (lambda *a, **k: None)

    run_sweep(_config(tmp_path, _runs(delays=(1,))), observer=Notes(),
              testbed=_CongestionTestbed(Journal(tmp_path / "state")))
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["tcp_congestion_control"] == {"n1": "cubic", "n2": "cubic"}
    assert "TCP congestion control on every node: cubic" in heard


def test_a_congestion_control_the_sweep_set_is_recorded_and_said(tmp_path):
    heard = []

    class Notes:
        def __getattr__(self, name):
            return (lambda text: heard.append(text)) if name == "note" else (lambda *a, **k: None)

    run_sweep(_config(tmp_path, _runs(delays=(1,)), congestion_control="cubic"), observer=Notes(),
              testbed=_CongestionTestbed(Journal(tmp_path / "state")))
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["congestion_control"] == "cubic" and manifest["tcp_congestion_control"]["n1"] == "cubic"
    assert "TCP congestion control on every node: cubic (asked for this sweep: cubic)" in heard


def test_mixed_congestion_controls_are_named_per_node():
    assert describe_congestion({"n1": "cubic", "n2": "bbr"}) == "TCP congestion control: n1 cubic, n2 bbr"
    assert describe_congestion({"n1": ""}) == "TCP congestion control on every node: unknown"


def test_a_testbed_without_the_reading_records_none(tmp_path):
    run_sweep(_config(tmp_path, _runs(delays=(1,))), testbed=SyntheticTestbed(Journal(tmp_path / "state")))
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert "tcp_congestion_control" not in manifest and "congestion_control" not in manifest


def test_the_order_flag_offers_exactly_the_orders_launches_know():
    import click

    from netbench.cli import app
    from netbench.experiment.launch import ORDERS

    for name in ("sweep", "run"):
        command = app.main.get_command(click.Context(app.main), name)
        option = next(p for p in command.params if p.name == "launch_order")
        assert tuple(option.type.choices) == ORDERS


def test_a_resumed_sweep_numbers_its_launches_after_the_folders_and_logs_apart(tmp_path):
    """A second session in the same folder (a playbook's resume, --append) neither reuses
    logs/launch000/ nor a repeated run's log folder: its launches are numbered after the
    folder's, and a run id that already has logs gets logs/<run>.2/."""
    from netbench.experiment.store import ResultStore

    runs = _runs(delays=range(1, 4))

    class StopAfterOne:
        def __getattr__(self, name):
            return lambda *a: None

        def run_finished(self, run, result):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(_config(tmp_path, runs), StopAfterOne(), testbed=SyntheticTestbed(Journal(tmp_path / "state")))
    logs = tmp_path / "out" / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["launch000"]
    (logs / "launch000" / "n1-worker0.log").write_text("the first session's last line\n")
    left = design.pending(runs, ResultStore(tmp_path / "out").statuses())
    results = run_sweep(replace(_config(tmp_path, runs), runs=tuple(left)),
                        testbed=SyntheticTestbed(Journal(tmp_path / "state2")))
    assert {r.launch for r in results} == {1}
    assert sorted(p.name for p in logs.iterdir()) == ["launch000", "launch001"]
    assert (logs / "launch000" / "n1-worker0.log").read_text() == "the first session's last line\n"
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [launch["launch"] for launch in manifest["launches"]] == [1]
    store = ResultStore(tmp_path / "out")
    assert store.next_launch() == 2
    first = store.log_dir("r000")
    first.mkdir()
    assert first.name == "r000" and store.log_dir("r000").name == "r000.2"


def test_isolate_gives_an_own_pace_strategy_a_launch_of_its_own_per_point(tmp_path):
    # the controller, not each worker's own step count, measures own-pace workers over one window
    job = JobSpec(strategy="ps-async", warmup=2, steps=5)
    runs = _runs(delays=(1, 2), job=job)
    own, shared = split_runs(_config(tmp_path, runs, isolate=True), "embedded")
    assert own == [] and len(shared) == 2
    testbed = SyntheticTestbed(Journal(tmp_path / "state"), paces={1: 0.04})
    results = run_sweep(_config(tmp_path, runs, isolate=True), testbed=testbed)
    assert [r.status for r in results] == ["ok", "ok"] and [r.launch for r in results] == [0, 1]
    assert len(testbed.spawned) == 6  # two workers and a server, started anew for each point
    for result in results:
        assert len(result.per_worker_images_per_sec) == 2
