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
@click.option("--partial", is_flag=True,
              help="A campaign with runs still missing: report what there is, marked incomplete (else refused).")
@handle_errors
def report_cmd(results_dir: Path, output: Path | None, level: float, partial: bool) -> None:
    """Tabulate a sweep's or playbook's runs; write its figures (PNG), report.md and a
    self-contained report.html.

    A campaign's folder (netbench submit, netbench run --shard) is merged first: every design
    run from the shard that ran it, into RESULTS_DIR/merged, with where each ran; the report
    adds its machines. A campaign with runs missing is refused, naming them, unless --partial.

    \b
    Example: netbench report results/smoke --level 90
    """
    from netbench import report
    from netbench.experiment import campaign

    out = output or results_dir / "report"
    confidence = level / 100
    machines = []
    if campaign.is_campaign(results_dir):
        written, machines = _campaign_report(results_dir, out, confidence, partial)
    else:
        written = report.write_report(results_dir, out, confidence=confidence)
    console.out.print(render.runs_table(written.observations))
    console.out.print(render.groups_table(written.groups, confidence))
    ratios = report.speedups(written.groups, confidence)
    if ratios:
        console.out.print(render.speedups_table(ratios))
    for table in machines:
        console.out.print(render.document_table(table, "machines: each shard's, and its throughput over every "
                                                "machine's at the points they share"))
    for path in written.files:
        console.info(f"wrote {escape(str(path))}")
    _hand_over(out, results_dir)


def _hand_over(out: Path, results_dir: Path) -> None:
    """Run by root for a user (sudo), the report belongs to whoever owns the results folder."""
    import os

    from netbench.cli.common import hand_over
    from netbench.testbed.run_as import RunAs

    if os.geteuid() != 0:
        return
    owner = results_dir.stat()
    if owner.st_uid != 0:
        hand_over(out, RunAs(owner.st_uid, owner.st_gid, "", "", "results folder"))
        merged = results_dir / "merged"
        if merged.is_dir():
            hand_over(merged, RunAs(owner.st_uid, owner.st_gid, "", "", "results folder"))


def _campaign_report(folder: Path, out: Path, confidence: float, partial: bool):
    """A campaign's shards merged (experiment/merge.py), refused while runs are missing unless
    `partial`; the report of the merged folder with the campaign's machines at the end."""
    from netbench import report
    from netbench.experiment.merge import merge
    from netbench.report.document import Paragraph, Table
    from netbench.report.load import ReportError
    from netbench.report.machines import machine_blocks

    merged = merge(folder)
    preface = []
    if not merged.complete:
        missing = f"{len(merged.missing)} of the design's {merged.runs} runs missing: {merged.missing_text()}"
        if not partial:
            raise ReportError(f"{folder}: the campaign is incomplete, {missing}",
                              hint=f"'netbench status {folder}' says what is left; submit again to run it, or "
                                   "--partial to report what there is, marked incomplete")
        console.warning(f"an incomplete campaign: {missing}")
        preface = [Paragraph(f"**Incomplete: {missing}.** The figures below are of the runs there are; "
                             "the design is not complete.")]
    elif merged.runs:
        preface = [Paragraph(f"A campaign of {merged.record['shards']} shards: all {merged.runs} runs of the "
                             "design, merged from the shards that ran them.")]
    console.info(f"merged {merged.runs - len(merged.missing)} of {merged.runs} runs into {escape(str(merged.folder))}")
    machines = machine_blocks(folder, merged.record, confidence)
    written = report.write_report(merged.folder, out, confidence=confidence, preface=preface, appendix=machines,
                                  title=folder.name)
    return written, [b for b in machines if isinstance(b, Table)]
