"""The report's figures of accuracy runs (issue 21): accuracy against step and wall time from
the run records' curves, time to the target accuracy as bars per algorithm at every network
point with the runs that never reached it shown as such, and report.md's 'Which won'. Figures
are checked as in test_report_figures: where matplotlib's renderer put every element."""

from __future__ import annotations

import base64
import re

import pytest

matplotlib = pytest.importorskip("matplotlib")

from netbench import report  # noqa: E402
from netbench.report import curves  # noqa: E402
from netbench.report.accuracy import read_points, winners  # noqa: E402
from tests.unit import report_designs as designs  # noqa: E402
from tests.unit.test_report_figures import looks_right, outside, runs_off_their_marks, whisker_bottoms  # noqa: E402

LEVEL = 0.95


@pytest.fixture(autouse=True)
def close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def observations(folder):
    return report.load_observations(folder)


def test_the_curve_spec_has_a_panel_per_network_point_and_a_mean_of_the_repetitions(tmp_path):
    spec = curves.curve_spec(observations(designs.algorithms(tmp_path / "r")), "step")
    assert spec.panels == ("latency 1 ms", "latency 20 ms")
    assert spec.series == ("allreduce", "ps-sync", "gosgd")  # the order the runs were made: the other figures'
    assert spec.target_pct == pytest.approx(60.0) and spec.x_label == "training steps (worker 0's)"
    runs = [c for c in spec.curves if not c.centre]
    means = [c for c in spec.curves if c.centre]
    assert len(runs) == 18 and len(means) == 6 and all(c.runs == 3 for c in means) and all(c.runs == 1 for c in runs)
    # the mean at each evaluation, by hand: the three repetitions' accuracies at step 10
    mine = [c for c in runs if c.panel == "latency 20 ms" and c.series == "gosgd"]
    mean = next(c for c in means if c.panel == "latency 20 ms" and c.series == "gosgd")
    assert mean.x == mine[0].x == (10.0, 20.0, 30.0, 40.0, 50.0, 60.0)
    assert mean.accuracy_pct[0] == pytest.approx(sum(c.accuracy_pct[0] for c in mine) / 3)
    assert "thick lines with markers: the mean of a point's repetitions" in spec.note
    assert "thin lines: each run" in spec.note
    # against wall time: x is each run's wall_s, the mean's the mean of theirs
    wall = curves.curve_spec(observations(tmp_path / "r"), "wall_s")
    assert wall.x_label == "wall time from the first step (s, evaluations included)"
    first = [c for c in wall.curves if not c.centre and c.panel == "latency 1 ms" and c.series == "allreduce"]
    assert first[0].x[0] == pytest.approx(10 * 0.030 + 0.4)
    assert "(x: the mean of their times)" in wall.note


def test_one_run_per_point_draws_no_mean_and_a_folder_without_curves_has_none(tmp_path):
    spec = curves.curve_spec(observations(designs.algorithms(tmp_path / "r", repetitions=1, target=None)), "step")
    # one run a point: its run is the point's line, no thin lines beside it
    assert len(spec.curves) == 6 and all(c.centre and c.runs == 1 for c in spec.curves)
    assert "thick lines with markers: each point's one run" in spec.note and "thin" not in spec.note
    assert spec.target_pct is None and "target" not in spec.note
    with pytest.raises(report.ReportError, match="no accuracy curve"):
        curves.curve_spec(observations(designs.demo_latency(tmp_path / "d")), "step")
    with pytest.raises(ValueError):
        curves.curve_spec(observations(tmp_path / "r"), "epoch")


def test_a_failed_run_is_not_drawn(tmp_path):
    folder = designs.algorithms(tmp_path / "r", repetitions=1)
    path = folder / "runs" / "r000.json"
    path.write_text(path.read_text().replace('"status": "ok"', '"status": "failed"'))
    spec = curves.curve_spec(observations(folder), "step")
    assert len(spec.curves) == 5  # six points, one run each, the failed one left out


def test_the_curve_figures_read_as_a_paper_prints_them(tmp_path):
    obs = observations(designs.algorithms(tmp_path / "r"))
    for x in ("step", "wall_s"):
        spec = curves.curve_spec(obs, x)
        fig = curves.draw_curve_figure(spec)
        assert outside(fig) == []
        panels = [ax for ax in fig.axes if ax.get_gid() != "legend"]
        assert len(panels) == 2
        assert tuple(round(v) for v in fig.bbox.size) == (2 * report.PANEL_PX[0], report.PANEL_PX[1])
        assert panels[0].get_ylabel() == "test accuracy (%)"
        assert all(ax.get_xlabel() == spec.x_label for ax in panels)
        assert [ax.get_title() for ax in panels] == ["latency 1 ms", "latency 20 ms"]
        # one scale: every line, and the target, inside both panels' limits (the slowest run's last evaluation too)
        assert panels[0].get_xlim() == panels[1].get_xlim() and panels[0].get_ylim() == panels[1].get_ylim()
        right = max(v for c in spec.curves for v in c.x)
        assert panels[0].get_xlim()[1] >= right
        low, high = panels[0].get_ylim()
        assert 0 <= low and high <= 100 and low <= 60 <= high
        lines = [line for ax in panels for line in ax.lines]
        assert sum(line.get_gid() == "curve" for line in lines) == 18
        assert sum(line.get_gid() == "mean" for line in lines) == 6
        assert sum(line.get_gid() == "target" for line in lines) == 2
        # the legend below the panels, covering none of them; one entry per algorithm and the target
        fig.canvas.draw()
        legend = fig.legends[0].get_window_extent()
        assert all(legend.y1 <= ax.get_window_extent().y0 for ax in panels)
        assert [t.get_text() for t in fig.legends[0].get_texts()] == ["allreduce", "ps-sync", "gosgd", "target 60 %"]
        # colours, markers and dashes: one of each per algorithm, the same in both panels
        for ax in panels:
            style = {line.get_label(): (line.get_color(), line.get_marker(), line.get_linestyle())
                     for line in ax.lines if line.get_gid() == "mean"}
            assert style == {"allreduce": ("C0", "o", "-"), "ps-sync": ("C1", "s", "--"), "gosgd": ("C2", "^", "-.")}


def test_many_network_points_wrap_into_rows(tmp_path):
    records = []
    for i, delay in enumerate((1, 5, 10, 50)):
        curve = designs.accuracy_curve(0.8, 12, 0.01 * (1 + delay / 10))
        records.append(designs.record(f"r{i:03d}", delay_ms=delay, accuracy_curve=curve,
                                      test_accuracy=curve[-1]["accuracy"]))
    spec = curves.curve_spec(observations(designs.write_results(tmp_path / "r", records)), "wall_s")
    fig = curves.draw_curve_figure(spec)
    assert outside(fig) == []
    assert tuple(round(v) for v in fig.bbox.size) == (3 * report.PANEL_PX[0], 2 * report.PANEL_PX[1])
    panels = [ax for ax in fig.axes if ax.get_gid() != "legend"]
    assert len(panels) == 4  # the two empty cells of the second row removed
    # x labelled at the foot of every column: the 4th panel's, and the 2nd and 3rd (nothing below them)
    assert [bool(ax.get_xlabel()) for ax in panels] == [False, True, True, True]
    assert [bool(ax.get_ylabel()) for ax in panels] == [True, False, False, True]


def test_time_to_target_bars_show_the_runs_that_never_reached_it(tmp_path):
    groups = report.group_observations(observations(designs.algorithms(tmp_path / "r")), LEVEL)
    fig = report.build_metric_figure(groups, report.TIME_TO_TARGET, "strategy", LEVEL, baseline=False)
    looks_right(fig, 1)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["allreduce", "gosgd", "ps-sync"]
    bars = [p for p in ax.patches if p.get_gid() == "bar"]
    assert len(bars) == 5  # gosgd at 20 ms: no run reached the target, no bar (and none of zero height)
    assert all(b.get_height() > 0 for b in bars)
    triangles = [c for c in ax.collections if c.get_gid() == "unreached"]
    assert len(triangles) == 2 and sorted(len(c.get_offsets()) for c in triangles) == [1, 3]
    # the triangles above every bar and whisker: the data keep to the lower part of the axes
    fig.canvas.draw()
    lowest_triangle = min(c.get_offset_transform().transform(c.get_offsets())[:, 1].min() for c in triangles)
    highest_data = max([b.get_window_extent().y1 for b in bars]
                       + [c.get_transform().transform(seg)[:, 1].max() for c in ax.collections
                          if c.get_gid() == "interval" for seg in c.get_segments()])
    assert highest_data < lowest_triangle - 5
    assert all(y > 0 for y in whisker_bottoms(fig)) and runs_off_their_marks(fig) == []
    texts = {t.get_text() for t in fig.legends[0].get_texts()}
    assert {"latency 1 ms", "latency 20 ms", "run that never reached the target"} <= texts
    assert "open triangles at the top: a run that never reached it" in \
        fig.legends[0].get_title().get_text().replace("\n", " ")
    points = report.points_for(groups, report.TIME_TO_TARGET, "strategy", LEVEL)
    gosgd_20 = next(p for p in points if p.x == "gosgd" and p.series == "latency 20 ms")
    assert (gosgd_20.centre, gosgd_20.unreached, gosgd_20.runs) == (None, 3, ())


def test_two_repetitions_show_their_runs_and_many_unreached_runs_are_counted(tmp_path):
    groups = report.group_observations(observations(designs.algorithms(tmp_path / "r", repetitions=2)), LEVEL)
    fig = report.build_metric_figure(groups, report.TIME_TO_TARGET, "strategy", LEVEL, baseline=False)
    looks_right(fig, 1)
    assert not [c for c in fig.axes[0].collections if c.get_gid() == "interval"]  # n < 3: the runs, no whiskers
    many = report.group_observations(observations(designs.algorithms(tmp_path / "m", repetitions=6)), LEVEL)
    fig = report.build_metric_figure(many, report.TIME_TO_TARGET, "strategy", LEVEL, baseline=False)
    looks_right(fig, 1)
    counted = [t.get_text() for t in fig.axes[0].texts if t.get_gid() == "unreached"]
    assert counted == ["x6"]  # gosgd at 20 ms: one triangle and its count, not a column of six


def test_a_run_is_unreached_only_where_there_was_a_target(tmp_path):
    with_target = report.group_observations(observations(designs.algorithms(tmp_path / "r")), LEVEL)
    without = report.group_observations(observations(designs.algorithms(tmp_path / "n", target=None)), LEVEL)
    assert sum(report.TIME_TO_TARGET.unreached(g) for g in with_target) == 4
    assert sum(report.TIME_TO_TARGET.unreached(g) for g in without) == 0
    assert sum(report.ACCURACY.unreached(g) for g in with_target) == 0  # not a value a run reaches


def test_write_report_draws_the_algorithms_figures_and_says_which_won_first(tmp_path):
    written = report.write_report(designs.algorithms(tmp_path / "r"), tmp_path / "out", LEVEL)
    names = sorted(p.name for p in written.files)
    assert names == ["accuracy-latency.png", "accuracy-step.png", "accuracy-walltime.png", "idleness-latency.png",
                     "report.html", "report.md", "spread-step.png", "throughput-latency.png",
                     "time-to-target-strategy.png"]
    text = (tmp_path / "out" / "report.md").read_text()
    assert text.index("## Which won") < text.index("## Throughput along latency") < text.index("## Algorithms")
    assert ("- On time to the target accuracy 60 %: allreduce, 2 workers, 1 ms (0.63 (0.56 .. 0.71) s of training, "
            "3/3 runs reached it); next: ps-sync") in text
    assert "- On throughput: gosgd, 2 workers, 1 ms (6,100 (5,419 .. 6,867) images/s)" in text
    assert ("- On accuracy: allreduce, 2 workers, 1 ms (test accuracy 78.4 (75.5 .. 81.1) %); tied with allreduce, "
            "2 workers, 20 ms; next: ps-sync, 2 workers, 1 ms (test accuracy 75.9 (72.8 .. 78.7) %).") in text
    assert "| gosgd | 2 | 20 | 3/3 |" in text and "| 0/3 | - |" in text
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<ul><li>On time to the target accuracy 60 %: allreduce" in page  # a list in the page too
    assert len(re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)) == 7
    for png in written.files[:-2]:
        assert base64.b64encode(png.read_bytes())[:20].decode() in page


def test_without_a_target_the_report_says_so_and_draws_no_time_to_target(tmp_path):
    written = report.write_report(designs.algorithms(tmp_path / "r", repetitions=2, target=None), tmp_path / "out",
                                  LEVEL)
    assert "time-to-target-strategy.png" not in {p.name for p in written.files}
    assert "accuracy-walltime.png" in {p.name for p in written.files}
    text = (tmp_path / "out" / "report.md").read_text()
    assert "- On time to a target accuracy: no target was set (--target-accuracy)" in text
    # two runs a point: their values instead of an interval
    assert "- On throughput: gosgd, 2 workers, 1 ms (6,246 (runs: 6,400, 6,095) images/s)" in text
    assert "test accuracy 79.0 (runs: 79.5, 78.4) %" in text


def test_a_target_nobody_reached_is_said_in_words(tmp_path):
    points, target = read_points(designs.algorithms(tmp_path / "r", target=0.95))
    assert target == 0.95 and all(p.reached == 0 for p in points)
    assert winners(points, target)[0] == "- On time to the target accuracy 95 %: no run reached it."


def test_points_that_differ_in_bandwidth_are_not_merged_and_say_where_they_differ(tmp_path):
    records = []
    for i, (rate, ips) in enumerate(((100, 900.0), (100, 880.0), (1000, 2400.0), (1000, 2500.0))):
        curve = designs.accuracy_curve(0.8, 12, 128 / ips)
        records.append(designs.record(f"r{i:03d}", rate_mbit=rate, delay_ms=10, strategy="ps-sync", repeat=i % 2,
                                      ips=ips, accuracy_curve=curve, test_accuracy=curve[-1]["accuracy"]))
    points, target = read_points(designs.write_results(tmp_path / "r", records))
    assert target is None  # no manifest: no target known
    assert [(p.setting, p.runs) for p in points] == [("bandwidth 100 Mbit/s", 2), ("bandwidth 1000 Mbit/s", 2)]
    lines = winners(points, target)
    assert lines[1] == ("- On throughput: ps-sync, 2 workers, 10 ms, bandwidth 1000 Mbit/s (2,449 (runs: 2,400, "
                        "2,500) images/s); next: ps-sync, 2 workers, 10 ms, bandwidth 100 Mbit/s (890 (runs: 900, "
                        "880) images/s).")
    assert "- At 10 ms, bandwidth 100 Mbit/s: most accurate ps-sync" in "\n".join(lines)
    text = report.write_report(tmp_path / "r", tmp_path / "out", LEVEL) and (tmp_path / "out" / "report.md").read_text()
    assert "| other factors |" in text and "| ps-sync | 2 | 10 | bandwidth 100 Mbit/s | 2/2 |" in text


def test_a_figure_from_zero_keeps_its_top_marks_off_the_frame(tmp_path):
    # idleness against latency starts at 0 %: the margin above the highest run is of the whole range
    groups = report.group_observations(observations(designs.algorithms(tmp_path / "r")), LEVEL)
    fig = report.build_metric_figure(groups, report.IDLENESS, "latency_ms", LEVEL)
    looks_right(fig, 1)
    highest = max(v for g in groups for v in report.IDLENESS.values(g))
    low, high = fig.axes[0].get_ylim()
    assert low == 0 and high >= 1.05 * highest


def test_accuracy_lines_keep_to_the_datas_range_and_accuracy_bars_to_zero(tmp_path):
    # a few points of accuracy between algorithms are the finding: on 0..100 % they are one flat band
    groups = report.group_observations(observations(designs.algorithms(tmp_path / "r")), LEVEL)
    fig = report.build_metric_figure(groups, report.ACCURACY, "latency_ms", LEVEL)
    looks_right(fig, 1)
    values = [v for g in groups for v in report.ACCURACY.values(g)]
    low, high = fig.axes[0].get_ylim()
    assert 0 < low < min(values) and max(values) < high < 100
    assert (high - low) < 2 * (max(values) - min(values)) + 1
    bars = report.build_metric_figure(groups, report.ACCURACY, "strategy", LEVEL, baseline=False)
    looks_right(bars, 1)
    assert bars.axes[0].get_ylim()[0] == 0  # a bar's length is its value


def test_a_runs_own_target_wins_over_the_manifests_which_an_appended_sweep_overwrote():
    from netbench.report.load import observation_from_record

    curve = [{"step": 10, "wall_s": 1.0, "train_s": 0.5, "accuracy": 0.6, "spread": None}]
    record = {"run_id": "r000", "status": "ok", "accuracy_curve": curve, "target_accuracy": 0.5}
    assert observation_from_record(record, target=0.9).target_accuracy == 0.5
    older = {k: v for k, v in record.items() if k != "target_accuracy"}  # a record before schema 10
    assert observation_from_record(older, target=0.9).target_accuracy == 0.9
    assert observation_from_record({**record, "target_accuracy": None}, target=0.9).target_accuracy is None


def test_bars_whose_values_span_ten_times_stand_on_a_log_axis_with_their_tops_at_the_values():
    """Time to target from 0.47 s (gosgd, 1 ms) to 75 s (TF's ps, 50 ms): on a linear axis the
    1 ms bars read as nothing; on the log axis every bar's top is its value and its foot the
    decade below the lowest value, and every element stays inside the axes."""
    from netbench.report.figures import Point, bar_base, build_figure

    values = {("gosgd", "1 ms"): 0.47, ("gosgd", "50 ms"): 1.9, ("ps", "1 ms"): 2.5, ("ps", "50 ms"): 75.0}
    points = [Point(panel="mlp", series=net, x=algo, centre=v, low=v * 0.8, high=v * 1.25, runs=(v * 0.9, v * 1.1, v))
              for (algo, net), v in values.items()]
    assert bar_base(points) == pytest.approx(0.1)  # 0.47 x 0.8 = 0.376: the decade below is 0.1
    fig = build_figure(points, x_label="strategy", y_label="training time to the target accuracy (s)",
                       title="time to target", note="bars", log_ok=True)
    looks_right(fig, 1)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and ax.get_ylim()[0] == pytest.approx(0.1)
    bars = [p for p in ax.patches if p.get_gid() == "bar"]
    assert sorted(round(b.get_y() + b.get_height(), 6) for b in bars) == sorted(values.values())
    assert all(b.get_y() == pytest.approx(0.1) for b in bars)
    near = [Point(panel="mlp", series="1 ms", x=a, centre=v, low=None, high=None, runs=(v,))
            for a, v in (("a", 2.0), ("b", 5.0))]
    fig = build_figure(near, x_label="strategy", y_label="s", title="t", note="bars", log_ok=True)
    assert fig.axes[0].get_yscale() == "linear" and fig.axes[0].get_ylim()[0] == 0  # under 10x: from zero


def test_the_spread_between_workers_is_drawn_against_step_where_workers_disagreed(tmp_path):
    obs = observations(designs.algorithms(tmp_path / "r"))
    assert {o.get("strategy") for o in curves.spread_runs(obs)} == {"gosgd"}  # the others record no spread
    spec = curves.curve_spec(obs, "step", y="spread")
    assert spec.series == ("gosgd",) and spec.target_pct is None
    assert all(v == pytest.approx(3.0) for c in spec.curves for v in c.accuracy_pct)  # 0.03 in points
    assert "best minus the worst worker" in spec.note
    looks_right_curves = curves.draw_curve_figure(spec)
    assert outside(looks_right_curves) == []
    written = report.write_report(tmp_path / "r", tmp_path / "out", LEVEL)
    assert (tmp_path / "out" / "spread-step.png").is_file() and written
    agreeing = [o for o in obs if o.get("strategy") != "gosgd"]
    assert curves.spread_runs(agreeing) == []
    with pytest.raises(report.ReportError, match="no spread"):
        curves.curve_spec(agreeing, "step", y="spread")
