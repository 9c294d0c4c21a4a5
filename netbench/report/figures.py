"""Figures (matplotlib, Agg backend, fixed sizes: PANEL_PX per panel at DPI, so they can be
checked): throughput, idleness and scaling efficiency against a factor, one panel per model.

Bars are group means with interval whiskers, single observations are dots, timed-out runs
red crosses. matplotlib is imported only when a figure is drawn (an optional extra).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Iterable, Sequence

from netbench.report.groups import NETWORK, Efficiency, Group, baseline_slice, idleness_values, networked, \
    series_label, varying
from netbench.report.load import ReportError
from netbench.stats import t_interval

# the network factors each get a throughput figure; the label says the unit
AXIS_LABELS = {"latency_ms": "one-way latency at each node (ms)", "bandwidth_mbit": "bandwidth per node (Mbit/s)",
               "loss_pct": "packet loss at each node's egress (%)", "jitter_ms": "jitter (ms)",
               "scale": "topology scale (x every delay)"}
PANEL_PX = (520, 420)  # width, height of one panel in pixels (figures are DPI 100)
DPI = 100


def axis_scale(levels: Iterable[float]) -> str:
    """'log' when positive levels span a decade or more, 'symlog' when they do and 0 is a
    level too (loss 0/1/10 %), else 'linear'."""
    levels = sorted(set(levels))
    positive = [v for v in levels if v > 0]
    if len(positive) < 2 or positive[-1] / positive[0] < 10:
        return "linear"
    return "symlog" if levels[0] <= 0 else "log"


def value_scale(values: Iterable[float]) -> str:
    """'log' for a throughput axis whose runs span two decades or more (the slow points
    would be invisible bars on a linear axis), else 'linear'."""
    positive = [v for v in values if v > 0]
    return "log" if positive and max(positive) / min(positive) >= 100 else "linear"


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ReportError("netbench report needs matplotlib and scipy",
                          hint="pip install -c constraints.txt -e '.[report]' (make install does)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bar_edges(ax, level: float, offset: float, width: float) -> tuple[float, float, float]:
    """Left edge, width and centre in data units of a bar placed in the axis' own (possibly
    log) coordinates: the level shifted by `offset`, `width` wide, both in transformed units."""
    transform = ax.xaxis.get_transform()
    inverse = transform.inverted()
    t = transform.transform([level])[0] + offset
    left, right, centre = (float(inverse.transform([v])[0]) for v in (t - width / 2, t + width / 2, t))
    return left, right - left, centre


def _panels(plt, count: int, title: str):
    fig, axes = plt.subplots(1, count, figsize=(PANEL_PX[0] * count / DPI, PANEL_PX[1] / DPI), dpi=DPI,
                             squeeze=False)
    lines = textwrap.wrap(title, width=60 * count)  # one panel holds ~60 characters of title
    fig.suptitle("\n".join(lines), fontsize=11 if len(lines) == 1 else 10)
    fig.subplots_adjust(left=0.1 / count + 0.02, right=0.98, bottom=0.15, top=0.84 - 0.05 * (len(lines) - 1),
                        wspace=0.3)
    return fig, axes[0]


def _draw_bars(ax, groups: Sequence[Group], x: str, series: Sequence[str], value=lambda g: g.interval,
               dots=lambda g: g.values) -> None:
    """Mean bars with CI whiskers and single observations as dots; timeouts as red crosses."""
    levels = sorted({g.get(x) for g in groups})
    ax.set_xscale(axis_scale(levels), **({"linthresh": min(v for v in levels if v > 0)}
                                          if axis_scale(levels) == "symlog" else {}))
    ax.set_xlim(*_padded(ax, levels))
    labels = list(dict.fromkeys(series_label(g, series) for g in groups))
    transform = ax.xaxis.get_transform()
    t_levels = sorted(transform.transform(levels))
    gap = min((b - a for a, b in zip(t_levels, t_levels[1:])), default=1.0)
    width = 0.8 * gap / len(labels)
    colours = [f"C{i % 10}" for i in range(len(labels))]
    timeout_drawn = False
    for g in groups:
        i = labels.index(series_label(g, series))
        left, w, centre = _bar_edges(ax, g.get(x), (i - (len(labels) - 1) / 2) * width, width)
        interval = value(g)
        if interval is not None:
            ax.bar(left, interval.mean, width=w, align="edge", color=colours[i], alpha=0.55, label=labels[i])
            if interval.half_width is not None:
                ax.errorbar([centre], [interval.mean], yerr=[interval.half_width], fmt="none", ecolor="black",
                            capsize=3, linewidth=1)
            points = dots(g)
            ax.scatter([centre] * len(points), points, s=12, color="black", zorder=3)
        if g.timeouts:
            ax.scatter([centre] * g.timeouts, [0] * g.timeouts, marker="x", s=60, color="red", zorder=4,
                       clip_on=False, label=None if timeout_drawn else "timeout (no throughput)")
            timeout_drawn = True
    ax.set_xticks(levels)
    ax.set_xticklabels([f"{v:g}" for v in levels])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    handles, names = ax.get_legend_handles_labels()
    unique = dict(zip(names, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper right")


def _padded(ax, levels: Sequence[float]) -> tuple[float, float]:
    transform = ax.xaxis.get_transform()
    t = transform.transform(sorted(levels))
    pad = (t[-1] - t[0]) * 0.2 if len(t) > 1 else 1.0
    inverse = transform.inverted()
    return float(inverse.transform([t[0] - pad])[0]), float(inverse.transform([t[-1] + pad])[0])


def throughput_figure(groups: Sequence[Group], x: str, path: Path, confidence: float) -> Path:
    """Throughput against network factor `x`, one panel per model (baseline slice)."""
    plt = _pyplot()
    picked = [g for g in networked(baseline_slice(groups, x)) if g.get(x) is not None]
    models = sorted({g.get("model") for g in picked})
    series = [s for s in varying(picked) if s not in (x, "model")]
    fig, axes = _panels(plt, len(models), f"training throughput against {x.split('_')[0]} "
                        f"(bars: mean, whiskers: {confidence:.0%} CI over repetitions, dots: runs)")
    for ax, model in zip(axes, models):
        mine = [g for g in picked if g.get("model") == model]
        _draw_bars(ax, mine, x, series)
        ax.set_title(f"model {model}", fontsize=10)
        ax.set_xlabel(AXIS_LABELS[x] + (" (log scale)" if ax.get_xscale() != "linear" else ""), fontsize=8)
        values = [v for g in mine for v in g.values if v > 0]
        if value_scale(values) == "log":
            ax.set_yscale("log")
            ax.set_ylim(min(values) / 2, max(values) * 3)  # headroom for the legend
            ax.set_ylabel("throughput (images/s, log scale)", fontsize=8)
        else:
            ax.set_ylabel("throughput (images/s)", fontsize=8)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def efficiency_figure(effs: Sequence[Efficiency], path: Path, confidence: float) -> Path:
    """Scaling efficiency against the number of workers, one panel per model; 100 % is ideal."""
    plt = _pyplot()
    models = sorted({e.group.get("model") for e in effs})
    groups = [e.group for e in effs]
    series = [s for s in varying(groups) if s not in ("workers", "model") and s not in NETWORK]
    by_group = {e.group: e for e in effs}
    fig, axes = _panels(plt, len(models), f"scaling efficiency = measured / (N x single-process throughput); "
                        f"whiskers: {confidence:.0%} CI")
    for ax, model in zip(axes, models):
        mine = [g for g in groups if g.get("model") == model]

        _draw_bars(ax, mine, "workers", series, value=lambda g: by_group[g].interval.scaled(100), dots=lambda g: [100 * v for v in by_group[g].values])
        ax.axhline(100, color="grey", linestyle="--", linewidth=1)
        ax.text(ax.get_xlim()[0], 101, " ideal", fontsize=7, color="grey", va="bottom")
        ax.set_title(f"model {model}", fontsize=10)
        ax.set_xlabel("workers N (processes, one per node)", fontsize=8)
        ax.set_ylabel("scaling efficiency (%)", fontsize=8)
        ax.set_ylim(0, max(110, ax.get_ylim()[1]))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def idleness_figure(groups: Sequence[Group], x: str, path: Path, confidence: float) -> Path:
    """Idleness (share of a step spent waiting on the network) against network factor `x`,
    one panel per model, for the groups whose strategy reports it."""
    plt = _pyplot()
    picked = [g for g in networked(baseline_slice(groups, x)) if g.get(x) is not None and idleness_values(g)]
    models = sorted({g.get("model") for g in picked})
    series = [s for s in varying(picked) if s not in (x, "model")]
    fig, axes = _panels(plt, len(models), f"idleness against {x.split('_')[0]} "
                        f"(bars: mean, whiskers: {confidence:.0%} CI over repetitions, dots: runs)")
    for ax, model in zip(axes, models):
        _draw_bars(ax, [g for g in picked if g.get("model") == model], x, series,
                   value=lambda g: t_interval(idleness_values(g), confidence), dots=idleness_values)
        ax.set_title(f"model {model}", fontsize=10)
        ax.set_xlabel(AXIS_LABELS[x] + (" (log scale)" if ax.get_xscale() != "linear" else ""), fontsize=8)
        ax.set_ylabel("idleness: share of step waiting on the network (%)", fontsize=8)
        ax.set_ylim(0, 105)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
