"""The report's tables in the terminal (`netbench report`): the runs, the design points and
the speed-ups. A run measured in bytes on its links (a user's command that reports no steps)
says so in place of images/s."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:  # the report's modules load with the report's tables (a quick command skips them)
    from netbench.report.groups import Group, Ratio
    from netbench.report.load import Observation


def runs_table(observations: Sequence[Observation]) -> Table:
    from netbench.report.groups import varying
    from netbench.report.summary import level_text

    from netbench.cli.render_bytes import LINK_COLUMN, STATUS, bytes_rate

    shown = varying(observations) or ["model"]
    idle = any(o.idleness is not None for o in observations)
    sent = any(o.metric(LINK_COLUMN) is not None for o in observations)  # some run measured in bytes
    table = Table(title=f"{len(observations)} runs")
    for col in ("run", *shown, "rep", "images/s", *(["idle"] if idle else []),
                *(["bytes/s sent per node (no steps)"] if sent else []), "status"):
        table.add_column(col, justify="right" if col in ("images/s", "rep", "idle") else "left")
    for o in observations:
        idle_cell = ["-" if o.idleness is None else f"{o.idleness:.0%}"] if idle else []
        rate = o.metric(LINK_COLUMN)
        status = (STATUS if rate is not None else "ok") if o.status == "ok" else f"[red]{escape(o.status)}[/]"
        table.add_row(escape(o.run_id), *(escape(level_text(s, o.get(s))) for s in shown), str(o.repeat),
                      "-" if o.images_per_sec is None else f"{o.images_per_sec:,.1f}", *idle_cell,
                      *([bytes_rate(rate)] if sent else []), status)
    return table


def groups_table(groups: Sequence[Group], confidence: float) -> Table:
    from netbench.report.groups import ordered, varying
    from netbench.report.summary import interval_text, level_text, spread_cells
    from netbench.stats import MIN_RUNS

    shown = varying(groups) or ["model"]
    table = Table(title=f"{len(groups)} design points: geometric mean images/s over repetitions, "
                        f"{confidence:.0%} interval (log-scale t; under {MIN_RUNS} runs: the runs)")
    for col in (*shown, "n", "geo. mean", "interval", "run-to-run sd", "within-run ±", "precision", "timeouts",
                "failed"):
        table.add_column(col)
    for g in ordered(groups):
        mean, ci = interval_text(g.interval, runs=g.values)
        precision = g.precision_text
        table.add_row(*(escape(level_text(s, g.get(s))) for s in shown), str(len(g.values)), mean, ci,
                      *spread_cells(g), f"[yellow]{precision}[/]" if precision.startswith("cap") else precision,
                      str(g.timeouts), str(g.failed))
    return table


def speedups_table(ratios: Sequence[Ratio]) -> Table:
    from netbench.report.groups import REFERENCE_STRATEGY, varying
    from netbench.report.summary import level_text, ratio_text, strategy_label

    groups = [r.numerator for r in ratios]
    shown = [f for f in varying(groups) if f not in ("strategy",)]
    table = Table(title=f"speed-up over per-step {REFERENCE_STRATEGY} (ratio of geometric means, "
                        f"{ratios[0].interval.confidence:.0%} Welch interval on log throughput)" if ratios else "speed-ups")
    for col in ("strategy", *shown, "n", "speed-up", "interval"):
        table.add_column(col, justify="right" if col in ("n", "speed-up") else "left")
    for r in ratios:
        mean, ci = ratio_text(r.interval)
        table.add_row(escape(strategy_label(r.numerator)), *(escape(level_text(s, r.numerator.get(s))) for s in shown),
                      str(r.interval.n), mean, ci)
    return table


def document_table(table, title: str) -> Table:
    """A report's table (report.document.Table) as the terminal shows tables."""
    shown = Table(title=title, title_justify="left")
    for column in table.header:
        shown.add_column(escape(column))
    for row in table.rows:
        shown.add_row(*(escape(cell) for cell in row))
    return shown
