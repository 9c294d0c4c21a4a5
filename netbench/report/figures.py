"""Figures (matplotlib, Agg backend): any Measure against any factor, one panel per model
(or another factor), as papers print them.

A numeric factor (latency, bandwidth, loss, batch, workers, scale, an algorithm's setting such as
staleness) is a numeric axis,
logarithmic where its positive levels span 10x or more, with a line and markers per series;
a categorical one (strategy, data, topology) gets grouped bars. The centre of a point is its
Measure's (geometric mean for positive values, mean for shares), whiskers its interval
(none under MIN_RUNS runs), the runs are black dots on their own marker or bar, timeouts red
crosses at the foot of the axes, runs that never reached the target accuracy (time to target)
open triangles at the top, one per run, never a bar of zero. The y axis comes from the data, logarithmic where the
values span 10x or more. matplotlib's constrained layout places titles, labels and the
legend inside a fixed-size figure (PANEL_PX per panel), so it can be checked; nothing is
placed by hand. A companion value (predicted beside measured) is a dashed line.

build_* functions return the Figure (tests look at its artists); save_figure writes a PNG.
matplotlib is imported only when a figure is drawn (an optional extra).
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from netbench.report.groups import NETWORK, Efficiency, Group, baseline_slice, networked, series_label, varying
from netbench.report.load import ALGORITHM_SHORT, OWN_SETTINGS, ReportError, algorithm_text
from netbench.report.measures import IDLENESS, THROUGHPUT, Measure
from netbench.stats import MIN_RUNS

# the words on a factor's axis, with its unit
AXIS_LABELS = {"latency_ms": "one-way latency at each node (ms)", "bandwidth_mbit": "bandwidth per node (Mbit/s)",
               "loss_pct": "packet loss at each node's egress (%)", "jitter_ms": "jitter (ms)",
               "scale": "topology scale (x every delay)", "batch": "batch size per worker",
               "workers": "workers N (processes, one per node)", "ps": "parameter servers",
               "accum_steps": "local batches per all-reduce", "strategy": "strategy", "model": "model",
               "data": "data", "framework": "framework", "topology": "topology",
               "staleness": "staleness bound (ps-ssp, steps)", "tau": "local steps between exchanges (easgd tau)",
               "elastic_alpha": "elastic moving rate (easgd alpha)", "gossip_p": "push probability (gosgd p)",
               "backup_workers": "backup workers (ps-sync)",
               "pipeline": "pushes unanswered (ps-async pipeline)"}
PANEL_PX = (520, 440)  # width, height of one panel in pixels (figures are DPI 100)
DPI = 100
SERIES_OFFSET_PT = 5  # series at one level of a numeric factor sit this far apart (points), whiskers apart


@dataclass(frozen=True)
class Point:
    """One marker or bar: a design point's centre and interval in display units, its runs,
    its timeouts and an optional companion value (predicted)."""

    panel: str
    series: str
    x: Any
    centre: float | None
    low: float | None
    high: float | None
    runs: tuple[float, ...]
    timeouts: int = 0
    companion: float | None = None
    unreached: int = 0  # runs that never reached the target accuracy (Measure.to_target): no value


def axis_scale(levels: Iterable[float]) -> str:
    """'log' when positive levels span a decade or more, 'symlog' when they do and 0 is a
    level too (loss 0/1/10 %), else 'linear'."""
    levels = sorted(set(levels))
    positive = [v for v in levels if v > 0]
    if len(positive) < 2 or positive[-1] / positive[0] < 10:
        return "linear"
    return "symlog" if levels[0] <= 0 else "log"


def value_scale(values: Iterable[float]) -> str:
    """'log' for a value axis whose positive values span 10x or more, else 'linear'."""
    positive = [v for v in values if v > 0]
    return "log" if positive and max(positive) / min(positive) >= 10 else "linear"


def strategy_text(g: Group) -> str:
    """A strategy with the setting that makes it what it is: 'ps (1 ps)', 'allreduce-accum (k=4)',
    'ps-ssp (s=3)', 'easgd (tau=4, alpha=0.45)', 'gosgd (p=0.1)' (where the runs record them)."""
    extra = {"allreduce-accum": f" (k={g.get('accum_steps')})", "ps": f" ({g.get('ps')} ps)"}
    own = algorithm_text({name: g.get(name) for name, _ in ALGORITHM_SHORT})
    return str(g.get("strategy")) + extra.get(str(g.get("strategy")), f" ({own})" if own else "")


def is_numeric(levels: Iterable[Any]) -> bool:
    """Whether a factor's levels go on a numeric axis (numbers, not names; bandwidth's
    None, unlimited, has no place on one)."""
    levels = list(levels)
    return bool(levels) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in levels)


def pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ReportError("netbench report needs matplotlib and scipy",
                          hint="pip install -c constraints.txt -e '.[report]' (make install does)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def points_for(groups: Sequence[Group], measure: Measure, x: str, confidence: float,
               panel: str = "model") -> list[Point]:
    """The points of `measure` against factor `x`: one per group with a level of `x` and a
    value or a timeout; series are the other factors that vary (but `panel`)."""
    picked = [g for g in groups if g.get(x) is not None and (measure.values(g) or g.timeouts
                                                              or measure.unreached(g))]
    # along strategy, a strategy's own settings (ps count, k) are part of the level, not a series
    own = OWN_SETTINGS if x == "strategy" else ()
    series = [s for s in varying(picked) if s not in (x, panel, *own)]
    out = []
    for g in picked:
        i = measure.interval(g, confidence)
        level = g.get(x) if not own else strategy_text(g)
        # one series along strategy: no legend entry (series_label would name the strategy)
        label = series_label(g, series) if series or not own else "_nolegend_"
        out.append(Point(panel=str(g.get(panel)), series=label, x=level,
                         centre=None if i is None else i.mean, low=None if i is None else i.low,
                         high=None if i is None else i.high, runs=tuple(measure.values(g)), timeouts=g.timeouts,
                         companion=measure.companion_value(g), unreached=measure.unreached(g)))
    return out


def caption(measure: Measure, confidence: float, bars: bool = False) -> str:
    """What the marks mean, once per figure."""
    shape = "bars" if bars else "markers"
    reached = (" that reached the target; open triangles at the top: a run that never reached it"
               if measure.to_target else "")
    return (f"{shape}: {measure.centre_words()} of the runs{reached}; whiskers: {confidence:.0%} interval over "
            f"repetitions ({'logit' if measure.domain == 'share' else 'log'}-scale t); dots: runs; "
            f"no whiskers: fewer than {MIN_RUNS} runs")


def build_figure(points: Sequence[Point], *, x_label: str, y_label: str, title: str, note: str = "",
                 log_ok: bool = True, reference: float | None = None, companion_label: str = "predicted",
                 panel_name: str = "model", zoom: bool = False):
    """A figure of `points`: one panel per distinct Point.panel (titled `panel_name` and its
    level), lines and markers when every x is a number, grouped bars otherwise; `note` (what
    the marks mean) heads the legend below the panels. `reference`: a dashed grey line (100 %)."""
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    panels = sorted({p.panel for p in points})
    fig = plt.figure(figsize=(PANEL_PX[0] * len(panels) / DPI, PANEL_PX[1] / DPI), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    fig.suptitle("\n".join(textwrap.wrap(title, width=60 * len(panels))), fontsize=11)
    labels = list(dict.fromkeys(p.series for p in points))
    numeric = is_numeric({p.x for p in points})
    # one y scale for every panel (log where any panel's values span 10x), so they compare at a glance
    log_y = log_ok and any(value_scale(v for p in points if p.panel == name
                                       for v in (p.centre, p.low, p.high, p.companion, *p.runs) if v is not None)
                           == "log" for name in panels)
    for ax, name in zip(axes, panels):
        mine = [p for p in points if p.panel == name]
        every = [v for p in mine for v in (p.centre, p.low, p.high, p.companion, *p.runs) if v is not None]
        (_draw_lines if numeric else _draw_bars)(fig, ax, mine, labels, log_y)
        if reference is not None:
            ax.axhline(reference, color="grey", linestyle="--", linewidth=1, label="ideal")
        if log_y:
            ax.set_yscale("log")
            # ticks at 1-2-3-5 of each decade, written as numbers (3,000 rather than 3 x 10^3)
            ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 3.0, 5.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 10 else f"{v:.3g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
            if not numeric:  # the bars' feet on the axis' bottom
                ax.set_ylim(bottom=bar_base(points))
        elif min(every, default=0) >= 0 and not (zoom and numeric):
            # from zero, with the margin above the highest mark recomputed for the taller range
            # (else a mark at the top sits on the frame)
            ax.set_ylim(0, max(ax.get_ylim()[1], 1.05 * max(every, default=0)))
        if reference is not None:  # the reference line in view with room above it, not on the frame
            ax.set_ylim(top=max(ax.get_ylim()[1], 1.1 * reference))
        if any(p.unreached for p in mine) and every:
            _headroom(ax, max(every), log_y)
        ax.set_title(f"{panel_name} {name}", fontsize=10)
        ax.set_xlabel(x_label + (f" ({ax.get_xscale()} scale)" if ax.get_xscale() != "linear" else ""), fontsize=9)
        ax.set_ylabel(y_label + (" (log scale)" if log_y else ""), fontsize=9)
        ax.tick_params(labelsize=8)
    handles = {}
    for ax in axes:
        handles.update(zip(*reversed(ax.get_legend_handles_labels())))
    if any(p.companion is not None for p in points):
        from matplotlib.lines import Line2D

        handles[f"{companion_label} (dashed)"] = Line2D([], [], color="grey", linestyle="--")
    figure_legend(fig, handles, note, len(panels))
    return fig


def figure_legend(fig, handles: dict, note: str, columns: int) -> None:
    """The legend below the panels (`columns` of them side by side), headed by `note`, what the
    marks mean: constrained layout makes room for it, so it covers no data."""
    fig.legend(handles.values(), handles.keys(), loc="outside lower center", fontsize=8,
               ncols=max(1, min(len(handles), 2 * columns + 1)), frameon=False,
               title="\n".join(textwrap.wrap(note, width=80 * columns)), title_fontsize=8)


def _offsets(fig, count: int) -> list:
    """A transform offset per series (points, whatever the x scale), centred on the level."""
    from matplotlib.transforms import ScaledTranslation

    return [ScaledTranslation((i - (count - 1) / 2) * SERIES_OFFSET_PT / 72, 0, fig.dpi_scale_trans)
            for i in range(count)]


def _draw_lines(fig, ax, points: Sequence[Point], labels: Sequence[str], log_y: bool) -> None:
    from matplotlib.ticker import NullLocator
    from matplotlib.transforms import blended_transform_factory

    levels = sorted({p.x for p in points})
    scale = axis_scale(levels)
    ax.set_xscale(scale, **({"linthresh": min(v for v in levels if v > 0), "linscale": 0.5}
                            if scale == "symlog" else {}))
    offsets = _offsets(fig, len(labels))
    for i, label in enumerate(labels):
        colour, shift = f"C{i % 10}", ax.transData + offsets[i]
        mine = sorted((p for p in points if p.series == label), key=lambda p: p.x)
        drawn = [p for p in mine if p.centre is not None]
        ax.plot([p.x for p in drawn], [p.centre for p in drawn], marker="o", markersize=6, color=colour,
                label=label, transform=shift, gid="centre", zorder=2)
        with_ci = [p for p in drawn if p.low is not None]
        if with_ci:
            ax.errorbar([p.x for p in with_ci], [p.centre for p in with_ci],
                        yerr=[[p.centre - p.low for p in with_ci], [p.high - p.centre for p in with_ci]],
                        fmt="none", ecolor=colour, elinewidth=1.2, capsize=3, transform=shift, gid="interval")
        runs = [(p.x, v) for p in drawn for v in p.runs]
        if runs:
            ax.scatter(*zip(*runs), s=14, color=colour, edgecolors="black", linewidths=0.6, zorder=3,
                       transform=shift, gid="runs")
        predicted = [p for p in mine if p.companion is not None]
        if predicted:
            ax.plot([p.x for p in predicted], [p.companion for p in predicted], linestyle="--", color=colour,
                    transform=shift, gid="companion")
        across = blended_transform_factory(ax.transData + offsets[i], ax.transAxes)
        _timeouts(ax, [p.x for p in mine for _ in range(p.timeouts)], across)
        _unreached(ax, [(p.x, p.unreached) for p in mine], across)
    # artists drawn through an offset transform do not widen the data limits: give them the values
    values = [(p.x, v) for p in points for v in (p.centre, p.low, p.high, p.companion, *p.runs) if v is not None]
    anchor = values[0][1] if values else 1.0  # a level with only timeouts still needs its place on x
    ax.update_datalim(values + [(p.x, anchor) for p in points])
    ax.autoscale_view()
    ax.set_xticks(levels, [f"{v:g}" for v in levels])
    ax.xaxis.set_minor_locator(NullLocator())  # the levels are the ticks
    ax.margins(x=0.08)


def bar_base(points: Sequence[Point]) -> float:
    """Where bars stand on a log axis: the decade boundary at or below the lowest value drawn
    (a bar's top is its value, read on the axis; its foot is the axis' bottom, not zero)."""
    lowest = min((v for p in points for v in (p.centre, p.low, p.companion, *p.runs) if v is not None and v > 0),
                 default=1.0)
    return 10.0 ** math.floor(math.log10(lowest))


def _draw_bars(fig, ax, points: Sequence[Point], labels: Sequence[str], log_y: bool) -> None:
    from matplotlib.transforms import blended_transform_factory

    levels = list(dict.fromkeys(p.x for p in sorted(points, key=lambda p: str(p.x))))
    width = 0.8 / len(labels)
    base = bar_base(points) if log_y else 0.0
    for i, label in enumerate(labels):
        colour = f"C{i % 10}"
        mine = [p for p in points if p.series == label]
        where = {id(p): levels.index(p.x) + (i - (len(labels) - 1) / 2) * width for p in mine}
        drawn = [p for p in mine if p.centre is not None]
        ax.bar([where[id(p)] for p in drawn], [p.centre - base for p in drawn], bottom=base, width=width,
               color=colour, alpha=0.7, label=label, gid="bar")
        with_ci = [p for p in drawn if p.low is not None]
        if with_ci:
            ax.errorbar([where[id(p)] for p in with_ci], [p.centre for p in with_ci],
                        yerr=[[p.centre - p.low for p in with_ci], [p.high - p.centre for p in with_ci]],
                        fmt="none", ecolor="black", elinewidth=1.2, capsize=3, gid="interval")
        runs = [(where[id(p)], v) for p in drawn for v in p.runs]
        if runs:
            ax.scatter(*zip(*runs), s=9, color="black", zorder=3, gid="runs")
        predicted = [p for p in drawn if p.companion is not None]
        for p in predicted:
            ax.hlines(p.companion, where[id(p)] - width / 2, where[id(p)] + width / 2, colors=colour,
                      linestyles="--", gid="companion")
        across = blended_transform_factory(ax.transData, ax.transAxes)
        _timeouts(ax, [where[id(p)] for p in mine for _ in range(p.timeouts)], across)
        _unreached(ax, [(where[id(p)], p.unreached) for p in mine], across)
    ax.set_xticks(range(len(levels)), [str(v) for v in levels])
    ax.set_xlim(-0.5, len(levels) - 0.5)  # every level in view, a bar's or a timeout's


def _timeouts(ax, xs: Sequence[float], transform) -> None:
    if xs:
        ax.scatter(xs, [0.04] * len(xs), transform=transform, marker="x", s=50, color="red", zorder=4,
                   label="timeout (no value)", gid="timeout")


UNREACHED_STACK = 4  # triangles stacked at one level; more are one triangle and their count


def _unreached(ax, counts: Sequence[tuple[float, int]], transform) -> None:
    """One open triangle per run that never reached the target, stacked down from the top of
    the axes at its level: off the scale, as its time is (there is no value to draw)."""
    xy = [(x, 0.95 - 0.04 * k) for x, n in counts for k in range(n if n <= UNREACHED_STACK else 1)]
    if xy:
        ax.scatter(*zip(*xy), transform=transform, marker="^", s=40, facecolors="white", edgecolors="black",
                   linewidths=1, zorder=4, label="run that never reached the target", gid="unreached")
    for x, n in counts:
        if n > UNREACHED_STACK:
            ax.text(x, 0.89, f"x{n}", transform=transform, ha="center", va="center", fontsize=7, gid="unreached")


def _headroom(ax, highest: float, log_y: bool, share: float = 0.75) -> None:
    """Raise the top of the y axis so the data stay in its lower `share`, below the triangles."""
    bottom, top = ax.get_ylim()
    if log_y and bottom > 0 and highest > 0:
        needed = 10 ** (math.log10(bottom) + (math.log10(highest) - math.log10(bottom)) / share)
    else:
        needed = bottom + (highest - bottom) / share
    ax.set_ylim(top=max(top, needed))


def save_figure(fig, path: Path) -> Path:
    """Write `fig` as a PNG at DPI and free it."""
    fig.savefig(path, dpi=DPI)
    pyplot().close(fig)
    return path


def build_metric_figure(groups: Sequence[Group], measure: Measure, x: str, confidence: float,
                        panel: str = "model", baseline: bool = True):
    """`measure` against factor `x` through the baseline slice (the best level of every other
    network factor; `baseline=False`: every network point, each a series), networked groups
    only, one panel per level of `panel`."""
    picked = [g for g in networked(baseline_slice(groups, x) if baseline else groups) if g.get(x) is not None]
    points = points_for(picked, measure, x, confidence, panel)
    if not points:
        raise ReportError(f"no {measure.label} to draw against {x}")
    words = AXIS_LABELS.get(x, x)
    numeric = is_numeric({p.x for p in points})
    # log where the values span 10x (lines and bars alike: on a linear axis the short bars of
    # such a figure read as nothing); bars then stand on the axis' bottom, a decade boundary
    log_ok = measure.domain == "positive"
    every = "" if baseline else ", every network point"
    return build_figure(points, x_label=words, y_label=measure.axis_label, log_ok=log_ok,
                        title=f"{measure.label.split(':')[0]} against {words.split(' (')[0]}{every}",
                        note=caption(measure, confidence, bars=not numeric),
                        panel_name=panel, zoom=measure.zoom,
                        companion_label=measure.companion_label)


def metric_figure(groups: Sequence[Group], measure: Measure, x: str, path: Path, confidence: float,
                  panel: str = "model", baseline: bool = True) -> Path:
    """build_metric_figure, written to `path`."""
    return save_figure(build_metric_figure(groups, measure, x, confidence, panel, baseline), path)


def throughput_figure(groups: Sequence[Group], x: str, path: Path, confidence: float) -> Path:
    """Throughput against factor `x`, one panel per model (baseline slice)."""
    return metric_figure(groups, THROUGHPUT, x, path, confidence)


def idleness_figure(groups: Sequence[Group], x: str, path: Path, confidence: float) -> Path:
    """Idleness (share of a step spent waiting on the network) against factor `x`."""
    return metric_figure(groups, IDLENESS, x, path, confidence)


def build_efficiency_figure(effs: Sequence[Efficiency], confidence: float):
    """Scaling efficiency (%) against the number of workers, one panel per model; 100 % ideal."""
    groups = [e.group for e in effs]
    series = [s for s in varying(groups) if s not in ("workers", "model") and s not in NETWORK]
    points = [Point(panel=str(e.group.get("model")), series=series_label(e.group, series), x=e.group.get("workers"),
                    centre=100 * e.interval.mean, low=None if e.interval.low is None else 100 * e.interval.low,
                    high=None if e.interval.high is None else 100 * e.interval.high,
                    runs=tuple(100 * v for v in e.values)) for e in effs]
    return build_figure(points, x_label=AXIS_LABELS["workers"], y_label="scaling efficiency (%)", log_ok=False,
                        reference=100.0,
                        title="scaling efficiency = measured / (N x single-process throughput)",
                        note=f"markers: ratio of geometric means; whiskers: {confidence:.0%} Welch interval on "
                             f"log throughput; dots: runs; no whiskers: fewer than {MIN_RUNS} runs on a side")


def efficiency_figure(effs: Sequence[Efficiency], path: Path, confidence: float) -> Path:
    return save_figure(build_efficiency_figure(effs, confidence), path)
