"""Figures that a reader can trust, checked as a reader would look: each figure kind is
rendered from a fixture design and matplotlib's renderer says where every bar, marker,
whisker and text landed (inside the figure, data inside their axes), the runs' dots sit on
their own marker or bar, and no interval reaches below zero. report.html carries them all."""

from __future__ import annotations

import base64
import math
import re
from pathlib import Path

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")

from matplotlib.collections import Collection, LineCollection, PathCollection  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from netbench import report  # noqa: E402
from tests.unit import report_designs as designs  # noqa: E402

LEVEL = 0.95


def groups_of(folder: Path):
    return report.group_observations(report.load_observations(folder), LEVEL)


def outside(fig) -> list[str]:
    """Every visible artist whose drawn extent leaves the figure, and every data artist
    (line, marker, bar, whisker, dots) that leaves its axes (it would be clipped there)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    bad = []
    # an axis keeps tick artists beyond its view limits and does not draw them: judge an axis
    # by what it draws (its tight box: ticks, tick labels, label), the rest artist by artist
    axes_parts = {id(a) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis) for a in axis.findobj()}
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            extent = axis.get_tightbbox(renderer)
            if extent is None:
                continue  # an axis that draws nothing (a shared one without tick labels)
            if extent.x0 < box.x0 - 1 or extent.y0 < box.y0 - 1 or extent.x1 > box.x1 + 1 or extent.y1 > box.y1 + 1:
                bad.append(f"{axis.__class__.__name__} {axis.label.get_text()!r} at {extent} outside the figure")
    for artist in fig.findobj(lambda a: isinstance(a, (Text, Line2D, Rectangle, Collection)) and a.get_visible()):
        if isinstance(artist, Text) and not artist.get_text():
            continue
        if artist is fig.patch or id(artist) in axes_parts:
            continue
        extent = extent_of(artist, renderer)
        if extent is None:
            continue  # an empty line (a legend handle with no data)
        if not all(math.isfinite(v) for v in extent.extents):
            bad.append(f"{type(artist).__name__} {artist.get_gid()!r}: the renderer cannot place it")
            continue
        if (extent.x0 < box.x0 - 1 or extent.y0 < box.y0 - 1 or extent.x1 > box.x1 + 1 or extent.y1 > box.y1 + 1):
            bad.append(f"{type(artist).__name__} {artist.get_gid() or getattr(artist, 'get_text', lambda: '')()!r} "
                       f"at {extent} outside the figure {box}")
        if artist.get_gid() in ("centre", "interval", "runs", "bar", "companion", "timeout", "unreached", "curve",
                                "mean", "target"):
            axes = artist.axes.bbox
            if (extent.x0 < axes.x0 - 1 or extent.y0 < axes.y0 - 1 or extent.x1 > axes.x1 + 1
                    or extent.y1 > axes.y1 + 1):
                bad.append(f"{artist.get_gid()} at {extent} outside its axes {axes}")
    return bad


def extent_of(artist, renderer):
    """Where `artist` lands, in pixels; None for an empty one. A scatter's extent is taken
    from its points (their display positions and marker size) and whiskers' from their
    segments: matplotlib returns no extent for collections drawn through an offset or a
    blended transform (x in data, y in axes units)."""
    if isinstance(artist, PathCollection):
        if not len(artist.get_offsets()):
            return None
        xy = artist.get_offset_transform().transform(artist.get_offsets())
        radius = math.sqrt(max(artist.get_sizes(), default=0)) / 2 * artist.figure.dpi / 72
        return Bbox.from_extents(xy[:, 0].min() - radius, xy[:, 1].min() - radius,
                                 xy[:, 0].max() + radius, xy[:, 1].max() + radius)
    if isinstance(artist, LineCollection):  # whiskers: their segments, through their own transform
        segments = [seg for seg in artist.get_segments() if len(seg)]
        if not segments:
            return None
        xy = artist.get_transform().transform(np.concatenate(segments))
        return Bbox.from_extents(xy[:, 0].min(), xy[:, 1].min(), xy[:, 0].max(), xy[:, 1].max())
    extent = artist.get_window_extent(renderer)
    if extent.width == 0 and extent.height == 0 and not isinstance(artist, Text):
        return None
    return extent


def display_x(artist) -> list[float]:
    if isinstance(artist, Collection):
        return list(artist.get_offset_transform().transform(artist.get_offsets())[:, 0])
    return list(artist.get_transform().transform(artist.get_xydata())[:, 0])


def runs_off_their_marks(fig) -> list[float]:
    """x (pixels) of every run's dot that is on no marker and no bar of its axes."""
    fig.canvas.draw()
    off = []
    for ax in fig.axes:
        marks = [x for line in ax.lines if line.get_gid() == "centre" for x in display_x(line)]
        marks += [p.get_window_extent().x0 + p.get_window_extent().width / 2 for p in ax.patches
                  if p.get_gid() == "bar"]
        for dots in (c for c in ax.collections if c.get_gid() == "runs"):
            off += [x for x in display_x(dots) if min((abs(x - m) for m in marks), default=99) > 0.5]
    return off


def whisker_bottoms(fig) -> list[float]:
    """The lowest data value of every whisker drawn."""
    return [min(seg[:, 1].min() for seg in c.get_segments()) for ax in fig.axes for c in ax.collections
            if isinstance(c, LineCollection) and c.get_segments()]


def looks_right(fig, panels: int) -> None:
    assert outside(fig) == []
    assert runs_off_their_marks(fig) == []
    assert all(y >= 0 for y in whisker_bottoms(fig))
    width, height = report.PANEL_PX
    assert tuple(round(v) for v in fig.bbox.size) == (width * panels, height)  # constrained layout kept the size
    assert sum(ax.get_gid() != "legend" for ax in fig.axes) == panels


@pytest.fixture(autouse=True)
def close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def test_the_checker_sees_an_element_outside_and_a_run_beside_its_marker(tmp_path):
    # the checks above can fail: a text pushed off the figure and dots moved off the markers
    fig = report.build_metric_figure(groups_of(designs.demo_latency(tmp_path / "r")), report.THROUGHPUT,
                                     "latency_ms", LEVEL)
    assert outside(fig) == [] and runs_off_their_marks(fig) == []
    fig.text(1.02, 0.5, "cut off")
    dots = next(c for c in fig.axes[0].collections if c.get_gid() == "runs")
    dots.set_offsets(dots.get_offsets() * [1.5, 1])
    assert any("cut off" in line for line in outside(fig))
    assert runs_off_their_marks(fig)
    fig.axes[0].set_ylim(top=300)  # the 1 and 10 ms markers above the axes: they would be clipped
    assert any(line.startswith("centre") and "outside its axes" in line for line in outside(fig))


def test_latency_sweep_of_one_run_each_is_a_log_log_line(tmp_path):
    # make demo: 1/10/100 ms, one run each; throughput spans 10x: both axes logarithmic
    fig = report.build_metric_figure(groups_of(designs.demo_latency(tmp_path / "r")), report.THROUGHPUT,
                                     "latency_ms", LEVEL)
    looks_right(fig, 1)
    ax = fig.axes[0]
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "10", "100"]
    assert not [c for c in ax.collections if c.get_gid() == "interval"]  # one run: no whiskers


def test_two_by_two_with_two_repetitions_has_no_whiskers_and_shows_its_runs(tmp_path):
    groups = groups_of(designs.two_by_two(tmp_path / "r"))
    fig = report.build_metric_figure(groups, report.THROUGHPUT, "loss_pct", LEVEL)
    looks_right(fig, 1)
    ax = fig.axes[0]
    assert ax.get_xscale() == "linear" and [t.get_text() for t in ax.get_xticklabels()] == ["0", "1"]
    assert sum(len(c.get_offsets()) for c in ax.collections if c.get_gid() == "runs") == 8
    assert not [c for c in ax.collections if c.get_gid() == "interval"]
    assert {t.get_text() for t in fig.legends[0].get_texts()} == {"batch 32", "batch 256"}
    # the y axis comes from the data: every run within it, no whisker stretching it
    low, high = ax.get_ylim()
    values = [v for g in groups for v in g.values]
    assert low <= min(values) and max(values) <= high <= 3 * max(values)


def test_three_repetitions_draw_whiskers_that_stay_positive(tmp_path):
    groups = groups_of(designs.two_by_two(tmp_path / "r", repetitions=3))
    fig = report.build_metric_figure(groups, report.THROUGHPUT, "loss_pct", LEVEL)
    looks_right(fig, 1)
    assert len([c for c in fig.axes[0].collections if c.get_gid() == "interval"]) == 2  # one per series
    points = report.points_for(groups, report.THROUGHPUT, "loss_pct", LEVEL)
    assert all(0 < p.low <= p.centre <= p.high for p in points)


def test_idleness_is_a_share_inside_zero_to_hundred(tmp_path):
    groups = groups_of(designs.two_by_two(tmp_path / "r", repetitions=3))
    fig = report.build_metric_figure(groups, report.IDLENESS, "loss_pct", LEVEL)
    looks_right(fig, 1)
    assert fig.axes[0].get_yscale() == "linear" and fig.axes[0].get_ylim()[0] == 0
    assert all(0 <= p.low <= p.centre <= p.high <= 100 for p in report.points_for(groups, report.IDLENESS,
                                                                                 "loss_pct", LEVEL))


def test_topology_scale_sweep(tmp_path):
    fig = report.build_metric_figure(groups_of(designs.topology_scale(tmp_path / "r")), report.THROUGHPUT,
                                     "scale", LEVEL)
    looks_right(fig, 1)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1", "2", "4"]


def test_a_categorical_factor_gets_grouped_bars_with_runs_on_their_bar(tmp_path):
    groups = groups_of(designs.strategies(tmp_path / "r"))
    for measure in (report.THROUGHPUT, report.ACCURACY):
        fig = report.build_metric_figure(groups, measure, "strategy", LEVEL)
        looks_right(fig, 1)
        bars = [p for p in fig.axes[0].patches if p.get_gid() == "bar"]
        assert len(bars) == 3 and [t.get_text() for t in fig.axes[0].get_xticklabels()] == \
            ["allreduce", "allreduce-accum (k=4)", "ps (1 ps)"]


def test_measured_beside_predicted_step_time_two_panels_and_timeouts(tmp_path):
    groups = groups_of(designs.predicted_latency(tmp_path / "r"))
    fig = report.build_metric_figure(groups, report.STEP_TIME, "latency_ms", LEVEL)
    looks_right(fig, 2)  # cnn and mlp
    dashed = [line for ax in fig.axes for line in ax.lines if line.get_gid() == "companion"]
    assert len(dashed) == 2 and all(line.get_linestyle() == "--" for line in dashed)
    assert [c for ax in fig.axes for c in ax.collections if c.get_gid() == "timeout"]
    assert "predicted (dashed)" in {t.get_text() for t in fig.legends[0].get_texts()}


def test_scaling_efficiency_figure(tmp_path):
    records = [designs.record(f"r{i:03d}", strategy="single" if n == 1 else "allreduce", workers=n, repeat=rep,
                              model=model, ips=base * n * (0.9 if n > 1 else 1) + 3 * rep)
               for i, (model, base, n, rep) in enumerate((m, b, n, r) for m, b in (("mlp", 900.0), ("cnn", 90.0))
                                                         for n in (1, 2, 3) for r in range(3))]
    groups = groups_of(designs.write_results(tmp_path / "r", records))
    fig = report.build_efficiency_figure(report.scaling_efficiency(groups, LEVEL), LEVEL)
    looks_right(fig, 2)
    assert all(ax.get_ylim()[1] >= 110 for ax in fig.axes)  # the ideal line is in view, off the frame


def test_write_report_draws_what_the_folder_holds_and_one_html_page_embeds_it(tmp_path):
    written = report.write_report(designs.predicted_latency(tmp_path / "r"), tmp_path / "out", LEVEL)
    names = sorted(p.name for p in written.files)
    assert names == ["accuracy-latency.png", "report.html", "report.md", "steptime-latency.png",
                     "throughput-latency.png"]
    page = (tmp_path / "out" / "report.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 3 and all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in images)
    assert "http" not in page.replace("http-equiv", "")  # nothing fetched: it opens from a file
    assert "<table>" in page and "95% interval" in page
    # a folder without those columns draws neither accuracy nor step time
    plain = report.write_report(designs.demo_latency(tmp_path / "d"), tmp_path / "d-out", LEVEL)
    assert sorted(p.name for p in plain.files) == ["report.html", "report.md", "throughput-latency.png"]
    bars = report.write_report(designs.strategies(tmp_path / "s"), tmp_path / "s-out", LEVEL)
    assert sorted(p.name for p in bars.files) == ["accuracy-strategy.png", "report.html", "report.md",
                                                  "throughput-strategy.png"]


def test_the_summary_shows_runs_instead_of_an_interval_and_states_the_level_once(tmp_path):
    report.write_report(designs.two_by_two(tmp_path / "r"), tmp_path / "out", 0.9)
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| 256 | 1 | 2 | 1,826.2 | runs: 2,900.0, 1,150.0 | 61.1 % | - | - | 0 |" in text
    assert "| mlp | batch 256 | 0 | 1 | 2 | 62% | none (n < 3) |" in text
    assert text.count("fewer than 3 runs has no interval") == 1 and "90% interval" in text
    assert "--isolate) each run is its own launch" not in text and "by default the job's processes start once" in text
    assert not re.search(r"\| -[0-9]", text)  # no negative number in any table


def test_a_level_where_every_run_timed_out_is_still_on_the_axis(tmp_path):
    records = [designs.record(f"r{i:03d}", delay_ms=d, repeat=rep, ips=None if d == 1000 else 2000 / (1 + d / 10),
                              status="timeout" if d == 1000 else "ok")
               for i, (d, rep) in enumerate((d, r) for d in (1, 10, 100, 1000) for r in range(3))]
    fig = report.build_metric_figure(groups_of(designs.write_results(tmp_path / "r", records)), report.THROUGHPUT,
                                     "latency_ms", LEVEL)
    looks_right(fig, 1)  # the three crosses at 1000 ms inside the axes
    crosses = [c for c in fig.axes[0].collections if c.get_gid() == "timeout"]
    assert len(crosses) == 1 and len(crosses[0].get_offsets()) == 3
    assert fig.axes[0].get_xlim()[1] > 1000
