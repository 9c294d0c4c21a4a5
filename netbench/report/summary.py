"""The markdown summary (report.md) and write_report, which reads a results folder and
writes its figures and summary; the text of levels, intervals and ratios that the summary
and the CLI's tables share."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from netbench.experiment.store import ResultStore
from netbench.report.accuracy import accuracy_section
from netbench.report.figures import efficiency_figure, idleness_figure, throughput_figure
from netbench.report.groups import NETWORK, REFERENCE_STRATEGY, Efficiency, Group, baseline_slice, \
    group_observations, idleness_values, networked, scaling_efficiency, slowdown, speedups, varying
from netbench.report.load import Observation, load_observations
from netbench.stats import Interval


@dataclass
class Written:
    observations: list[Observation]
    groups: list[Group]
    files: list[Path] = field(default_factory=list)


def percent(ratio: float) -> str:
    """A ratio as a percentage with enough digits to tell small ones apart (2.6 %, 45 %)."""
    return f"{ratio:.1%}" if abs(ratio) < 0.1 else f"{ratio:.0%}"


def level_text(name: str, value: Any) -> str:
    if value is None:
        return "unlimited" if name == "bandwidth_mbit" else "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def interval_text(i: Interval | None, digits: int = 1) -> tuple[str, str]:
    if i is None:
        return "-", "-"
    ci = "-" if i.low is None else f"{i.low:,.{digits}f} .. {i.high:,.{digits}f}"
    return f"{i.mean:,.{digits}f}", ci


def ratio_text(i: Interval) -> tuple[str, str]:
    ci = "-" if i.low is None else f"{i.low:.2f}x .. {i.high:.2f}x"
    return f"{i.mean:.2f}x", ci


def strategy_label(g: Group) -> str:
    extra = {"allreduce-accum": f" (k={g.get('accum_steps')})", "ps": f" ({g.get('ps')} ps)"}
    return str(g.get("strategy")) + extra.get(g.get("strategy"), "")


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
              f"intervals are {confidence:.0%} t intervals over repetitions; a point with one run has none. "
              f"A repetition is a launch, the unit of replication: by default (--isolate) each run is "
              f"its own launch; under --launch the job's processes start once per repetition and "
              f"measure every point of it in turn, and launches are still the replicates.", ""]
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
            mean, ci = ratio_text(r.interval)
            lines.append("| " + " | ".join([strategy_label(r.numerator),
                                            *(level_text(c, r.numerator.get(c)) for c in cols),
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
            mean, ci = interval_text(e.interval.scaled(100), digits=0)
            lines.append("| " + " | ".join([*(level_text(c, e.group.get(c)) for c in cols), f"{mean} %",
                                            ci if ci == "-" else ci + " %"]) + " |")
        lines.append("")
    shown = varying(groups) or ["model"]
    lines += ["## Design points", "", "| " + " | ".join([*shown, "n", "mean images/s", "CI", "timeouts"]) + " |",
              "|" + "---|" * (len(shown) + 4)]
    for g in groups:
        mean, ci = interval_text(g.interval)
        lines.append("| " + " | ".join([*(level_text(s, g.get(s)) for s in shown), str(len(g.values)), mean, ci,
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
        levels = {g.get(x) for g in networked(baseline_slice(groups, x)) if g.get(x) is not None}
        if len(levels) > 1:
            figures.append(throughput_figure(groups, x, out_dir / f"throughput-{x.split('_')[0]}.png", confidence))
        idle_levels = {g.get(x) for g in networked(baseline_slice(groups, x))
                       if g.get(x) is not None and idleness_values(g)}
        if len(idle_levels) > 1:
            figures.append(idleness_figure(groups, x, out_dir / f"idleness-{x.split('_')[0]}.png", confidence))
    effs = scaling_efficiency(groups, confidence)
    network_best = baseline_slice(groups, "")
    effs_shown = [e for e in effs if e.group in network_best]
    if effs_shown:
        figures.append(efficiency_figure(effs_shown, out_dir / "scaling-efficiency.png", confidence))
    playbook = ResultStore(results_dir).read_playbook()  # load_observations has read it once already
    summary = out_dir / "report.md"
    summary.write_text(markdown_summary(results_dir, observations, groups, effs_shown, figures, confidence, playbook)
                       + accuracy_section(results_dir, confidence), encoding="utf-8")
    return Written(observations=observations, groups=groups, files=[*figures, summary])
