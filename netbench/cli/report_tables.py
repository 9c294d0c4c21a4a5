"""The report command's tables (rich): every run, every design point, the speed-ups.

The report package computes and writes; this module only lays its results out for the terminal.
Recorded text (run ids, levels, statuses) is escaped, so a results folder cannot inject markup.
"""

from __future__ import annotations

from typing import Sequence

from rich.markup import escape
from rich.table import Table

from netbench.report.groups import REFERENCE_STRATEGY, Group, Ratio, varying
from netbench.report.load import Observation
from netbench.report.summary import interval_text, level_text, ratio_text, strategy_label


def runs_table(observations: Sequence[Observation]) -> Table:
    shown = varying(observations) or ["model"]
    idle = any(o.idleness is not None for o in observations)
    table = Table(title=f"{len(observations)} runs")
    for col in ("run", *shown, "rep", "images/s", *(["idle"] if idle else []), "status"):
        table.add_column(col, justify="right" if col in ("images/s", "rep", "idle") else "left")
    for o in observations:
        idle_cell = ["-" if o.idleness is None else f"{o.idleness:.0%}"] if idle else []
        table.add_row(escape(o.run_id), *(escape(level_text(s, o.get(s))) for s in shown), str(o.repeat),
                      "-" if o.images_per_sec is None else f"{o.images_per_sec:,.1f}", *idle_cell,
                      o.status if o.status == "ok" else f"[red]{escape(o.status)}[/]")
    return table


def groups_table(groups: Sequence[Group], confidence: float) -> Table:
    shown = varying(groups) or ["model"]
    table = Table(title=f"{len(groups)} design points: mean images/s over repetitions, {confidence:.0%} CI (t)")
    for col in (*shown, "n", "mean", "CI", "timeouts", "failed"):
        table.add_column(col)
    for g in groups:
        mean, ci = interval_text(g.interval)
        table.add_row(*(escape(level_text(s, g.get(s))) for s in shown), str(len(g.values)), mean, ci, str(g.timeouts),
                      str(g.failed))
    return table


def speedups_table(ratios: Sequence[Ratio]) -> Table:
    groups = [r.numerator for r in ratios]
    shown = [f for f in varying(groups) if f not in ("strategy",)]
    table = Table(title=f"speed-up over per-step {REFERENCE_STRATEGY} (ratio of geometric means, "
                        f"{ratios[0].interval.confidence:.0%} Welch t interval)" if ratios else "speed-ups")
    for col in ("strategy", *shown, "n", "speed-up", "CI"):
        table.add_column(col, justify="right" if col in ("n", "speed-up") else "left")
    for r in ratios:
        mean, ci = ratio_text(r.interval)
        table.add_row(escape(strategy_label(r.numerator)), *(escape(level_text(s, r.numerator.get(s))) for s in shown),
                      str(r.interval.n), mean, ci)
    return table
