"""The report command: tables, figures, report.md and report.html of a results folder."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from netbench import console
from netbench.cli import render_report as render
from netbench.cli.common import handle_errors
from netbench.cli.types import FiniteFloatRange


@click.command("report", short_help="Tables, figures, report.md and report.html of a results folder.")
@click.argument("results_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--output", type=click.Path(file_okay=False, path_type=Path),
              help="Where figures, report.md and report.html go [default: RESULTS_DIR/report].")
@click.option("--level", default=95.0, show_default=True, type=FiniteFloatRange(50, 99.99),
              help="Confidence level (%) of the intervals over repetitions.")
@handle_errors
def report_cmd(results_dir: Path, output: Path | None, level: float) -> None:
    """Tabulate a sweep's or playbook's runs; write its figures (PNG), report.md and a
    self-contained report.html.

    \b
    Example: netbench report results/smoke --level 90
    """
    from netbench import report

    out = output or results_dir / "report"
    confidence = level / 100
    written = report.write_report(results_dir, out, confidence=confidence)
    console.out.print(render.runs_table(written.observations))
    console.out.print(render.groups_table(written.groups, confidence))
    ratios = report.speedups(written.groups, confidence)
    if ratios:
        console.out.print(render.speedups_table(ratios))
    for path in written.files:
        console.info(f"wrote {escape(str(path))}")
