"""netbench.stats: step statistics and throughput."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netbench import stats as measure


@pytest.mark.parametrize("values, q, expected", [
    ([1, 2, 3, 4], 90, 3.7), ([1, 2, 3, 4], 50, 2.5), ([4, 1, 3, 2], 0, 1), ([4, 1, 3, 2], 100, 4),
    ([5], 90, 5), ([10, 20], 25, 12.5),
])
def test_percentile_matches_numpy_linear(values, q, expected):
    assert measure.percentile(values, q) == pytest.approx(expected)


def test_percentile_of_nothing():
    with pytest.raises(ValueError):
        measure.percentile([], 50)


def test_mad_jitter():
    # median 3, absolute deviations 2,1,0,1,97 -> median 1
    assert measure.mad_jitter([1, 2, 3, 4, 100]) == pytest.approx(1.4826)
    assert measure.mad_jitter([0.5] * 5) == 0


def test_step_stats_known_values():
    s = measure.step_stats([0.1, 0.2, 0.3, 0.4], images_per_step=128)
    assert s.steps == 4
    assert s.mean_s == pytest.approx(0.25)
    assert s.median_s == pytest.approx(0.25)
    assert s.p90_s == pytest.approx(0.37)
    sd = statistics.stdev([0.1, 0.2, 0.3, 0.4])
    assert s.stderr_s == pytest.approx(sd / 2)
    assert s.images_per_sec == pytest.approx(512.0)
    assert s.images_per_sec_stderr == pytest.approx(128 * (sd / 2) / 0.25**2)
    assert s.jitter_s == pytest.approx(1.4826 * 0.1)


def test_single_step_has_zero_stderr():
    s = measure.step_stats([0.5], 10)
    assert (s.stderr_s, s.images_per_sec_stderr, s.images_per_sec) == (0.0, 0.0, 20.0)


@pytest.mark.parametrize("durations", [[], [0.1, 0.0], [0.1, -0.2]])
def test_step_stats_rejects(durations):
    with pytest.raises(ValueError):
        measure.step_stats(durations, 64)


@given(st.lists(st.floats(1e-4, 10.0), min_size=1, max_size=50), st.integers(1, 4096))
def test_throughput_is_total_images_over_total_time(durations, batch):
    s = measure.step_stats(durations, batch)
    assert s.images_per_sec == pytest.approx(batch * len(durations) / math.fsum(durations), rel=1e-9)
    assert min(durations) <= s.median_s <= s.p90_s <= max(durations) * (1 + 1e-12)


def test_measured_durations_excludes_warmup_and_sorts_by_step():
    events = [
        {"event": "step", "phase": "warmup", "step": 0, "duration": 9.0},
        {"event": "step", "phase": "measured", "step": 3, "duration": "0.3"},
        {"event": "ready"},
        {"event": "step", "phase": "measured", "step": 1, "duration": 0.1},
        {"event": "step", "phase": "measured", "step": 2, "duration": 0.2},
        {"event": "log", "phase": "measured", "step": 4, "duration": 5},
    ]
    assert measure.measured_durations(events) == [0.1, 0.2, 0.3]


def test_measured_durations_of_nothing():
    assert measure.measured_durations([]) == []


def test_tolerance_is_relative_with_a_floor():
    assert measure.tolerance(2.0, 0.5, 0.05) == 0.5  # 5 % of 2 ms is below the 0.5 ms floor
    assert measure.tolerance(200.0, 0.5, 0.05) == pytest.approx(10.0)


def test_scaled_interval_scales_mean_and_bounds_and_keeps_missing_bounds():
    i = measure.Interval(n=3, mean=0.5, low=0.4, high=0.6, confidence=0.99).scaled(100)
    assert (i.n, i.mean, i.low, i.high, i.confidence) == (3, 50, 40, 60, 0.99)
    assert i.half_width == pytest.approx(10)
    one = measure.Interval(n=1, mean=0.5, low=None, high=None, confidence=0.9).scaled(100)
    assert (one.mean, one.low, one.high, one.half_width) == (50, None, None, None)


def test_ratio_of_geometric_means_without_spread_has_a_point_interval():
    i = measure.ratio_interval([2.0, 2.0], [1.0, 1.0])
    assert (i.mean, i.low, i.high) == (pytest.approx(2.0), pytest.approx(2.0), pytest.approx(2.0))
    assert measure.geometric_mean([1.0, 4.0]) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        measure.ratio_interval([1.0], [0.0])
    with pytest.raises(ValueError):
        measure.t_interval([1.0, 2.0], confidence=1.0)


def test_wilson_interval_without_trials_is_everything():
    assert measure.wilson_interval(0, 0) == (0.0, 1.0)


def test_stats_and_report_import_no_optional_or_rendering_dependency():
    # scipy and matplotlib stay optional extras, and the library leaves rich to the CLI
    import subprocess
    import sys

    code = ("import sys, netbench.stats, netbench.report; "
            "print(sorted(m for m in ('scipy', 'matplotlib', 'rich', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
