"""bench/live_changes.py's analysis (bench/transients.py, bench/live_report.py): a change's time to
90 % of the new steady rate, its lowest 100 ms and the bytes it moved, from a byte counter; the
engine's figures against netem's run-to-run spread."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up; live_report imports transients by name
    spec.loader.exec_module(module)
    return module


tr = _load("transients")

MBIT = 1e6 / 8 * 0.1  # bytes in a 100 ms bin at 1 Mbit/s


def counter(rates_mbit: list[float], t0: float = 100.0, start_s: float = -2.0, step_s: float = 0.02):
    """(time, cumulative bytes) samples every `step_s` of a flow at the given 100 ms rates."""
    samples, total, t = [(t0 + start_s, 0)], 0.0, t0 + start_s
    for rate in rates_mbit:
        for _ in range(int(round(0.1 / step_s))):
            t += step_s
            total += rate * 1e6 / 8 * step_s
            samples.append((round(t, 6), int(round(total))))
    return samples


def test_bins_give_back_the_rates_a_counter_was_sampled_at():
    rates = [100.0] * 20 + [10.0] * 30 + [100.0] * 10
    samples = counter(rates)
    got = tr.bins(samples, 100.0, -2.0, 4.0)
    assert [round(b / MBIT, 3) for b in got] == rates
    assert tr.covers(samples, 100.0, -2.0, 4.0, gap_s=0.05)
    holed = [s for s in samples if not 101.0 < s[0] < 101.3]
    assert not tr.covers(holed, 100.0, -2.0, 4.0, gap_s=0.25)


def test_a_flow_throttled_for_seven_seconds_takes_seven_to_recover():
    # last round's case: ~10 Mbit/s for 6-7 s, one bin at 0, then back at full rate
    after = [10.0] * 50 + [0.0] + [10.0] * 19 + [955.0] * 30
    t = tr.transient([955.0 * MBIT] * 20, [r * MBIT for r in after], [955.0 * MBIT] * 20)
    assert t.t90_s == pytest.approx(7.0)
    assert t.lowest == 0.0
    assert t.bytes_after == pytest.approx(sum(after) * MBIT)
    assert t.steady_before == pytest.approx(955e6) and t.steady_after == pytest.approx(955e6)


def test_one_random_dip_of_a_bin_does_not_end_the_transient_there():
    after = [90.0] * 3 + [100.0] * 40 + [60.0] + [100.0] * 56  # a 100 ms dip at 4.3 s
    t = tr.transient([100.0 * MBIT] * 20, [r * MBIT for r in after], [100.0 * MBIT] * 20)
    assert t.t90_s == 0.0  # every half-second window holds 90 %: the dip is no transient
    assert t.lowest == pytest.approx(60e6)


def test_a_rise_in_rate_is_timed_to_the_new_level_and_a_fall_to_it_is_immediate():
    ramp = [100.0 + 90.0 * k for k in range(10)] + [1000.0] * 90
    up = tr.transient([100.0 * MBIT] * 20, [r * MBIT for r in ramp], [1000.0 * MBIT] * 20)
    assert 0.4 <= up.t90_s <= 1.0
    down = tr.transient([1000.0 * MBIT] * 20, [100.0 * MBIT] * 100, [100.0 * MBIT] * 20)
    assert down.t90_s == 0.0 and down.lowest == pytest.approx(100e6)


def test_a_window_limited_flows_bursts_a_round_trip_apart_are_no_transient():
    # 200 ms round trips: a window per round trip, so 100 ms bins alternate burst and pause
    after = [105.0, 210.0] * 50
    steady = [147.0 * MBIT] * 20
    short = tr.transient([955.0 * MBIT] * 20, [r * MBIT for r in after], steady, window_s=tr.WINDOW_S)
    judged = tr.transient([955.0 * MBIT] * 20, [r * MBIT for r in after], steady, window_s=tr.window_for(0.2))
    assert tr.window_for(0.2) == pytest.approx(1.0) and tr.window_for(0.002) == tr.WINDOW_S
    assert judged.t90_s == 0.0 and short.t90_s == 0.0  # 0.5 s: 2 or 3 bursts, 126-168 Mbit/s
    uneven = [105.0, 210.0] * 20 + [105.0, 125.0, 137.0, 162.0, 105.0] + [210.0, 105.0] * 27 + [210.0]
    assert tr.transient([0.0] * 20, [r * MBIT for r in uneven], steady, window_s=0.5).t90_s > 4.0
    assert tr.transient([0.0] * 20, [r * MBIT for r in uneven], steady, window_s=1.0).t90_s == 0.0


def test_a_flow_that_never_recovers_is_timed_to_the_end_of_the_window():
    t = tr.transient([100.0 * MBIT] * 20, [50.0 * MBIT] * 100, [100.0 * MBIT] * 20)
    assert t.t90_s == pytest.approx(10.0)
    assert math.isnan(tr.transient([], [], []).steady_after)


def test_an_engine_outside_netems_range_is_marked_and_one_inside_is_not():
    netem = tr.Spread.of([0.3, 0.5, 0.4, 0.6, 0.35])
    assert (netem.median, netem.low, netem.high, netem.n) == (0.4, 0.3, 0.6, 5)
    assert not tr.beyond(netem, tr.Spread.of([0.5, 0.7, 0.6]), "t90_s")
    assert not tr.beyond(netem, tr.Spread.of([0.7]), "t90_s")  # within the 100 ms resolution
    assert tr.beyond(netem, tr.Spread.of([6.5, 7.0, 6.0]), "t90_s")
    rates = tr.Spread.of([95e6, 96e6, 97e6])
    assert not tr.beyond(rates, tr.Spread.of([98e6]), "lowest")  # 2 % resolution
    assert tr.beyond(rates, tr.Spread.of([10e6]), "lowest")
    assert not tr.beyond(tr.Spread.of([]), tr.Spread.of([1.0]), "t90_s")


def test_the_comparison_table_marks_the_changes_where_the_engine_differs():
    report = _load("live_report")

    def run(backend: str, after_mbit: list[float]) -> dict:
        change = {"direction": "there", "mbit": [100.0] * 20 + after_mbit + [100.0] * 20,
                  "tcp": [{"t": -1.0, "rtt_ms": 2.0, "retransmits": 0}, {"t": 11.0, "rtt_ms": 20.0, "retransmits": 0}]}
        return {"meta": {"backend": backend, "kernel": "6.1", "cpus": 2, "repeats": 3, "commit": "x",
                         "after_s": 10.0, "before_s": 2.0, "bin_s": 0.1},
                "cases": {"delay-1-10": {"case": {"a": {"delay": "1ms"}, "b": {"delay": "10ms"}, "cc": "cubic"},
                                         "repetitions": [[change]] * 3}}}

    healthy = [100.0] * 100
    throttled = [10.0] * 70 + [100.0] * 30
    table = report.compare_table(run("netem", healthy), run("userspace", throttled))
    row = next(line for line in table.splitlines() if line.startswith("| delay 1ms -> 10ms"))
    assert "**7.0**" in row and "**10**" in row  # time to 90 % and the lowest 100 ms, marked
    same = report.compare_table(run("netem", healthy), run("userspace", healthy))
    assert "**" not in same.split("\n", 1)[1]
    assert "2.0 -> 20.0" in report.table(run("netem", healthy))


def test_a_dip_as_low_as_the_engines_own_before_the_change_is_marked_as_its_own():
    # the VM's case: the engine's steady flow dips to 12 Mbit/s now and then with no change at
    # all; after the change it dips as low. netem's never falls under 18.
    report = _load("live_report")

    def run(backend: str, before: list[float], after: list[float], engines: dict | None = None) -> dict:
        change = {"direction": "there", "mbit": before + after + [20.0] * 20, "tcp": []}
        if engines:
            change["engines"] = engines
        return {"meta": {"backend": backend, "kernel": "6.1", "cpus": 2, "repeats": 3, "commit": "x",
                         "after_s": 10.0, "before_s": 2.0, "bin_s": 0.1},
                "cases": {"delay-1-10": {"case": {"a": {"delay": "1ms"}, "b": {"delay": "10ms"}, "cc": "cubic"},
                                         "repetitions": [[change]] * 3}}}

    steady = [20.0] * 20
    netem = run("netem", [19.0] + steady[1:], [18.0] + [20.0] * 99)
    late = {"n1": {"received": 900, "lateness_mean_us": 1500.0, "late_1ms": 0.2, "late_10ms": 0.02},
            "n2": {"received": 100, "lateness_mean_us": 90.0, "late_1ms": 0.0, "late_10ms": 0.0}}
    dips = run("userspace", [12.0] + steady[1:], [12.5] + [20.0] * 99, late)
    row = next(line for line in report.compare_table(netem, dips).splitlines() if line.startswith("| delay"))
    assert "++12++" in row and "**12**" in row  # the dip after, and the engine's own before it
    assert "| 1.50 | 20.0% | 2.0% |" in row  # the sender's engine (n1), not the receiver's
    worse = run("userspace", [19.0] + steady[1:], [5.0] + [20.0] * 99, late)
    row = next(line for line in report.compare_table(netem, worse).splitlines() if line.startswith("| delay"))
    assert "**5**" in row and "++" not in row  # lower than anything before it: the change's doing
    # a flow that dips under 90 % for half a second before the change: its t90 after is its own
    dipping = [20.0] * 5 + [10.0] * 5 + [20.0] * 10
    slow = run("userspace", dipping, [20.0] * 60 + [10.0] * 5 + [20.0] * 35, late)
    row = next(line for line in report.compare_table(netem, slow).splitlines() if line.startswith("| delay"))
    assert "++6.4++" in row
    steady_then_slow = run("userspace", steady, [20.0] * 60 + [10.0] * 5 + [20.0] * 35, late)
    row = next(line for line in report.compare_table(netem, steady_then_slow).splitlines() if line.startswith("| delay"))
    assert "**6.4**" in row
    assert report.table(netem)  # the single table still renders with the new figure
    # an engine steadier than netem is marked as a difference, never as its own dips
    better = run("userspace", steady, [20.0] * 100, late)
    row = next(line for line in report.compare_table(netem, better).splitlines() if line.startswith("| delay"))
    assert "**20**" in row and "++" not in row
