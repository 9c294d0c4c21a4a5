"""Accuracy curves: held-out accuracy against training step or wall time, read from the run
records (an Observation's `curve`), one panel per network point and one colour per algorithm,
as the papers on distributed training draw them; and the spread between the workers' models
against step (the largest minus the smallest worker's accuracy at each evaluation: the
divergence paper 003 blames for decentralised training's accuracy loss).

The core is pure: `curve_spec` turns observations into a frozen `CurveFigure` (its curves,
labels, target and caption); `draw_curve_figure` is the edge that draws one with matplotlib in
the report's style (figures.py: fixed panel size, constrained layout, the legend below the
panels headed by what the marks mean). A point's line is thick, with a marker and a dash
pattern of its algorithm's own (so lines that coincide, as synchronous algorithms' do against
step, both show): the mean of its repetitions at each evaluation (its x the mean of theirs:
evaluations come at the same steps, not at the same seconds), or its one run; where it has two
or more repetitions each run is a thin line beside it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from netbench.report.figures import DPI, PANEL_PX, pyplot, figure_legend, save_figure
from netbench.report.groups import NETWORK, series_label, varying
from netbench.report.load import FACTORS, Observation, ReportError

# a curve's y: accuracy or the spread between workers, in percentage points
CURVE_Y = ("accuracy", "spread")
# a curve's x: the reference worker's evaluation (netbench.jobs.accuracy.CurvePoint), with its words
CURVE_X = {"step": ("training step", "training steps (worker 0's)"),
           "wall_s": ("wall time", "wall time from the first step (s, evaluations included)"),
           "train_s": ("training time", "training time (s, evaluations excluded)")}
NETWORK_POINT = (*NETWORK, "topology")
PANELS_PER_ROW = 3
# each series' own marker and dash pattern: lines that coincide stay visible, and print in grey
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
DASHES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (3, 1)), (0, (1, 1)))


@dataclass(frozen=True)
class Curve:
    """One line: a point's (`centre`: the mean of its `runs` repetitions at each evaluation, or
    its one run) or one run's of a point of several (thin); accuracy in percent."""

    panel: str
    series: str
    x: tuple[float, ...]
    accuracy_pct: tuple[float, ...]
    runs: int = 1
    centre: bool = False


@dataclass(frozen=True)
class CurveFigure:
    """Everything a curve figure shows, before anything is drawn."""

    title: str
    x_label: str
    y_label: str
    note: str
    panels: tuple[str, ...]  # in order, one per network point
    series: tuple[str, ...]  # in order: the colours C0, C1, ...
    curves: tuple[Curve, ...]
    target_pct: float | None = None


def network_text(o: Observation, shown: Sequence[str]) -> str:
    """A network point in words, e.g. 'latency 20 ms, bandwidth unlimited'."""
    words = {"latency_ms": "latency {:g} ms", "bandwidth_mbit": "bandwidth {:g} Mbit/s", "loss_pct": "loss {:g} %",
             "jitter_ms": "jitter {:g} ms", "scale": "scale {:g}", "topology": "topology {}"}
    parts = []
    for name in shown:
        value = o.get(name)
        parts.append("bandwidth unlimited" if name == "bandwidth_mbit" and value is None
                     else words[name].format(value))
    return ", ".join(parts)


def _network_key(o: Observation, shown: Sequence[str]) -> tuple:
    return tuple((o.get(n) is None, o.get(n) if isinstance(o.get(n), (int, float)) else str(o.get(n)))
                 for n in shown)


def curve_runs(observations: Sequence[Observation]) -> list[Observation]:
    """The ok runs with an accuracy curve."""
    return [o for o in observations if o.status == "ok" and o.curve]


def spread_runs(observations: Sequence[Observation]) -> list[Observation]:
    """The ok runs whose curve has a spread (several evaluating workers); none where no
    run's workers ever disagreed (then there is nothing to draw)."""
    runs = [o for o in curve_runs(observations) if any(p.spread is not None for p in o.curve)]
    return runs if any(p.spread for o in runs for p in o.curve) else []


def _y_of(o: Observation, x: str, y: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(x, y in percent) of a run's curve; the spread's points where it has one."""
    points = [p for p in o.curve if y == "accuracy" or p.spread is not None]
    values = [p.accuracy if y == "accuracy" else p.spread for p in points]
    return tuple(float(getattr(p, x)) for p in points), tuple(100 * v for v in values)


def _mean(runs: Sequence[Curve]) -> Curve:
    """The runs' mean at each evaluation index that every one of them reached."""
    length = min(len(c.x) for c in runs)
    return Curve(panel=runs[0].panel, series=runs[0].series, runs=len(runs), centre=True,
                 x=tuple(statistics.fmean(c.x[k] for c in runs) for k in range(length)),
                 accuracy_pct=tuple(statistics.fmean(c.accuracy_pct[k] for c in runs) for k in range(length)))


def curve_spec(observations: Sequence[Observation], x: str = "wall_s", y: str = "accuracy") -> CurveFigure:
    """Accuracy (or with y="spread" the spread between workers) against `x` (a CURVE_X key)
    for every ok run with a curve: a panel per network point (the network factors that vary;
    the one point's latency if none does), a series per algorithm (and whatever else varies:
    workers, model, ...)."""
    if x not in CURVE_X:
        raise ValueError(f"x: one of {', '.join(CURVE_X)}, got {x!r}")
    if y not in CURVE_Y:
        raise ValueError(f"y: one of {', '.join(CURVE_Y)}, got {y!r}")
    runs = curve_runs(observations) if y == "accuracy" else spread_runs(observations)
    if not runs:
        raise ReportError("no accuracy curve to draw (an accuracy run: --train-steps with --eval-every)"
                          if y == "accuracy" else "no spread to draw (no run's workers disagreed)")
    shown = [n for n in NETWORK_POINT if len({o.get(n) for o in runs}) > 1] or \
        (["topology", "scale"] if runs[0].get("topology") else ["latency_ms"])
    kinds = [f for f in FACTORS if f not in NETWORK_POINT]
    series_of = [f for f in varying(runs, kinds) if f not in ("ps", "accum_steps")] or ["strategy"]
    # colours in the order the runs were made, as the report's other figures give them
    series = tuple(dict.fromkeys(series_label(o, series_of) for o in runs))
    runs = sorted(runs, key=lambda o: (_network_key(o, shown), series.index(series_label(o, series_of)), o.repeat,
                                       o.run_id))
    lines = [Curve(panel=network_text(o, shown), series=series_label(o, series_of), x=xs, accuracy_pct=ys)
             for o in runs for xs, ys in [_y_of(o, x, y)]]
    by_line: dict[tuple[str, str], list[Curve]] = {}
    for c in lines:
        by_line.setdefault((c.panel, c.series), []).append(c)
    centres = tuple(_mean(cs) for cs in by_line.values())
    thin = tuple(c for cs in by_line.values() if len(cs) > 1 for c in cs)
    targets = {o.target_accuracy for o in runs if o.target_accuracy is not None} if y == "accuracy" else set()
    short, words = CURVE_X[x]
    repeated = max(len(cs) for cs in by_line.values()) > 1
    what = ("worker 0's held-out accuracy at each evaluation (easgd: the centre variable's)" if y == "accuracy" else
            "the best minus the worst worker's held-out accuracy at each evaluation (0: every worker holds the "
            "same model; easgd: the replicas')")
    note = (what + "; thick lines with markers: "
            + ("the mean of a point's repetitions at each evaluation" + (" (x: the mean of their times)"
                                                                        if x != "step" else "")
               + "; thin lines: each run" if repeated else "each point's one run")
            + ("; grey dashes: the target accuracy" if targets else ""))
    title = "test accuracy" if y == "accuracy" else "spread between the workers' models"
    return CurveFigure(title=f"{title} against {short}, per algorithm and network point",
                       x_label=words, note=note,
                       y_label="test accuracy (%)" if y == "accuracy" else "spread: best - worst worker (points)",
                       panels=tuple(dict.fromkeys(c.panel for c in lines)),
                       series=series, curves=(*thin, *centres),
                       target_pct=100 * max(targets) if len(targets) == 1 else None)


def draw_curve_figure(spec: CurveFigure):
    """The figure of `spec`: panels in rows of PANELS_PER_ROW, one shared scale for both
    axes so panels compare at a glance; every axis labelled in each panel of the edge."""
    plt = pyplot()
    columns = min(PANELS_PER_ROW, len(spec.panels))
    rows = math.ceil(len(spec.panels) / columns)
    fig = plt.figure(figsize=(PANEL_PX[0] * columns / DPI, PANEL_PX[1] * rows / DPI), dpi=DPI, layout="constrained")
    grid = fig.subplots(rows, columns, squeeze=False, sharex=True, sharey=True)
    fig.suptitle(spec.title, fontsize=11)
    cells = [ax for row in grid for ax in row]
    for ax in cells[len(spec.panels):]:
        ax.remove()  # an empty cell of the last row
    values = [v for c in spec.curves for v in c.accuracy_pct]
    if spec.target_pct is not None:
        values.append(spec.target_pct)
    low, high = min(values), max(values)
    pad = max(2.0, 0.05 * (high - low))
    right = max(v for c in spec.curves for v in c.x)
    for index, (ax, name) in enumerate(zip(cells, spec.panels)):
        for c in (c for c in spec.curves if c.panel == name):
            k = spec.series.index(c.series)
            colour = f"C{k % 10}"
            if c.centre:
                ax.plot(c.x, c.accuracy_pct, color=colour, linewidth=2, linestyle=DASHES[k % len(DASHES)],
                        marker=MARKERS[k % len(MARKERS)], markersize=5, gid="mean", label=c.series, zorder=3)
            else:
                ax.plot(c.x, c.accuracy_pct, color=colour, linewidth=0.8, alpha=0.5, gid="curve", zorder=2)
        if spec.target_pct is not None:
            ax.axhline(spec.target_pct, color="grey", linestyle="--", linewidth=1, gid="target",
                       label=f"target {spec.target_pct:g} %")
        # one scale for every panel, set once the data are known (a shared axis set earlier stops autoscaling)
        ax.set_ylim(max(0.0, low - pad), min(100.0, high + pad))
        ax.set_xlim(0, 1.03 * right)
        ax.set_title(name, fontsize=10)
        if index % columns == 0:
            ax.set_ylabel(spec.y_label, fontsize=9)
        if index + columns >= len(spec.panels):  # nothing below it: the bottom of its column
            ax.set_xlabel(spec.x_label, fontsize=9)
            ax.xaxis.set_tick_params(labelbottom=True)
        ax.tick_params(labelsize=8)
        ax.grid(True, linewidth=0.4, alpha=0.5)
    handles: dict[str, Any] = {}
    for ax in cells[:len(spec.panels)]:
        handles.update(zip(*reversed(ax.get_legend_handles_labels())))
    ordered = {s: handles[s] for s in spec.series if s in handles}
    ordered.update((k, v) for k, v in handles.items() if k not in ordered)
    figure_legend(fig, ordered, spec.note, columns)
    return fig


def curve_figure(observations: Sequence[Observation], x: str, path: Path, y: str = "accuracy") -> Path:
    """curve_spec drawn and written to `path` as a PNG."""
    return save_figure(draw_curve_figure(curve_spec(observations, x, y)), path)
