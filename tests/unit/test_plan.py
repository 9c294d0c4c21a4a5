"""netbench.model.design: sweep levels -> ordered runs, each with its job and workers resolved."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netbench.errors import ProfileError
from netbench.model.design import SweepLevels, plan_sweep, profile_name, sweep_points, sweep_runs
from netbench.model.job import JobSpec
from netbench.model.profile import Profile
from netbench.model.run import Run

BASE = Profile(name="base")


def test_no_levels_is_one_run_of_the_base():
    base = Profile(name="wan", delay_us=10_000, rate_bps=250_000_000)
    runs = plan_sweep(base, SweepLevels())
    assert runs == (Run(index=0, profile=base, repeat=0, job=JobSpec(), workers=2),)
    assert runs[0].profile.name == "wan"


def test_latency_sweep_names_points():
    runs = plan_sweep(BASE, SweepLevels(delay_us=(1_000, 10_000, 100_000)))
    assert [r.profile.delay_us for r in runs] == [1_000, 10_000, 100_000]
    assert [r.profile.name for r in runs] == ["d1ms", "d10ms", "d100ms"]
    assert [r.run_id for r in runs] == ["r000", "r001", "r002"]


def test_order_delay_outermost_then_rate_loss_jitter():
    levels = SweepLevels(delay_us=(1_000, 2_000), rate_bps=(10**8, 10**9), loss=(0.0, 0.01), jitter_us=(0, 500))
    runs = plan_sweep(BASE, levels)
    got = [(r.profile.delay_us, r.profile.rate_bps, r.profile.loss, r.profile.jitter_us) for r in runs]
    assert got == list(itertools.product(levels.delay_us, levels.rate_bps, levels.loss, levels.jitter_us))


def test_repeats_are_adjacent_and_indices_consecutive():
    runs = plan_sweep(BASE, SweepLevels(delay_us=(1_000, 2_000)), repeat=3)
    assert [r.index for r in runs] == list(range(6))
    assert [(r.profile.delay_us, r.repeat) for r in runs] == [
        (1_000, 0), (1_000, 1), (1_000, 2), (2_000, 0), (2_000, 1), (2_000, 2)]


def test_unswept_factors_keep_base_values():
    base = Profile(name="wan", delay_us=10_000, jitter_us=1_000, loss=0.01, rate_bps=250_000_000,
                   description="d")
    runs = plan_sweep(base, SweepLevels(rate_bps=(100_000_000, 500_000_000)))
    for run in runs:
        assert (run.profile.delay_us, run.profile.jitter_us, run.profile.loss, run.profile.description) == \
            (10_000, 1_000, 0.01, "d")
    assert [r.profile.name for r in runs] == ["d10ms-j1ms-r100mbit-l1%", "d10ms-j1ms-r500mbit-l1%"]


@pytest.mark.parametrize("profile, name", [
    (Profile(delay_us=10_000, rate_bps=250_000_000, loss=0.01), "d10ms-r250mbit-l1%"),
    (Profile(delay_us=0), "d0ms"),
    (Profile(delay_us=1_500, jitter_us=500), "d1.5ms-j500us"),
    (Profile(delay_us=100_000, rate_bps=10**9, loss=0.1), "d100ms-r1gbit-l10%"),
])
def test_profile_name(profile, name):
    assert profile_name(profile) == name


def test_repeat_must_be_positive():
    with pytest.raises(ValueError):
        plan_sweep(BASE, SweepLevels(), repeat=0)


def test_invalid_point_is_rejected():
    base = Profile(name="b", jitter_us=5_000, delay_us=10_000)
    with pytest.raises(ProfileError, match=r"^sweep: jitter: "):
        plan_sweep(base, SweepLevels(delay_us=(10_000, 1_000)))


def test_zero_rate_level_is_rejected():
    with pytest.raises(ProfileError, match=r"^sweep: rate: rate must be positive"):
        plan_sweep(BASE, SweepLevels(rate_bps=(0,)))


@given(st.lists(st.integers(0, 100_000), min_size=1, max_size=4, unique=True),
       st.lists(st.integers(8_000, 10**10), min_size=1, max_size=3, unique=True),
       st.integers(1, 3))
def test_grid_size_and_coverage(delays, rates, repeat):
    runs = plan_sweep(BASE, SweepLevels(delay_us=tuple(delays), rate_bps=tuple(rates)), repeat=repeat)
    assert len(runs) == len(delays) * len(rates) * repeat
    assert {(r.profile.delay_us, r.profile.rate_bps) for r in runs} == set(itertools.product(delays, rates))
    assert len({r.run_id for r in runs}) == len(runs)


def test_every_run_carries_the_sweeps_job_and_workers_numbered_from_first():
    job = JobSpec(strategy="ps", ps=2, batch_size=16)
    runs = plan_sweep(BASE, SweepLevels(delay_us=(1_000, 2_000)), repeat=2, job=job, workers=3, first=7)
    assert [r.run_id for r in runs] == ["r007", "r008", "r009", "r010"]
    assert all(r.job is job and r.workers == 3 and r.settings is None for r in runs)
    assert [r.point for r in runs] == [0, 0, 1, 1]


def test_points_then_runs_is_plan_sweep():
    levels = SweepLevels(delay_us=(1_000, 2_000), loss=(0.0, 0.01))
    points = sweep_points(BASE, levels)
    assert sweep_runs(points, 2, JobSpec(), 2) == plan_sweep(BASE, levels, repeat=2)
    with pytest.raises(ValueError):
        sweep_runs(points, 0, JobSpec(), 2)


def test_one_design_type_orders_runs_for_sweeps_and_playbooks_alike():
    import random

    from netbench.model.design import Design, Point

    points = tuple(Point(Profile(name=f"p{i}", delay_us=1000 * i), JobSpec(batch_size=8 * (i + 1)), i + 1)
                   for i in range(3))
    written = Design(points, repeat=2).runs(first=5)
    assert [(r.run_id, r.point, r.repeat) for r in written] == [
        ("r005", 0, 0), ("r006", 0, 1), ("r007", 1, 0), ("r008", 1, 1), ("r009", 2, 0), ("r010", 2, 1)]
    shuffled = Design(points, repeat=2, order="random", seed=11).runs()
    pairs = [(p, rep) for p in range(3) for rep in range(2)]
    random.Random(11).shuffle(pairs)
    assert [(r.point, r.repeat) for r in shuffled] == pairs and [r.index for r in shuffled] == list(range(6))
    assert all(r.job is points[r.point].job and r.workers == points[r.point].workers for r in shuffled)
    with pytest.raises(ValueError):
        Design(points, order="sorted").runs()
