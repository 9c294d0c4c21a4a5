"""Design points and comparisons: runs grouped by every factor but the repetition, a
group's geometric-mean throughput with its log-scale t interval (none under MIN_RUNS runs),
scaling efficiency, slow-downs and speed-ups as ratios of geometric means (pure; the
statistics are netbench.stats')."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from netbench.report.load import FACTORS, OWN_SETTINGS, Observation
from netbench.stats import MIN_RUNS, Interval, geometric_mean, log_t_interval, ratio_interval

NETWORK = ("latency_ms", "bandwidth_mbit", "loss_pct", "jitter_ms", "scale")  # scale: a topology's, on every delay
# a factor level is "better" for the network when latency/loss/jitter is lower, bandwidth higher
BEST_IS_LOW = {"latency_ms": True, "bandwidth_mbit": False, "loss_pct": True, "jitter_ms": True, "scale": True}
REFERENCE_STRATEGY = "allreduce"  # speed-ups are against per-step synchronous all-reduce


@dataclass(frozen=True)
class Group:
    """The runs of one design point (every factor equal, repetitions differ)."""

    factors: tuple[tuple[str, Any], ...]
    observations: tuple[Observation, ...]
    interval: Interval | None  # throughput; None when no run of the point produced one
    timeouts: int = 0
    failed: int = 0

    def get(self, name: str) -> Any:
        return dict(self.factors)[name]

    @property
    def values(self) -> list[float]:
        return [o.images_per_sec for o in self.observations if o.images_per_sec is not None]

    def metric_values(self, name: str) -> list[float]:
        """Every run's value of metric `name` (Observation.metric), leaving out runs without one."""
        return [v for v in (o.metric(name) for o in self.observations) if v is not None]

    @property
    def run_to_run_pct(self) -> float | None:
        """How much the repetitions' throughputs differ: their standard deviation in % of their
        mean (None with fewer than 2)."""
        return spread_pct(self.values)

    @property
    def within_run_pct(self) -> float | None:
        """The mean of its runs' own 95 % half-widths (batch means over each window's steps), in
        % of the mean step time (None where the records have none)."""
        widths = [o.within_pct for o in self.observations if o.within_pct is not None and o.images_per_sec is not None]
        return statistics.fmean(widths) if widths else None

    @property
    def precision_text(self) -> str:
        """Whether its ok runs' windows reached their precision: "reached", "cap: k of n runs"
        (--max-seconds ended k windows first), or "-" (no precision asked)."""
        asked = [o.precision_reached for o in self.observations
                 if o.precision_reached is not None and o.images_per_sec is not None]
        if not asked:
            return "-"
        short = asked.count(False)
        return f"cap: {short} of {len(asked)} runs not reached" if short else "reached"

    @property
    def excess(self) -> float | None:
        """Run-to-run spread over what the windows' own noise predicts for it (a run's standard
        error, its half-width / 1.96): about 1 when runs differ only by their steps' noise; above,
        something that holds for a whole run varies (the machine's load, TCP's state), which only
        more repetitions average out: the point's interval is over repetitions for that reason."""
        between, within = self.run_to_run_pct, self.within_run_pct
        if between is None or not within:
            return None
        return between / (within / 1.96)


def spread_pct(values: Sequence[float]) -> float | None:
    """Standard deviation of `values` in % of their mean (None with fewer than 2)."""
    if len(values) < 2 or statistics.fmean(values) <= 0:
        return None
    return 100 * statistics.stdev(values) / statistics.fmean(values)


@dataclass(frozen=True)
class Efficiency:
    """Scaling efficiency of a group: its throughput over N x the single-process baseline."""

    group: Group
    baseline: float  # mean images/s of the matching single-process runs
    interval: Interval  # over the group's repetitions, each divided by N x baseline
    values: tuple[float, ...]


@dataclass(frozen=True)
class Ratio:
    """A ratio of two groups' throughputs (speed-up, slow-down, efficiency) with its interval."""

    numerator: Group
    denominator: Group
    interval: Interval  # mean: ratio of geometric means; n: runs on the smaller side


def group_observations(observations: Iterable[Observation], confidence: float = 0.95) -> list[Group]:
    """One group per distinct set of factor levels, in first-seen order; its interval is
    log_t_interval's over its runs' throughputs (no bounds under MIN_RUNS runs)."""
    buckets: dict[tuple, list[Observation]] = {}
    for obs in observations:
        buckets.setdefault(obs.factors, []).append(obs)
    groups = []
    for factors, members in buckets.items():
        members.sort(key=lambda o: (o.repeat, o.run_id))
        values = [o.images_per_sec for o in members if o.images_per_sec is not None]
        groups.append(Group(factors=factors, observations=tuple(members),
                            interval=log_t_interval(values, confidence) if values else None,
                            timeouts=sum(o.status == "timeout" for o in members),
                            failed=sum(o.status not in ("ok", "timeout") for o in members)))
    return groups


def ordered(groups: Iterable[Group]) -> list[Group]:
    """Groups sorted by their factor levels, in FACTORS order (numbers before names, None last)."""
    def key(g: Group) -> tuple:
        return tuple((v is None, not isinstance(v, (int, float)), v if isinstance(v, (int, float)) else str(v))
                     for _, v in g.factors)

    return sorted(groups, key=key)


def varying(items: Iterable[Observation | Group], names: Sequence[str] = FACTORS) -> list[str]:
    """The factors that take more than one value across `items`."""
    items = list(items)
    return [n for n in names if len({item.get(n) for item in items}) > 1]


def scaling_efficiency(groups: Sequence[Group], confidence: float = 0.95) -> list[Efficiency]:
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
        baseline = geometric_mean(base)
        values = tuple(v / (g.get("workers") * baseline) for v in g.values)
        out.append(Efficiency(group=g, baseline=baseline, values=values,
                              interval=ratio_interval(g.values, base, confidence, scale=g.get("workers"),
                                                                min_n=MIN_RUNS)))
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


def networked(groups: Sequence[Group]) -> list[Group]:
    """Groups whose processes talk over the testbed's links (all but strategy single)."""
    return [g for g in groups if g.get("strategy") != "single"]


def series_label(group: Group, series: Sequence[str]) -> str:
    """A legend entry from the factors that distinguish series, e.g. 'allreduce, 2 workers'."""
    names = {"batch": "batch {}", "workers": "{} workers", "ps": "{} ps", "accum_steps": "accum {}",
             "data": "data {}", "strategy": "{}", "latency_ms": "latency {:g} ms",
             "bandwidth_mbit": "bandwidth {:g} Mbit/s", "loss_pct": "loss {:g} %", "jitter_ms": "jitter {:g} ms",
             "scale": "scale {:g}", "staleness": "staleness {}", "tau": "tau {}",
             "elastic_alpha": "alpha {:g}", "gossip_p": "p {:g}",
             "backup_workers": "{} backup workers", "pipeline": "pipeline {}"}
    series = [s for s in series if group.get(s) is not None]  # e.g. accum_steps of a non-accum series

    def one(name: str) -> str:
        text = names.get(name, name + " {}").format(group.get(name))
        return text[:-1] if name == "workers" and group.get(name) == 1 else text  # "1 worker"

    return ", ".join(one(s) for s in series) or str(group.get("strategy"))


def slowdown(groups: Sequence[Group], x: str, confidence: float = 0.95) -> list[tuple[str, str, float, float, Interval]]:
    """(model, series, best level, worst level, worst / best as ratio_interval) for every
    series of the baseline slice along network factor `x` that has both ends measured."""
    picked = [g for g in networked(baseline_slice(groups, x)) if g.interval is not None and g.get(x) is not None]
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
        out.append((model, label, best.get(x), worst.get(x), ratio_interval(worst.values, best.values, confidence, min_n=MIN_RUNS)))
    return out


def speedups(groups: Sequence[Group], confidence: float = 0.95) -> list[Ratio]:
    """Every networked strategy against per-step all-reduce at the same model, batch, workers,
    data and network point: its throughput / all-reduce's, with ratio_interval's interval."""
    tied = [f for f in FACTORS if f != "strategy" and f not in OWN_SETTINGS]
    reference = {tuple(g.get(f) for f in tied): g for g in groups
                 if g.get("strategy") == REFERENCE_STRATEGY and g.values}
    out = []
    for g in networked(groups):
        ref = reference.get(tuple(g.get(f) for f in tied))
        if g.get("strategy") == REFERENCE_STRATEGY or ref is None or not g.values:
            continue
        out.append(Ratio(numerator=g, denominator=ref, interval=ratio_interval(g.values, ref.values, confidence,
                                                                                   min_n=MIN_RUNS)))
    return out


def idleness_values(g: Group) -> list[float]:
    return [100 * o.idleness for o in g.observations if o.idleness is not None and o.images_per_sec is not None]
