"""Reports: a results folder -> tables, PNG figures and a markdown summary.

The statistics are small pure functions: runs are grouped by every factor but the
repetition, and a group's throughput is the mean over its repetitions with a confidence
interval from Student's t distribution (99 % by default). A group of one run has no
interval; its single observation is still drawn as a dot. Timed-out runs have no
throughput: they are counted and marked with a cross on the figures. Figures use
matplotlib's Agg backend and have fixed sizes (PANEL_PX per panel), so they can be checked.
"""

from __future__ import annotations

import json
import math
import statistics
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from rich.markup import escape

from netbench.errors import UsageError
from netbench.experiment.store import ResultStore

# factors a run can differ in, in the order tables show them
FACTORS = ("strategy", "model", "batch", "workers", "ps", "accum_steps", "data",
           "latency_ms", "bandwidth_mbit", "loss_pct", "jitter_ms")
NETWORK = ("latency_ms", "bandwidth_mbit", "loss_pct", "jitter_ms")
# the network factors each get a throughput figure; the label says the unit
AXIS_LABELS = {"latency_ms": "one-way latency at each node (ms)", "bandwidth_mbit": "bandwidth per node (Mbit/s)",
               "loss_pct": "packet loss at each node's egress (%)", "jitter_ms": "jitter (ms)"}
# a factor level is "better" for the network when latency/loss/jitter is lower, bandwidth higher
BEST_IS_LOW = {"latency_ms": True, "bandwidth_mbit": False, "loss_pct": True, "jitter_ms": True}
PANEL_PX = (520, 420)  # width, height of one panel in pixels (figures are DPI 100)
DPI = 100


class ReportError(UsageError):
    """A results folder that cannot be reported on."""


@dataclass(frozen=True)
class Observation:
    """One run: its factor levels, repetition, status and throughput (images/s, or None)."""

    run_id: str
    factors: tuple[tuple[str, Any], ...]
    repeat: int
    status: str
    images_per_sec: float | None
    idleness: float | None = None

    def get(self, name: str) -> Any:
        return dict(self.factors)[name]


@dataclass(frozen=True)
class Interval:
    """Mean of n values with a two-sided t interval [low, high]; None bounds when n < 2."""

    n: int
    mean: float
    low: float | None
    high: float | None
    confidence: float

    @property
    def half_width(self) -> float | None:
        return None if self.high is None else self.high - self.mean


@dataclass(frozen=True)
class Group:
    """The runs of one design point (every factor equal, repetitions differ)."""

    factors: tuple[tuple[str, Any], ...]
    observations: tuple[Observation, ...]
    interval: Interval | None  # None when no run of the point produced a throughput
    timeouts: int = 0
    failed: int = 0

    def get(self, name: str) -> Any:
        return dict(self.factors)[name]

    @property
    def values(self) -> list[float]:
        return [o.images_per_sec for o in self.observations if o.images_per_sec is not None]


@dataclass(frozen=True)
class Efficiency:
    """Scaling efficiency of a group: its throughput over N x the single-process baseline."""

    group: Group
    baseline: float  # mean images/s of the matching single-process runs
    interval: Interval  # over the group's repetitions, each divided by N x baseline
    values: tuple[float, ...]


@dataclass
class Written:
    observations: list[Observation]
    groups: list[Group]
    files: list[Path] = field(default_factory=list)


# ---------------------------------------------------------------- pure statistics

def t_quantile(p: float, df: int) -> float:
    """The p quantile of Student's t distribution with df degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(p, df))


def t_interval(values: Sequence[float], confidence: float = 0.99) -> Interval:
    """Mean and two-sided t confidence interval: mean +- t(1-a/2, n-1) x s / sqrt(n)."""
    if not values:
        raise ValueError("an interval needs at least one value")
    if not 0 < confidence < 1:
        raise ValueError("confidence must be between 0 and 1")
    n, mean = len(values), statistics.fmean(values)
    if n < 2:
        return Interval(n=n, mean=mean, low=None, high=None, confidence=confidence)
    half = t_quantile(1 - (1 - confidence) / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Interval(n=n, mean=mean, low=mean - half, high=mean + half, confidence=confidence)


@dataclass(frozen=True)
class Ratio:
    """A ratio of two groups' throughputs (speed-up, slow-down, efficiency) with its interval."""

    numerator: Group
    denominator: Group
    interval: Interval  # mean: ratio of geometric means; n: runs on the smaller side


def ratio_interval(numerator: Sequence[float], denominator: Sequence[float], confidence: float = 0.99,
                   scale: float = 1.0) -> Interval:
    """The ratio of two samples' geometric means (divided by `scale`) with a Welch t interval
    on the difference of their mean logs, so both sides' spread counts. With one value on
    either side there is no interval (its spread is unknown), only the ratio."""
    if not numerator or not denominator or min(numerator) <= 0 or min(denominator) <= 0:
        raise ValueError("a ratio needs positive values on both sides")
    if not 0 < confidence < 1:
        raise ValueError("confidence must be between 0 and 1")
    logs = [[math.log(v) for v in side] for side in (numerator, denominator)]
    centre = statistics.fmean(logs[0]) - statistics.fmean(logs[1]) - math.log(scale)
    n = min(len(numerator), len(denominator))
    if n < 2:
        return Interval(n=n, mean=math.exp(centre), low=None, high=None, confidence=confidence)
    terms = [(statistics.variance(side) / len(side), len(side) - 1) for side in logs]
    se2 = sum(v for v, _ in terms)
    if se2 == 0:
        return Interval(n=n, mean=math.exp(centre), low=math.exp(centre), high=math.exp(centre), confidence=confidence)
    df = se2 ** 2 / sum(v ** 2 / d for v, d in terms if v > 0)  # Welch-Satterthwaite
    half = t_quantile(1 - (1 - confidence) / 2, df) * math.sqrt(se2)
    return Interval(n=n, mean=math.exp(centre), low=math.exp(centre - half), high=math.exp(centre + half),
                    confidence=confidence)


def group_observations(observations: Iterable[Observation], confidence: float = 0.99) -> list[Group]:
    """One group per distinct set of factor levels, in first-seen order."""
    buckets: dict[tuple, list[Observation]] = {}
    for obs in observations:
        buckets.setdefault(obs.factors, []).append(obs)
    groups = []
    for factors, members in buckets.items():
        members.sort(key=lambda o: (o.repeat, o.run_id))
        values = [o.images_per_sec for o in members if o.images_per_sec is not None]
        groups.append(Group(factors=factors, observations=tuple(members),
                            interval=t_interval(values, confidence) if values else None,
                            timeouts=sum(o.status == "timeout" for o in members),
                            failed=sum(o.status not in ("ok", "timeout") for o in members)))
    return groups


def varying(items: Iterable[Observation | Group], names: Sequence[str] = FACTORS) -> list[str]:
    """The factors that take more than one value across `items`."""
    items = list(items)
    return [n for n in names if len({item.get(n) for item in items}) > 1]


def scaling_efficiency(groups: Sequence[Group], confidence: float = 0.99) -> list[Efficiency]:
    """Measured / (N x single-process throughput) for every multi-process group whose model,
    batch and data have single-strategy runs; N is the number of workers. The interval is
    ratio_interval's, so the baseline's run-to-run spread widens it too."""
    single: dict[tuple, list[float]] = {}
    for g in groups:
        if g.get("strategy") == "single":
            single.setdefault((g.get("model"), g.get("batch"), g.get("data")), []).extend(g.values)
    out = []
    for g in groups:
        base = single.get((g.get("model"), g.get("batch"), g.get("data")))
        if g.get("strategy") == "single" or not base or not g.values:
            continue
        baseline = statistics.geometric_mean(base)
        values = tuple(v / (g.get("workers") * baseline) for v in g.values)
        out.append(Efficiency(group=g, baseline=baseline, values=values,
                              interval=ratio_interval(g.values, base, confidence, scale=g.get("workers"))))
    return out


def baseline_slice(groups: Sequence[Group], x: str) -> list[Group]:
    """The groups at the best level of every network factor except `x`: the study's
    one-factor-at-a-time view through a factorial (e.g. latency at full bandwidth, no loss)."""
    keep = list(groups)
    for other in NETWORK:
        if other == x:
            continue
        levels = {g.get(other) for g in keep}
        if len(levels) > 1:
            if None in levels:  # only bandwidth is ever None: unlimited, the best there is
                best = None
            else:
                best = min(levels) if BEST_IS_LOW[other] else max(levels)
            keep = [g for g in keep if g.get(other) == best]
    return keep


def _networked(groups: Sequence[Group]) -> list[Group]:
    """Groups whose processes talk over the testbed's links (all but strategy single)."""
    return [g for g in groups if g.get("strategy") != "single"]


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


def percent(ratio: float) -> str:
    """A ratio as a percentage with enough digits to tell small ones apart (2.6 %, 45 %)."""
    return f"{ratio:.1%}" if abs(ratio) < 0.1 else f"{ratio:.0%}"


def series_label(group: Group, series: Sequence[str]) -> str:
    """A legend entry from the factors that distinguish series, e.g. 'allreduce, 2 workers'."""
    names = {"batch": "batch {}", "workers": "{} workers", "ps": "{} ps", "accum_steps": "accum {}",
             "data": "data {}", "strategy": "{}"}
    series = [s for s in series if group.get(s) is not None]  # e.g. accum_steps of a non-accum series

    def one(name: str) -> str:
        text = names.get(name, name + " {}").format(group.get(name))
        return text[:-1] if name == "workers" and group.get(name) == 1 else text  # "1 worker"

    return ", ".join(one(s) for s in series) or str(group.get("strategy"))


def slowdown(groups: Sequence[Group], x: str, confidence: float = 0.99) -> list[tuple[str, str, float, float, Interval]]:
    """(model, series, best level, worst level, worst / best as ratio_interval) for every
    series of the baseline slice along network factor `x` that has both ends measured."""
    picked = [g for g in _networked(baseline_slice(groups, x)) if g.interval is not None and g.get(x) is not None]
    series = [s for s in varying(picked) if s not in (x, "model")]
    out = []
    by_key: dict[tuple, list[Group]] = {}
    for g in picked:
        by_key.setdefault((g.get("model"), series_label(g, series)), []).append(g)
    for (model, label), members in by_key.items():
        if len({g.get(x) for g in members}) < 2:
            continue
        members.sort(key=lambda g: g.get(x), reverse=not BEST_IS_LOW[x])
        best, worst = members[0], members[-1]
        out.append((model, label, best.get(x), worst.get(x), ratio_interval(worst.values, best.values, confidence)))
    return out


REFERENCE_STRATEGY = "allreduce"  # speed-ups are against per-step synchronous all-reduce


def speedups(groups: Sequence[Group], confidence: float = 0.99) -> list[Ratio]:
    """Every networked strategy against per-step all-reduce at the same model, batch, workers,
    data and network point: its throughput / all-reduce's, with ratio_interval's interval."""
    tied = [f for f in FACTORS if f not in ("strategy", "ps", "accum_steps")]
    reference = {tuple(g.get(f) for f in tied): g for g in groups
                 if g.get("strategy") == REFERENCE_STRATEGY and g.values}
    out = []
    for g in _networked(groups):
        ref = reference.get(tuple(g.get(f) for f in tied))
        if g.get("strategy") == REFERENCE_STRATEGY or ref is None or not g.values:
            continue
        out.append(Ratio(numerator=g, denominator=ref, interval=ratio_interval(g.values, ref.values, confidence)))
    return out


def speedups_table(ratios: Sequence[Ratio]):
    from rich.table import Table

    groups = [r.numerator for r in ratios]
    shown = [f for f in varying(groups) if f not in ("strategy",)]
    table = Table(title=f"speed-up over per-step {REFERENCE_STRATEGY} (ratio of geometric means, "
                        f"{ratios[0].interval.confidence:.0%} Welch t interval)" if ratios else "speed-ups")
    for col in ("strategy", *shown, "n", "speed-up", "CI"):
        table.add_column(col, justify="right" if col in ("n", "speed-up") else "left")
    for r in ratios:
        mean, ci = _ratio_text(r.interval)
        table.add_row(escape(_strategy_label(r.numerator)), *(escape(_level(s, r.numerator.get(s))) for s in shown),
                      str(r.interval.n), mean, ci)
    return table


def _strategy_label(g: Group) -> str:
    extra = {"allreduce-accum": f" (k={g.get('accum_steps')})", "ps": f" ({g.get('ps')} ps)"}
    return str(g.get("strategy")) + extra.get(g.get("strategy"), "")


def _ratio_text(i: Interval) -> tuple[str, str]:
    ci = "-" if i.low is None else f"{i.low:.2f}x .. {i.high:.2f}x"
    return f"{i.mean:.2f}x", ci


# ---------------------------------------------------------------- reading a results folder

def _record_factors(record: Mapping[str, Any], planned: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    profile = record.get("profile") or {}
    planned = planned or {}
    rate = profile.get("rate_bps")

    def pick(name: str, default: Any) -> Any:
        return planned.get(name, record.get(name, default))

    strategy = record.get("strategy", "allreduce")
    values = {
        "strategy": strategy, "model": record.get("model", "?"),
        "batch": int(record.get("batch_size", planned.get("batch", 0))), "workers": int(record.get("workers", 1)),
        "ps": int(pick("ps", 0)) if strategy == "ps" else None,
        "accum_steps": int(pick("accum_steps", 0)) if strategy == "allreduce-accum" else None,
        "data": pick("data", "synthetic"),
        "latency_ms": profile.get("delay_us", 0) / 1000, "bandwidth_mbit": None if rate is None else rate / 1e6,
        "loss_pct": round(profile.get("loss", 0) * 100, 6), "jitter_ms": profile.get("jitter_us", 0) / 1000,
    }
    return tuple((name, values[name]) for name in FACTORS)


def observation_from_record(record: Mapping[str, Any], planned: Mapping[str, Any] | None = None) -> Observation:
    """An Observation from one runs/<id>.json record (and its playbook entry, if any)."""
    stats = record.get("stats") or {}
    ips = stats.get("images_per_sec") if record.get("status") == "ok" else None
    idle = record.get("idle_ratio")  # share of a step spent waiting on the network, where the strategy tells
    return Observation(run_id=str(record["run_id"]), factors=_record_factors(record, planned),
                       repeat=int(record.get("repeat", 0)), status=str(record.get("status", "?")),
                       images_per_sec=None if ips is None else float(ips),
                       idleness=None if idle is None else float(idle))


def load_observations(results_dir: Path) -> list[Observation]:
    """Every run record of a sweep's or playbook's results folder, in run id order."""
    store = ResultStore(results_dir)
    paths = store.record_paths()
    if not paths:
        raise ReportError(f"{results_dir}: no run records (runs/*.json)",
                          hint="give the folder a sweep or 'netbench run' wrote, e.g. results/smoke")
    planned: dict[str, Any] = {}
    book = store.playbook_path
    if book.exists():
        try:
            planned = {r["run_id"]: r for r in json.loads(book.read_text(encoding="utf-8")).get("runs", [])}
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ReportError(f"{book}: unreadable: {exc}") from None
    out = []
    for path in paths:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            out.append(observation_from_record(record, planned.get(record.get("run_id"))))
        except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ReportError(f"{path}: not a run record: {exc}") from None
    return out


# ---------------------------------------------------------------- figures (matplotlib, Agg)

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
    picked = [g for g in _networked(baseline_slice(groups, x)) if g.get(x) is not None]
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

        def as_percent(g):
            i = by_group[g].interval
            scale = lambda v: None if v is None else 100 * v  # noqa: E731
            return Interval(n=i.n, mean=100 * i.mean, low=scale(i.low), high=scale(i.high), confidence=i.confidence)

        _draw_bars(ax, mine, "workers", series, value=as_percent, dots=lambda g: [100 * v for v in by_group[g].values])
        ax.axhline(100, color="grey", linestyle="--", linewidth=1)
        ax.text(ax.get_xlim()[0], 101, " ideal", fontsize=7, color="grey", va="bottom")
        ax.set_title(f"model {model}", fontsize=10)
        ax.set_xlabel("workers N (processes, one per node)", fontsize=8)
        ax.set_ylabel("scaling efficiency (%)", fontsize=8)
        ax.set_ylim(0, max(110, ax.get_ylim()[1]))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def idleness_values(g: Group) -> list[float]:
    return [100 * o.idleness for o in g.observations if o.idleness is not None and o.images_per_sec is not None]


def idleness_figure(groups: Sequence[Group], x: str, path: Path, confidence: float) -> Path:
    """Idleness (share of a step spent waiting on the network) against network factor `x`,
    one panel per model, for the groups whose strategy reports it."""
    plt = _pyplot()
    picked = [g for g in _networked(baseline_slice(groups, x)) if g.get(x) is not None and idleness_values(g)]
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


# ---------------------------------------------------------------- tables and the summary

def _level(name: str, value: Any) -> str:
    if value is None:
        return "unlimited" if name == "bandwidth_mbit" else "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _interval_text(i: Interval | None, digits: int = 1) -> tuple[str, str]:
    if i is None:
        return "-", "-"
    ci = "-" if i.low is None else f"{i.low:,.{digits}f} .. {i.high:,.{digits}f}"
    return f"{i.mean:,.{digits}f}", ci


def runs_table(observations: Sequence[Observation]):
    from rich.table import Table

    shown = varying(observations) or ["model"]
    idle = any(o.idleness is not None for o in observations)
    table = Table(title=f"{len(observations)} runs")
    for col in ("run", *shown, "rep", "images/s", *(["idle"] if idle else []), "status"):
        table.add_column(col, justify="right" if col in ("images/s", "rep", "idle") else "left")
    for o in observations:
        idle_cell = ["-" if o.idleness is None else f"{o.idleness:.0%}"] if idle else []
        table.add_row(escape(o.run_id), *(escape(_level(s, o.get(s))) for s in shown), str(o.repeat),
                      "-" if o.images_per_sec is None else f"{o.images_per_sec:,.1f}", *idle_cell,
                      o.status if o.status == "ok" else f"[red]{escape(o.status)}[/]")
    return table


def groups_table(groups: Sequence[Group], confidence: float):
    from rich.table import Table

    shown = varying(groups) or ["model"]
    table = Table(title=f"{len(groups)} design points: mean images/s over repetitions, {confidence:.0%} CI (t)")
    for col in (*shown, "n", "mean", "CI", "timeouts", "failed"):
        table.add_column(col)
    for g in groups:
        mean, ci = _interval_text(g.interval)
        table.add_row(*(escape(_level(s, g.get(s))) for s in shown), str(len(g.values)), mean, ci, str(g.timeouts),
                      str(g.failed))
    return table


def markdown_summary(results_dir: Path, observations: Sequence[Observation], groups: Sequence[Group],
                     effs: Sequence[Efficiency], figures: Sequence[Path], confidence: float,
                     playbook: Mapping[str, Any] | None = None) -> str:
    """A short markdown summary: what ran, the slow-down along each network factor,
    scaling efficiency, and every design point's mean and interval."""
    statuses = {s: sum(o.status == s for o in observations) for s in sorted({o.status for o in observations})}
    lines = [f"# Report: {results_dir.name}", ""]
    if playbook:
        lines += [f"Playbook **{playbook.get('name')}** (seed {playbook.get('seed')}, order "
                  f"{playbook.get('order')}).", "", str(playbook.get("description", "")).strip(), ""]
    lines += [f"{len(observations)} runs ({', '.join(f'{n} {s}' for s, n in statuses.items())}) in "
              f"{len(groups)} design points. Throughput is images/s (global batch / mean step time); "
              f"intervals are {confidence:.0%} t intervals over repetitions; a point with one run has none.", ""]
    for x in NETWORK:
        rows = slowdown(groups, x, confidence)
        if rows:
            lines += [f"## Throughput along {x.split('_')[0]}", "",
                      f"| model | series | {x} best | {x} worst | worst / best | CI |", "|---|---|---|---|---|---|"]
            lines += [f"| {m} | {s} | {b:g} | {w:g} | {percent(r.mean)} | "
                      + ("-" if r.low is None else f"{percent(r.low)} .. {percent(r.high)}") + " |"
                      for m, s, b, w, r in rows] + [""]
    ratios = speedups(groups, confidence)
    if ratios:
        cols = [f for f in varying([r.numerator for r in ratios]) if f != "strategy"]
        lines += [f"## Speed-up over per-step {REFERENCE_STRATEGY}", "",
                  "Ratio of geometric means of throughput; interval: Welch t on log throughput, "
                  f"{confidence:.0%}.", "",
                  "| " + " | ".join(["strategy", *cols, "n", "speed-up", "CI"]) + " |", "|" + "---|" * (len(cols) + 4)]
        for r in ratios:
            mean, ci = _ratio_text(r.interval)
            lines.append("| " + " | ".join([_strategy_label(r.numerator),
                                            *(_level(c, r.numerator.get(c)) for c in cols),
                                            str(r.interval.n), mean, ci]) + " |")
        lines.append("")
    if effs:
        cols = list(dict.fromkeys(["model", "batch", "strategy", "workers",
                                   *varying([e.group for e in effs])]))
        lines += ["## Scaling efficiency (measured / (N x single-process))", "",
                  "Ratio of geometric means; the interval (Welch t on log throughput) counts the "
                  "single-process runs' spread too.", "",
                  "| " + " | ".join([*cols, "efficiency", "CI"]) + " |", "|" + "---|" * (len(cols) + 2)]
        for e in effs:
            mean, ci = _interval_text(Interval(e.interval.n, 100 * e.interval.mean,
                                               None if e.interval.low is None else 100 * e.interval.low,
                                               None if e.interval.high is None else 100 * e.interval.high,
                                               confidence), digits=0)
            lines.append("| " + " | ".join([*(_level(c, e.group.get(c)) for c in cols), f"{mean} %",
                                            ci if ci == "-" else ci + " %"]) + " |")
        lines.append("")
    shown = varying(groups) or ["model"]
    lines += ["## Design points", "", "| " + " | ".join([*shown, "n", "mean images/s", "CI", "timeouts"]) + " |",
              "|" + "---|" * (len(shown) + 4)]
    for g in groups:
        mean, ci = _interval_text(g.interval)
        lines.append("| " + " | ".join([*(_level(s, g.get(s)) for s in shown), str(len(g.values)), mean, ci,
                                        str(g.timeouts)]) + " |")
    lines += ["", "## Figures", ""] + [f"![{p.stem}]({p.name})" for p in figures]
    return "\n".join(lines) + "\n"


def write_report(results_dir: Path, out_dir: Path, confidence: float = 0.99) -> Written:
    """Read a results folder; write one figure per swept network factor, an efficiency
    figure when single-process runs exist, and report.md, all into `out_dir`."""
    results_dir = Path(results_dir)
    observations = load_observations(results_dir)
    groups = group_observations(observations, confidence)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = []
    for x in NETWORK:
        levels = {g.get(x) for g in _networked(baseline_slice(groups, x)) if g.get(x) is not None}
        if len(levels) > 1:
            figures.append(throughput_figure(groups, x, out_dir / f"throughput-{x.split('_')[0]}.png", confidence))
        idle_levels = {g.get(x) for g in _networked(baseline_slice(groups, x))
                       if g.get(x) is not None and idleness_values(g)}
        if len(idle_levels) > 1:
            figures.append(idleness_figure(groups, x, out_dir / f"idleness-{x.split('_')[0]}.png", confidence))
    effs = scaling_efficiency(groups, confidence)
    network_best = baseline_slice(groups, "")
    effs_shown = [e for e in effs if e.group in network_best]
    if effs_shown:
        figures.append(efficiency_figure(effs_shown, out_dir / "scaling-efficiency.png", confidence))
    playbook = None
    book = ResultStore(results_dir).playbook_path
    if book.exists():
        playbook = json.loads(book.read_text(encoding="utf-8"))
    summary = out_dir / "report.md"
    summary.write_text(markdown_summary(results_dir, observations, groups, effs_shown, figures, confidence, playbook),
                       encoding="utf-8")
    return Written(observations=observations, groups=groups, files=[*figures, summary])

