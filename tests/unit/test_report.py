"""netbench.report: grouping, t intervals, scaling efficiency, figures from a fixture folder."""

from __future__ import annotations

import json
import math
import statistics
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from click.testing import CliRunner

from netbench import report
from netbench.cli import app as cli
from netbench.cli import render_report as render
from netbench.report import Observation, axis_scale, baseline_slice, group_observations, scaling_efficiency
from netbench.stats import log_t_interval, ratio_interval, t_interval
from tests.unit.report_designs import record, write_results


def obs(run_id, ips, status="ok", **kw) -> Observation:
    return report.observation_from_record(record(run_id, ips=ips, status=status, **kw))


# ---------------------------------------------------------------- statistics

def test_t_interval_matches_a_hand_computed_case():
    # values 10, 12, 14: mean 12, s = 2, n = 3, t(0.995, 2) = 9.924843 (tables)
    interval = t_interval([10.0, 12.0, 14.0], 0.99)
    half = 9.924843 * 2 / math.sqrt(3)  # 11.46022
    assert interval.n == 3 and interval.mean == 12.0
    assert interval.low == pytest.approx(12 - half, abs=1e-4)
    assert interval.high == pytest.approx(12 + half, abs=1e-4)
    # 95 %: t(0.975, 2) = 4.302653
    assert t_interval([10.0, 12.0, 14.0], 0.95).half_width == pytest.approx(4.302653 * 2 / math.sqrt(3), abs=1e-4)


def test_t_interval_of_one_value_has_no_bounds():
    interval = t_interval([7.5])
    assert (interval.n, interval.mean, interval.low, interval.high) == (1, 7.5, None, None)
    with pytest.raises(ValueError):
        t_interval([])


def test_log_t_interval_hand_computed_and_never_below_zero():
    # logs 1, 2, 3: mean 2, s = 1, n = 3; t(0.975, 2) = 4.302653 (tables)
    i = log_t_interval([math.e, math.e ** 2, math.e ** 3], 0.95)
    half = 4.302653 / math.sqrt(3)
    assert i.mean == pytest.approx(math.e ** 2)
    assert (i.low, i.high) == (pytest.approx(math.exp(2 - half), rel=1e-6), pytest.approx(math.exp(2 + half), rel=1e-6))
    # the 2 x 2 point: two runs 2,900 and 1,150 gave -53,674 .. 57,724 (t, 99 %); now no bounds
    two = log_t_interval([2900.0, 1150.0])
    assert two.low is None and two.mean == pytest.approx(math.sqrt(2900 * 1150))
    # wide spread over 3 runs still stays positive
    wide = log_t_interval([1.0, 1000.0, 10.0], 0.99)
    assert 0 < wide.low < wide.mean < wide.high
    assert log_t_interval([5.0, 6.0], min_n=2).low is not None
    with pytest.raises(ValueError):
        log_t_interval([1.0, 0.0, 2.0])


def test_share_interval_stays_inside_zero_and_one():
    from netbench.stats import share_interval

    # logits of 0.2, 0.5, 0.8: -ln 4, 0, ln 4; mean 0, s = ln 4; t(0.975, 2) = 4.302653
    i = share_interval([0.2, 0.5, 0.8], 0.95)
    half = 4.302653 * math.log(4) / math.sqrt(3)
    assert i.mean == pytest.approx(0.5)
    assert (i.low, i.high) == (pytest.approx(1 / (1 + math.exp(half)), rel=1e-6),
                               pytest.approx(1 / (1 + math.exp(-half)), rel=1e-6))
    # a 0 among them: Student's t on the values, clipped at 0 (mean 0.1, s 0.1)
    clipped = share_interval([0.0, 0.1, 0.2], 0.95)
    assert clipped.low == 0.0 and clipped.high == pytest.approx(0.1 + 4.302653 * 0.1 / math.sqrt(3), rel=1e-6)
    assert share_interval([0.3, 0.4]).low is None
    with pytest.raises(ValueError):
        share_interval([0.5, 1.5, 0.2])


def test_ratio_interval_asks_for_min_n_runs_a_side():
    assert ratio_interval([10.0, 11.0], [5.0, 5.5, 6.0], 0.95, min_n=3).low is None
    assert ratio_interval([10.0, 11.0, 12.0], [5.0, 5.5, 6.0], 0.95, min_n=3).low > 0


def test_groups_are_points_and_timeouts_carry_no_throughput():
    observations = [obs("r000", 100, delay_ms=1), obs("r001", 50, delay_ms=10, repeat=0),
                    obs("r002", 110, delay_ms=1, repeat=1), obs("r003", None, status="timeout", delay_ms=10, repeat=1),
                    obs("r004", None, status="failed", delay_ms=10, repeat=2)]
    groups = group_observations(observations)
    assert [g.get("latency_ms") for g in groups] == [1.0, 10.0]
    fast, slow = groups
    assert fast.values == [100, 110] and fast.interval.n == 2
    assert fast.interval.mean == pytest.approx(math.sqrt(100 * 110))  # the geometric mean
    assert fast.interval.low is None  # two runs: no interval (MIN_RUNS is 3)
    assert slow.values == [50] and slow.interval.low is None
    assert (slow.timeouts, slow.failed) == (1, 1)


def test_scaling_efficiency_against_single_process_runs():
    observations = [obs("r000", 40, strategy="single", workers=1), obs("r001", 60, strategy="single", workers=1, repeat=1),
                    obs("r009", 50, strategy="single", workers=1, repeat=2),
                    obs("r002", 80, workers=2), obs("r003", 100, workers=2, repeat=1), obs("r008", 90, workers=2, repeat=2),
                    obs("r004", 75, workers=3), obs("r007", 70, workers=3, repeat=1),
                    obs("r005", 500, workers=2, model="cnn")]  # no cnn baseline: no efficiency
    effs = scaling_efficiency(group_observations(observations))
    baseline = statistics.geometric_mean([40, 60, 50])  # geometric mean of the single-process runs
    assert [(e.group.get("workers"), e.baseline) for e in effs] == [(2, pytest.approx(baseline)),
                                                                     (3, pytest.approx(baseline))]
    two, three = effs
    assert two.values == pytest.approx((80 / (2 * baseline), 100 / (2 * baseline), 90 / (2 * baseline)))
    assert two.interval.mean == pytest.approx(statistics.geometric_mean([80, 100, 90]) / (2 * baseline))
    # the interval is Welch's over both sides (the baseline's spread counts), checked with scipy
    from scipy import stats

    low, high = stats.ttest_ind(np.log([40.0, 50.0, 45.0]), np.log([40.0, 60.0, 50.0]),
                                equal_var=False).confidence_interval(0.95)
    assert (two.interval.low, two.interval.high) == (pytest.approx(math.exp(low)), pytest.approx(math.exp(high)))
    # two runs at 3 workers: the ratio, and no interval (fewer than MIN_RUNS on a side)
    assert three.values == (pytest.approx(75 / (3 * baseline)), pytest.approx(70 / (3 * baseline)))
    assert three.interval.low is None and three.interval.n == 2


def test_ratio_interval_hand_computed_with_one_side_fixed():
    # logs of 10 and 20 differ by ln 2: sample sd ln2/sqrt2, standard error ln2/2, df 1;
    # the denominator (5, 5, 5) has no spread: ratio sqrt(200)/5 = sqrt(8)
    t = 12.706205  # t(0.975, 1), tables
    i = ratio_interval([10, 20], [5, 5, 5], 0.95)
    assert i.mean == pytest.approx(math.sqrt(8))
    assert i.low == pytest.approx(math.sqrt(8) * 2 ** (-t / 2), rel=1e-5)
    assert i.high == pytest.approx(math.sqrt(8) * 2 ** (t / 2), rel=1e-5)
    assert ratio_interval([10], [5, 6]).low is None  # one run on a side: spread unknown
    with pytest.raises(ValueError):
        ratio_interval([10, 0], [5])


def test_ratio_interval_agrees_with_scipys_welch_test():
    from scipy import stats

    a, b = [310.0, 295.0, 330.0, 301.0, 322.0], [101.0, 97.5, 110.0, 93.0]
    i = ratio_interval(a, b, 0.99)
    low, high = stats.ttest_ind(np.log(a), np.log(b), equal_var=False).confidence_interval(0.99)
    assert (math.log(i.low), math.log(i.high)) == (pytest.approx(low), pytest.approx(high))
    assert i.n == 4


def test_speedups_pair_each_strategy_with_per_step_allreduce_at_the_same_point():
    observations = [obs("r000", 100, rate_mbit=20), obs("r001", 110, rate_mbit=20, repeat=1),
                    obs("r009", 105, rate_mbit=20, repeat=2),
                    obs("r002", 400, rate_mbit=20, strategy="allreduce-accum"),
                    obs("r003", 440, rate_mbit=20, strategy="allreduce-accum", repeat=1),
                    obs("r010", 420, rate_mbit=20, strategy="allreduce-accum", repeat=2),
                    obs("r004", 900, rate_mbit=1000), obs("r005", 950, rate_mbit=1000, repeat=1),
                    obs("r006", 2000, rate_mbit=1000, strategy="allreduce-accum"),
                    obs("r007", 300, rate_mbit=1000, strategy="allreduce-accum", model="cnn"),  # no reference
                    obs("r008", 5000, strategy="single", workers=1)]
    ratios = report.speedups(group_observations(observations))
    assert [(r.numerator.get("bandwidth_mbit"), r.denominator.get("strategy")) for r in ratios] == \
        [(20.0, "allreduce"), (1000.0, "allreduce")]
    slow, fast = ratios
    assert slow.interval.mean == pytest.approx(statistics.geometric_mean([400, 440, 420])
                                               / statistics.geometric_mean([100, 110, 105]))
    assert 0 < slow.interval.low < slow.interval.mean < slow.interval.high
    assert fast.interval.low is None  # one accum run at 1000 mbit: no interval, only the ratio
    result = CliRunner().invoke(cli.main, ["report", str(write_results(
        Path(tempfile.mkdtemp()) / "r", [record(o.run_id, rate_mbit=o.get("bandwidth_mbit"),
                                                strategy=o.get("strategy"), model=o.get("model"),
                                                workers=o.get("workers"), repeat=o.repeat, ips=o.images_per_sec)
                                         for o in observations]))])
    assert result.exit_code == 0, result.output
    assert "speed-up over per-step allreduce" in result.output and "4.00x" in result.output


def test_baseline_slice_keeps_the_best_level_of_other_network_factors():
    observations = [obs(f"r{i:03d}", 10, delay_ms=d, rate_mbit=r, loss_pct=l)
                    for i, (d, r, l) in enumerate([(1, 250, 0), (10, 250, 0), (1, 1000, 0), (10, 1000, 0),
                                                   (1, 1000, 1), (10, 1000, 1)])]
    groups = group_observations(observations)
    latency = baseline_slice(groups, "latency_ms")
    assert {(g.get("latency_ms"), g.get("bandwidth_mbit"), g.get("loss_pct")) for g in latency} == \
        {(1.0, 1000.0, 0.0), (10.0, 1000.0, 0.0)}
    bandwidth = baseline_slice(groups, "bandwidth_mbit")
    assert {(g.get("latency_ms"), g.get("bandwidth_mbit")) for g in bandwidth} == {(1.0, 250.0), (1.0, 1000.0)}


@pytest.mark.parametrize("levels, scale", [([1, 10, 100], "log"), ([250, 500, 1000], "linear"),
                                           ([0, 1, 10], "symlog"), ([10, 100, 200], "log"), ([5], "linear")])
def test_axis_scale_is_log_where_levels_span_decades(levels, scale):
    assert axis_scale(levels) == scale


# ---------------------------------------------------------------- figures from a fixture folder

def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def fixture_results(tmp_path) -> Path:
    """Two models x latency 1/10/100 ms x loss 0/1 %, 3 repetitions, one timeout, single baselines."""
    records, i = [], 0
    for model, base in (("mlp", 1000.0), ("cnn", 200.0)):
        for delay in (1, 10, 100):
            for loss in (0, 1):
                for rep in range(3):
                    timed_out = model == "cnn" and delay == 100 and loss == 0 and rep == 2
                    ips = None if timed_out else base / (1 + delay / 10) / (1 + loss) + rep
                    records.append(record(f"r{i:03d}", delay_ms=delay, loss_pct=loss, model=model, repeat=rep,
                                          ips=ips, status="timeout" if timed_out else "ok"))
                    i += 1
        for rep in range(3):
            records.append(record(f"r{i:03d}", strategy="single", workers=1, model=model, repeat=rep,
                                  delay_ms=1, ips=base / 1.5 + rep))
            i += 1
    return write_results(tmp_path / "results", records)


def test_report_renders_figures_and_summary(fixture_results, tmp_path):
    out = tmp_path / "report"
    written = report.write_report(fixture_results, out)
    names = sorted(p.name for p in written.files)
    assert names == ["report.html", "report.md", "scaling-efficiency.png", "throughput-latency.png",
                     "throughput-loss.png"]
    width, height = report.PANEL_PX
    for name in ("throughput-latency.png", "throughput-loss.png", "scaling-efficiency.png"):
        assert png_size(out / name) == (2 * width, height), name  # one panel per model: cnn, mlp
    text = (out / "report.md").read_text()
    assert "# Report: results" in text and "95% interval" in text and "timeout" in text
    # the mlp latency slow-down at loss 0: 1 ms -> 100 ms means (1000/1.1+1) vs (1000/11+1)
    fast = [1000 / 1.1 + r for r in range(3)]
    slow = [1000 / 11 + r for r in range(3)]
    ratio = ratio_interval(slow, fast, 0.95)
    assert ratio.mean == pytest.approx(statistics.geometric_mean(slow) / statistics.geometric_mean(fast))
    row = f"| mlp | allreduce | 1 | 100 | 3 | {report.percent(ratio.mean)} | {report.percent(ratio.low)} .. "
    assert row + f"{report.percent(ratio.high)} |" in text
    # every design point row carries its hand-checkable interval: geometric mean, log-scale t
    values = [1000 / 1.1 / 2 + r for r in range(3)]  # mlp, 1 ms, loss 1 %
    i = log_t_interval(values, 0.95)
    assert f"| {i.mean:,.1f} | {i.low:,.1f} .. {i.high:,.1f} |" in text


def test_report_command_prints_tables(fixture_results):
    result = CliRunner().invoke(cli.main, ["report", str(fixture_results)])
    assert result.exit_code == 0, result.output
    assert "design points" in result.output and "r000" in result.output
    assert (fixture_results / "report" / "throughput-latency.png").exists()


def test_ps_settings_and_idleness_come_from_the_record():
    rec = {**record("r000", strategy="ps", workers=3), "ps": 2, "idle_ratio": 0.25}
    o = report.observation_from_record(rec)
    assert (o.get("ps"), o.get("accum_steps"), o.idleness) == (2, None, 0.25)
    table = render.runs_table([o, report.observation_from_record(record("r001", strategy="ps", workers=1))])
    assert [c.header for c in table.columns][-2] == "idle"


def test_report_on_a_folder_without_runs_is_a_one_line_error(tmp_path):
    result = CliRunner().invoke(cli.main, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "no run records" in result.output and str(tmp_path) in result.output


def test_idleness_figure_where_the_strategy_reports_it(tmp_path):
    records = []
    for i, (delay, rep) in enumerate((d, r) for d in (10, 100, 200) for r in range(2)):
        records.append({**record(f"r{i:03d}", strategy="ps", workers=2, delay_ms=delay, repeat=rep,
                                 ips=1000 / delay), "ps": 1, "idle_ratio": delay / (delay + 20) + rep / 100})
    out = tmp_path / "report"
    written = report.write_report(write_results(tmp_path / "results", records), out)
    assert sorted(p.name for p in written.files) == ["idleness-latency.png", "report.html", "report.md",
                                                     "throughput-latency.png"]
    assert png_size(out / "idleness-latency.png") == report.PANEL_PX
    assert report.idleness_values(written.groups[0]) == pytest.approx([100 * 10 / 30, 100 * 10 / 30 + 1])


def test_value_scale_and_percent():
    assert report.value_scale([46.0, 250.0, 6370.0]) == "log"  # 20 mbit to 1 gbit in one panel
    assert report.value_scale([500.0, 1000.0]) == "linear"
    assert report.value_scale([]) == "linear"
    assert (report.percent(0.026), report.percent(0.45)) == ("2.6%", "45%")


def test_series_labels_leave_out_settings_a_strategy_does_not_have():
    accum, plain = group_observations([obs("r000", 10, strategy="allreduce-accum"), obs("r001", 5)])
    accum = report.Group(factors=tuple((k, 4 if k == "accum_steps" else v) for k, v in accum.factors),
                         observations=accum.observations, interval=accum.interval)
    assert report.series_label(accum, ["strategy", "accum_steps"]) == "allreduce-accum, accum 4"
    assert report.series_label(plain, ["strategy", "accum_steps"]) == "allreduce"
    one = group_observations([obs("r002", 5, workers=1)])[0]
    assert report.series_label(one, ["workers"]) == "1 worker"


def test_tables_print_recorded_text_as_written():
    # a record's levels are whatever the results folder holds; rich must not read them as markup
    import io

    from rich.console import Console

    observations = [obs("r000", 10.0, model="[/]"), obs("r001", 20.0, model="[bold]x"),
                    obs("r002", None, status="timeout", model="[/]")]
    groups = group_observations(observations)
    out = io.StringIO()
    console = Console(file=out, width=200)
    console.print(render.runs_table(observations))
    console.print(render.groups_table(groups, 0.99))
    assert out.getvalue().count("[/]") >= 3 and "[bold]x" in out.getvalue()


def test_load_takes_settings_from_playbook_json_and_words_an_unreadable_one(tmp_path):
    rec = record("r000", strategy="allreduce-accum")
    folder = write_results(tmp_path / "results", [rec])
    (folder / "playbook.json").write_text(json.dumps({"runs": [{"run_id": "r000", "accum_steps": 8}]}))
    [o] = report.load_observations(folder)
    assert o.get("accum_steps") == 8
    (folder / "playbook.json").write_text("{torn")
    with pytest.raises(report.ReportError, match="playbook.json: unreadable"):
        report.load_observations(folder)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1e-3, 1e6), min_size=1, max_size=8), st.lists(st.floats(0, 1), min_size=1, max_size=8),
       st.sampled_from([0.8, 0.95, 0.99]))
def test_intervals_keep_to_their_domain_for_any_runs(positive, shares, level):
    from netbench.stats import share_interval

    for i, low_bound, high_bound in ((log_t_interval(positive, level), 0.0, math.inf),
                                     (share_interval(shares, level), 0.0, 1.0)):
        if i.low is None:
            assert i.n < 3
        else:
            assert low_bound <= i.low <= i.mean * (1 + 1e-9)
            assert i.mean <= i.high * (1 + 1e-9) and i.high <= high_bound


def test_report_level_flag_states_its_level_and_refuses_a_fraction_of_one(tmp_path):
    from tests.unit.report_designs import two_by_two

    folder = two_by_two(tmp_path / "r", repetitions=3)
    result = CliRunner().invoke(cli.main, ["report", str(folder), "--level", "90"])
    assert result.exit_code == 0, result.output
    assert "90% interval" in result.output and "90% interval" in (folder / "report" / "report.md").read_text()
    assert (folder / "report" / "report.html").is_file()
    refused = CliRunner().invoke(cli.main, ["report", str(folder), "--level", "100"])
    assert refused.exit_code == 2 and "--level" in refused.output
