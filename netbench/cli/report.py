"""The report command: tables, figures and a markdown summary of a results folder."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from netbench import console
from netbench.cli import render
from netbench.cli.common import handle_errors
from netbench.cli.types import FiniteFloatRange


@click.command("report")
@click.argument("results_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--output", type=click.Path(file_okay=False, path_type=Path),
              help="Where figures and report.md go [default: RESULTS_DIR/report].")
@click.option("--confidence", default=0.99, show_default=True, type=FiniteFloatRange(0.5, 0.9999),
              help="Confidence level of the intervals over repetitions (t distribution).")
@handle_errors
def report_cmd(results_dir: Path, output: Path | None, confidence: float) -> None:
    """Tabulate a sweep's or playbook's runs and draw its figures (PNG) and a markdown summary.

    Example: netbench report results/smoke
    """
    from netbench import report

    out = output or results_dir / "report"
    written = report.write_report(results_dir, out, confidence=confidence)
    console.out.print(render.runs_table(written.observations))
    console.out.print(render.groups_table(written.groups, confidence))
    ratios = report.speedups(written.groups, confidence)
    if ratios:
        console.out.print(render.speedups_table(ratios))
    for path in written.files:
        console.info(f"wrote {escape(str(path))}")
