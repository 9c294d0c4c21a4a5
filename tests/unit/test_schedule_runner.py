"""The schedule runner on a fake clock: order, lateness, stop, repeat, training steps."""

from __future__ import annotations

import threading

import pytest

from netbench.errors import UsageError
from netbench.experiment.schedule import Landed, PlanCache, lateness, link_before, run_schedule
from netbench.model.profile import Profile
from netbench.model.schedule import TimedProfile


class FakeClock:
    """Time moves only when the runner sleeps, or when an apply takes its time (recording)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds

    def recording(self, cost, since: float = 0.0):
        """(applied, apply): apply records (this clock's time less `since`, the profile's
        delay) and takes cost(profile) seconds."""
        applied: list[tuple[float, int]] = []

        def apply(profile):
            applied.append((round(self.now - since, 6), profile.delay_us))
            self.now += cost(profile)

        return applied, apply


def entries(*delays_at: tuple[float, int]) -> tuple[TimedProfile, ...]:
    return tuple(TimedProfile(at_s=at, at_step=None, profile=Profile(name=f"p@{at}", delay_us=d), step=i + 1)
                 for i, (at, d) in enumerate(delays_at))


def test_changes_land_in_order_at_their_times_with_lateness_measured():
    clock = FakeClock()
    applied, apply = clock.recording(lambda profile: 0.004)  # an apply takes 4 ms

    seen: list[Landed] = []
    landed = run_schedule(entries((0.0, 5000), (2.0, 30000), (4.0, 5000)), apply, clock=clock, sleep=clock.sleep,
                          on_change=seen.append)
    # the profile of time 0 is in place before the clock starts (at 100.004); the next change
    # starts at its time; once one change's duration is known, the next ones start that much
    # early, so they land at their time
    assert applied == [(100.0, 5000), pytest.approx((102.004, 30000)), pytest.approx((104.0, 5000))]
    assert seen == landed and [item.step for item in landed] == [1, 2, 3]
    assert [item.scheduled_s for item in landed] == [0.0, 2.0, 4.0]
    assert landed[0].started_s == pytest.approx(-0.004) and landed[0].landed_s == 0.0
    assert [item.lateness_s for item in landed] == pytest.approx([0.0, 0.004, 0.0], abs=1e-9)
    assert all(item.merged == () for item in landed)
    assert max(clock.sleeps) <= 0.1  # coarse sleeps in chunks, then a short final one
    summary = lateness(landed)
    assert summary.changes == 3 and summary.max_s == pytest.approx(0.004) and summary.worst_s == pytest.approx(0.004)


def test_the_profile_of_time_zero_is_in_place_before_the_clock_starts_however_long_it_takes():
    """Starting 64 delay engines takes seconds: that must not make the changes after it late."""
    clock = FakeClock()
    _, apply = clock.recording(lambda profile: 4.4 if profile.delay_us == 5000 else 0.002)

    landed = run_schedule(entries((0.0, 1000), (0.0, 5000), (0.1, 6000), (0.2, 7000)), apply, clock=clock,
                          sleep=clock.sleep)
    # two steps at 0 s: the last of them is the state at 0 (the first merged into it)
    assert [(item.index, item.merged, item.profile.delay_us) for item in landed] == [(1, (0,), 5000), (2, (), 6000),
                                                                                     (3, (), 7000)]
    assert landed[0].started_s == pytest.approx(-4.4) and landed[0].lateness_s == 0.0
    assert [round(item.lateness_s, 6) for item in landed[1:]] == [0.002, 0.0]


def test_a_timed_change_starts_early_by_the_median_of_recent_durations():
    clock = FakeClock()
    durations = iter([0.010, 0.002, 0.010, 0.010, 0.010])
    _, apply = clock.recording(lambda profile: next(durations))

    landed = run_schedule(entries((0.0, 1000), (1.0, 2000), (2.0, 3000), (3.0, 4000), (4.0, 5000)), apply,
                          clock=clock, sleep=clock.sleep)
    # the first before the clock starts (its 10 ms not a lead); leads: none, 2 ms, median(2, 10)
    # = 6 ms, median(2, 10, 10) = 10 ms
    assert [round(item.started_s, 6) for item in landed] == [-0.01, 1.0, 1.998, 2.994, 3.99]
    assert [round(item.lateness_s, 6) for item in landed] == [0.0, 0.002, 0.008, 0.004, 0.0]


def test_changes_due_while_one_is_made_are_merged_and_the_timeline_never_stretches():
    clock = FakeClock()
    # one change overruns the next ones' times
    recorded, apply = clock.recording(lambda profile: 0.5 if profile.delay_us == 2000 else 0.001)

    timeline = entries((0.0, 1000), (1.0, 2000), (1.2, 3000), (1.4, 4000), (1.6, 5000), (3.0, 6000))
    landed = run_schedule(timeline, apply, clock=clock, sleep=clock.sleep)
    # 3000 and 4000 were due before 2000 landed (1.5 s), 5000 by the time a change then lands
    # (1.5 s + the 0.5 s a change took): the link goes straight to 5000
    assert [delay for _, delay in recorded] == [1000, 2000, 5000, 6000]
    assert [(item.index, item.merged) for item in landed] == [(0, ()), (1, ()), (4, (2, 3)), (5, ())]
    assert landed[2].scheduled_s == 1.6 and landed[2].started_s == pytest.approx(1.5)
    assert landed[-1].landed_s <= 3.0 + 0.001  # the last change is at its time: nothing stretched


def test_stop_ends_the_run_before_the_next_change():
    clock = FakeClock()
    stop = threading.Event()

    def apply(profile):
        if profile.delay_us == 2000:
            stop.set()

    landed = run_schedule(entries((0.0, 1000), (1.0, 2000), (2.0, 3000)), apply, clock=clock, sleep=clock.sleep,
                          stop=stop)
    assert [item.profile.delay_us for item in landed] == [1000, 2000]


def test_repeat_loops_every_period_and_skips_a_change_that_leaves_the_link_as_it_is():
    clock = FakeClock()
    stop = threading.Event()
    landed_at: list[tuple[float, int]] = []

    def on_change(item):
        landed_at.append((round(item.scheduled_s, 6), item.profile.delay_us))
        if len(landed_at) == 5:
            stop.set()

    # the last step sets the first step's value at the period's end: the next loop's first step is no change
    run_schedule(entries((0.0, 5000), (2.0, 30000), (4.0, 5000)), lambda p: None, clock=clock, sleep=clock.sleep,
                 repeat=True, period_s=4.0, on_change=on_change, stop=stop)
    assert landed_at == [(0.0, 5000), (2.0, 30000), (4.0, 5000), (6.0, 30000), (8.0, 5000)]


def test_repeat_needs_a_period():
    with pytest.raises(UsageError, match="period"):
        run_schedule(entries((0.0, 1000)), lambda p: None, repeat=True, period_s=0)


def test_training_step_triggers_wait_for_the_chief():
    clock = FakeClock()
    steps = iter(range(0, 10_000, 100))
    current = {"step": 0}

    def current_step():
        current["step"] = next(steps)
        return current["step"]

    timeline = (TimedProfile(at_s=None, at_step=500, profile=Profile(name="a", delay_us=50_000), step=1),
                TimedProfile(at_s=None, at_step=800, profile=Profile(name="b", delay_us=5_000), step=2))
    applied_at: list[int] = []
    landed = run_schedule(timeline, lambda p: applied_at.append(current["step"]), clock=clock, sleep=clock.sleep,
                          current_step=current_step)
    assert applied_at == [500, 800]
    assert [item.at_step for item in landed] == [500, 800]
    with pytest.raises(UsageError, match="at_step"):
        run_schedule(timeline, lambda p: None)


class FakeTarget:
    def __init__(self) -> None:
        self.planned: list[Profile] = []
        self.applied: list[Profile] = []

    def plan(self, profile, backend):
        self.planned.append(profile)
        return ("plan", profile)

    def apply_plan(self, planned):
        self.applied.append(planned[1])


def test_the_plan_cache_plans_each_distinct_profile_once():
    target = FakeTarget()
    cache = PlanCache(target, "userspace")
    a, b = Profile(name="a", delay_us=1000), Profile(name="b", delay_us=2000)
    for profile in (a, b, a, b):
        cache.apply(profile)
    assert target.planned == [a, b] and target.applied == [a, b, a, b]


def test_link_before():
    assert link_before({"nodes": [{"node": "n1", "profile": None}]}) == Profile(name="none")
    held = {"name": "wan", "delay": "10ms", "jitter": "0ms", "loss": "0%", "rate": "100mbit"}
    before = link_before({"nodes": [{"node": "n1", "profile": held}, {"node": "n2", "profile": held}]})
    assert (before.delay_us, before.rate_bps) == (10_000, 100_000_000)
    with pytest.raises(UsageError, match="different profiles"):
        link_before({"nodes": [{"node": "n1", "profile": held}, {"node": "n2", "profile": None}]})
    with pytest.raises(UsageError, match="no testbed"):
        link_before({"nodes": []})


def test_a_runs_record_lists_what_each_change_merged():
    from netbench.experiment.schedule import RunDriver
    from netbench.model.schedule import schedule_from_mapping

    schedule = schedule_from_mapping({"name": "w", "steps": [{"at": "0s", "delay": "1ms"}, {"at": "1s", "delay": "2ms"},
                                                             {"at": "1.1s", "delay": "3ms"}]}, "w.yaml")
    timeline = entries((0.0, 1000), (1.0, 2000), (1.1, 3000))
    driver = RunDriver(schedule, timeline, Profile(name="p", delay_us=1000), lambda p: None)
    driver.landed = [Landed(index=2, cycle=0, step=3, at_step=None, scheduled_s=1.1, started_s=1.05, landed_s=1.101,
                            profile=timeline[2].profile, merged=(1,))]
    (change,) = driver.record()["changes"]
    assert change["merged"] == [{"index": 1, "step": 2, "when": "1s"}] and change["lateness_ms"] == pytest.approx(1.0)


def test_a_schedules_base_is_in_place_before_time_zero_when_no_step_is_at_zero():
    clock = FakeClock()
    # the base starts the engines
    applied, apply = clock.recording(lambda profile: 3.0 if profile.delay_us == 5000 else 0.001, since=100.0)

    base = Profile(name="base", delay_us=5000)
    landed = run_schedule(entries((0.1, 6000), (0.2, 7000)), apply, clock=clock, sleep=clock.sleep, base=base)
    assert applied == [(0.0, 5000), (3.1, 6000), (3.199, 7000)]  # the clock started at 3.0, once the base was in
    assert [(item.index, item.step, item.profile.delay_us) for item in landed] == [(-1, 0, 5000), (0, 1, 6000),
                                                                                   (1, 2, 7000)]
    assert landed[0].started_s == pytest.approx(-3.0) and [round(i.lateness_s, 6) for i in landed] == [0.0, 0.001, 0.0]
    # a link that already holds the base is not changed before time 0
    applied.clear()
    run_schedule(entries((0.1, 6000),), apply, clock=clock, sleep=clock.sleep, base=base, already=base)
    assert [delay for _, delay in applied] == [6000]


def test_a_rehearsal_times_a_change_before_the_clock_starts_so_the_first_one_lands_on_time():
    clock = FakeClock()
    applied, apply = clock.recording(lambda profile: 0.02)  # every change takes 20 ms

    timeline = entries((1.0, 30000), (2.0, 5000))
    base = Profile(name="base", delay_us=10000)
    late = run_schedule(timeline, apply, clock=clock, sleep=clock.sleep, base=base)
    assert [round(item.lateness_s, 6) for item in late[1:]] == [0.02, 0.0]  # the first: no lead yet
    clock.now, applied[:] = 100.0, []
    landed = run_schedule(timeline, apply, clock=clock, sleep=clock.sleep, base=base, rehearse=True)
    # the base, the base again (timed: in place, nothing changes), then each change 20 ms early
    assert [delay for _, delay in applied] == [10000, 10000, 30000, 5000]
    assert [item.index for item in landed] == [-1, 0, 1]  # the rehearsal is not a change
    assert [round(item.lateness_s, 6) for item in landed[1:]] == [0.0, 0.0]
    assert applied[2][0] == pytest.approx(applied[1][0] + 0.02 + 1.0 - 0.02)  # the clock starts after it
