"""The summary (report.md, and report.html with the figures embedded) and write_report,
which reads a results folder and writes its figures and summary; the text of levels,
intervals and ratios that the summary and the CLI's tables share."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from netbench.experiment.store import ResultStore
from netbench.report.document import Block, Figure, Heading, Paragraph, Table, to_html, to_markdown
from netbench.report.figures import efficiency_figure, metric_figure, strategy_text
from netbench.report.accuracy import accuracy_blocks_of, read_points, winner_blocks
from netbench.report.curves import curve_figure, curve_runs, spread_runs
from netbench.report.groups import NETWORK, REFERENCE_STRATEGY, Efficiency, Group, baseline_slice, \
    group_observations, networked, ordered, scaling_efficiency, slowdown, speedups, varying
from netbench.model.job import ALGORITHM_KEYS
from netbench.report.load import Observation, load_observations
from netbench.report.measures import LINK_BYTES, REPORTED, TIME_TO_TARGET
from netbench.stats import MIN_RUNS, Interval, t_quantile


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


def interval_text(i: Interval | None, digits: int = 1, runs: Sequence[float] = ()) -> tuple[str, str]:
    """A centre and its interval as text; without bounds (fewer than MIN_RUNS runs) the
    runs themselves, so the reader sees what there is."""
    if i is None:
        return "-", "-"
    if i.low is None:
        if len(runs) < 2:
            return f"{i.mean:,.{digits}f}", "none (one run)" if runs else "-"
        return f"{i.mean:,.{digits}f}", "runs: " + ", ".join(f"{v:,.{digits}f}" for v in runs)
    return f"{i.mean:,.{digits}f}", f"{i.low:,.{digits}f} .. {i.high:,.{digits}f}"


def ratio_text(i: Interval) -> tuple[str, str]:
    ci = f"none (n < {MIN_RUNS})" if i.low is None else f"{i.low:.2f}x .. {i.high:.2f}x"
    return f"{i.mean:.2f}x", ci


def spread_cells(g: Group) -> tuple[str, str]:
    """The run-to-run sd and the within-run half-width of a design point, as % text ("-": none)."""
    return tuple("-" if v is None else f"{v:.1f} %" for v in (g.run_to_run_pct, g.within_run_pct))


def precision_blocks(observations: Sequence[Observation]) -> list[Block]:
    """A plain warning when --max-seconds ended any ok run's window short of its precision."""
    asked = [o for o in observations if o.precision_reached is not None and o.images_per_sec is not None]
    capped = [o.run_id for o in asked if o.precision_reached is False]
    if not capped:
        return []
    return [Paragraph(f"**Precision not reached in {len(capped)} of {len(asked)} runs** ({', '.join(capped)}): "
                      f"--max-seconds stopped their windows before their interval came within the precision "
                      f"asked; their within-run ± is wider than asked.")]


def strategy_label(g: Group) -> str:
    return strategy_text(g)


def intervals_paragraph(confidence: float) -> str:
    """How every interval of the report is made, stated once."""
    wide = t_quantile(1 - (1 - confidence) / 2, 1)
    return (f"Each design point shows the geometric mean of its runs with a {confidence:.0%} interval over "
            f"repetitions: a t interval on log throughput, mapped back, so it cannot go below zero "
            f"(shares such as idleness: on their logits, inside 0..100 %). Ratios (slow-downs, speed-ups, "
            f"efficiency) are ratios of geometric means with a {confidence:.0%} Welch interval on log "
            f"throughput. A point or ratio with fewer than {MIN_RUNS} runs has no interval: with 2 runs a "
            f"{confidence:.0%} t interval is +-{wide:.1f} standard errors and says nothing; its runs are "
            f"listed instead. A repetition is a launch, the unit of replication: by default the job's processes "
            f"start once per repetition and measure every point of their job configuration in turn "
            f"(--isolate starts them anew for every point); either way the launches are the replicates.")


def summary_blocks(results_dir: Path, observations: Sequence[Observation], groups: Sequence[Group],
                   effs: Sequence[Efficiency], figures: Sequence[Path], confidence: float,
                   playbook: Mapping[str, Any] | None = None, won: Sequence[Block] = ()) -> list[Block]:
    """The report as blocks: what ran, which algorithm and network point won (`won`, from
    accuracy.winner_blocks), the slow-down along each network factor, speed-ups, scaling
    efficiency, every design point's centre and interval (or runs), the figures."""
    statuses = {s: sum(o.status == s for o in observations) for s in sorted({o.status for o in observations})}
    blocks: list[Block] = [Heading(f"Report: {results_dir.name}", 1)]
    if playbook:
        blocks += [Paragraph(f"Playbook **{playbook.get('name')}** (seed {playbook.get('seed')}, order "
                             f"{playbook.get('order')}).")]
        if str(playbook.get("description", "")).strip():
            blocks.append(Paragraph(str(playbook.get("description", "")).strip()))
    blocks += [Paragraph(f"{len(observations)} runs ({', '.join(f'{n} {s}' for s, n in statuses.items())}) in "
                         f"{len(groups)} design points. Throughput is images/s (global batch / mean step time)."),
               Paragraph(intervals_paragraph(confidence)), *won]
    level = f"{confidence:.0%} interval"
    for x in NETWORK:
        rows = slowdown(groups, x, confidence)
        if rows:
            blocks += [Heading(f"Throughput along {x.split('_')[0]}"),
                       Table(("model", "series", f"{x} best", f"{x} worst", "n", "worst / best", level),
                             tuple((str(m), s, f"{b:g}", f"{w:g}", str(r.n), percent(r.mean),
                                    f"none (n < {MIN_RUNS})" if r.low is None
                                    else f"{percent(r.low)} .. {percent(r.high)}") for m, s, b, w, r in rows))]
    ratios = speedups(groups, confidence)
    if ratios:
        cols = [f for f in varying([r.numerator for r in ratios]) if f != "strategy"]
        blocks += [Heading(f"Speed-up over per-step {REFERENCE_STRATEGY}"),
                   Paragraph("Throughput / per-step all-reduce's at the same point (ratio of geometric means)."),
                   Table(("strategy", *cols, "n", "speed-up", level),
                         tuple((strategy_label(r.numerator), *(level_text(c, r.numerator.get(c)) for c in cols),
                                str(r.interval.n), *ratio_text(r.interval)) for r in ratios))]
    if effs:
        cols = list(dict.fromkeys(["model", "batch", "strategy", "workers", *varying([e.group for e in effs])]))
        rows = []
        for e in effs:
            mean, ci = interval_text(e.interval.scaled(100), digits=0, runs=[100 * v for v in e.values])
            rows.append((*(level_text(c, e.group.get(c)) for c in cols), f"{mean} %",
                         ci if e.interval.low is None else ci + " %"))
        blocks += [Heading("Scaling efficiency (measured / (N x single-process))"),
                   Paragraph("Ratio of geometric means; the interval counts the single-process runs' spread too."),
                   Table((*cols, "efficiency", level), tuple(rows))]
    shown = varying(groups) or ["model"]
    from netbench.report.predicted import predicted_blocks

    blocks += predicted_blocks(results_dir / "results.csv")
    blocks += [Heading("Design points"), *precision_blocks(observations),
               Paragraph("Run-to-run sd: the repetitions' standard deviation in % of their mean; within-run ±: "
                         "the runs' own 95 % batch-means half-width (% of the mean step). A run-to-run sd well "
                         "above within-run ± / 1.96 means something that holds for a whole run varies (load, TCP "
                         "state): the repetitions, not a run's steps, are the replicates of the interval. "
                         "precision: whether the runs' windows came within the precision asked, or "
                         "--max-seconds stopped them first (cap: not reached)."),
               Table((*shown, "n", "geo. mean images/s", level, "run-to-run sd", "within-run ±", "precision",
                      "timeouts"),
                     tuple((*(level_text(s, g.get(s)) for s in shown), str(len(g.values)),
                            *interval_text(g.interval, runs=g.values), *spread_cells(g), g.precision_text,
                            str(g.timeouts)) for g in ordered(groups)))]
    if figures:
        blocks += [Heading("Figures"), *(Figure(p) for p in figures)]
    return blocks


def bytes_blocks(groups: Sequence[Group], confidence: float) -> list[Block]:
    """The section for runs measured in bytes on their links (a user's command that reports no
    steps, results.csv's source "bytes"): per design point, the bytes each node sent per second,
    saying that these are bytes, not steps (none when no run was measured in bytes)."""
    measured = [g for g in ordered(groups) if LINK_BYTES.values(g)]
    if not measured:
        return []
    shown = varying(measured) or ["model"]
    rows = []
    for g in measured:
        values = LINK_BYTES.values(g)
        mean, ci = interval_text(LINK_BYTES.interval(g, confidence), digits=0, runs=values)
        rows.append((*(level_text(s, g.get(s)) for s in shown), str(len(values)), mean, ci))
    return [Heading("Measured in bytes, not steps"),
            Paragraph("These runs' job reported no steps (neither netbench.track nor --step-regex): netbench "
                      "measured the bytes on each node's link over a window of seconds after a warm-up, so they "
                      "have no images/s and no step time. Bytes each node sent per second, averaged over the "
                      f"job's nodes; geometric mean over repetitions with a {confidence:.0%} interval."),
            Table((*shown, "n", "bytes/s sent per node", f"{confidence:.0%} interval"), tuple(rows))]


def markdown_summary(results_dir: Path, observations: Sequence[Observation], groups: Sequence[Group],
                     effs: Sequence[Efficiency], figures: Sequence[Path], confidence: float,
                     playbook: Mapping[str, Any] | None = None) -> str:
    """report.md's text (summary_blocks as markdown)."""
    return to_markdown(summary_blocks(results_dir, observations, groups, effs, figures, confidence, playbook))


ALGORITHM_FACTORS = ALGORITHM_KEYS  # staleness, tau, elastic_alpha, gossip_p


def report_figures(groups: Sequence[Group], effs: Sequence[Efficiency], out_dir: Path,
                   confidence: float) -> list[Path]:
    """Every figure the design supports: each reported Measure the folder holds against each
    network factor with two or more levels (else against a design factor that varies: a
    categorical one gets grouped bars; and against each algorithm setting that varies), scaling efficiency where single-process runs exist, and
    for accuracy runs their curves against step and wall time (curves.py) and, with a target,
    time to it as bars per algorithm at every network point."""
    along = [x for x in NETWORK if len({g.get(x) for g in networked(baseline_slice(groups, x))} - {None}) > 1]
    if not along:  # the first design factor that varies, and each algorithm setting that does (numeric)
        varied = [x for x in ("strategy", "batch", "workers", "data", "framework", "topology", *ALGORITHM_FACTORS)
                  if len({g.get(x) for g in networked(groups)} - {None}) > 1]
        along = list(dict.fromkeys(varied[:1] + [x for x in varied if x in ALGORITHM_FACTORS]))
    figures = []
    for x in along:
        picked = [g for g in networked(baseline_slice(groups, x)) if g.get(x) is not None]
        for stem, measure in REPORTED:
            shown = [g for g in picked if measure.values(g)]
            if measure.companion is not None and not any(measure.companion_value(g) is not None for g in shown):
                continue  # step time is drawn where there is a prediction to set beside it
            if len({g.get(x) for g in shown}) > 1:
                figures.append(metric_figure(groups, measure, x, out_dir / f"{stem}-{x.split('_')[0]}.png",
                                             confidence))
    if effs:
        figures.append(efficiency_figure(effs, out_dir / "scaling-efficiency.png", confidence))
    runs = curve_runs([o for g in networked(groups) for o in g.observations])
    if runs:
        figures += [curve_figure(runs, "step", out_dir / "accuracy-step.png"),
                    curve_figure(runs, "wall_s", out_dir / "accuracy-walltime.png")]
        if spread_runs(runs):
            figures.append(curve_figure(runs, "step", out_dir / "spread-step.png", y="spread"))
    if any(o.target_accuracy is not None for o in runs):
        figures.append(metric_figure(groups, TIME_TO_TARGET, "strategy", out_dir / "time-to-target-strategy.png",
                                     confidence, baseline=False))
    return figures


def write_report(results_dir: Path, out_dir: Path, confidence: float = 0.95, preface: Sequence[Block] = (),
                 appendix: Sequence[Block] = (), title: str | None = None) -> Written:
    """Read a results folder; write its figures (report_figures), report.md beside them and
    report.html with the figures embedded, all into `out_dir`. `preface`: blocks after the
    title (a campaign's completeness); `appendix`: blocks at the end (its machines); `title`:
    the report's name [default: the folder's]."""
    results_dir = Path(results_dir)
    observations = load_observations(results_dir)
    groups = group_observations(observations, confidence)
    out_dir.mkdir(parents=True, exist_ok=True)
    effs = scaling_efficiency(groups, confidence)
    network_best = baseline_slice(groups, "")
    effs_shown = [e for e in effs if e.group in network_best]
    figures = report_figures(groups, effs_shown, out_dir, confidence)
    playbook = ResultStore(results_dir).read_playbook()  # load_observations has read it once already
    points, target = read_points(results_dir, confidence)
    blocks = summary_blocks(results_dir, observations, groups, effs_shown, figures, confidence, playbook,
                            won=winner_blocks(points, target))
    blocks += accuracy_blocks_of(points, confidence)
    blocks += bytes_blocks(groups, confidence)
    from netbench.report.stragglers import straggler_blocks

    blocks += straggler_blocks(results_dir)
    name = title or results_dir.name
    blocks = [Heading(f"Report: {name}", 1), *preface, *blocks[1:], *appendix]
    summary, page = out_dir / "report.md", out_dir / "report.html"
    summary.write_text(to_markdown(blocks), encoding="utf-8")
    page.write_text(to_html(blocks, f"Report: {name}"), encoding="utf-8")
    return Written(observations=observations, groups=groups, files=[*figures, summary, page])
