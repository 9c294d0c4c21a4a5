"""Rendering a campaign's progress (experiment.campaign_status; the library never prints)."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from netbench import units


def progress_lines(progress, shown: Path) -> list:
    """`netbench status`: a line on the campaign, a table of its shards, its failures, what is
    left and its estimated time, and what to run next."""
    from netbench.experiment.campaign import describe_split

    record = progress.record
    lines: list = [f"campaign [bold]{escape(str(record.get('name')))}[/] ({escape(str(shown))}): "
                   f"{escape(describe_split(record))}; seed {record.get('seed')}"]
    table = Table(box=None)
    for column in ("shard", "state", "host", "done", "failed", "left", "time left", "job"):
        table.add_column(column)
    for shard in progress.shards:
        state = "queued" if shard.queued else shard.state
        table.add_row(str(shard.index), state, escape(shard.host or "-"), f"{shard.done}/{shard.runs}",
                      str(len(shard.failed)), str(shard.left),
                      "-" if not shard.left else "~" + units.format_wall_seconds(shard.left_s), shard.job or "-")
    lines.append(table)
    for shard in progress.shards:
        lines += [f"failed: shard {shard.index} {run_id}: {escape(reason)}" for run_id, reason in shard.failed]
        if shard.last_error:
            lines.append(f"shard {shard.index}: {escape(shard.last_error)}")
    if not progress.left:
        lines.append(f"all {progress.runs} runs done: the answer: netbench report {escape(str(shown))}")
        return lines
    pace = (f", at {progress.pace:.2f}x the estimate so far" if progress.pace is not None
            else " (the estimate's; none done yet to correct it)")
    lines.append(f"left: {progress.left} of {progress.runs} runs, about "
                 f"{units.format_wall_seconds(progress.left_at_once_s)} with the shards at once "
                 f"({units.format_wall_seconds(progress.left_in_turn_s)} one after another){pace}")
    stopped = [s.index for s in progress.shards if s.state != "running" and s.left and not s.queued]
    queued = [s.job for s in progress.shards if s.queued]
    if queued:
        lines.append(f"queued: {', '.join(queued)} submitted and not begun (squeue shows whether Slurm still "
                     "holds them)")
    if stopped:
        lines.append(f"shard(s) {', '.join(map(str, stopped))} not running: 'netbench submit "
                     f"{escape(str(record.get('playbook') or record.get('source')))} --slurm --shards {record.get('shards')} --output "
                     f"{escape(str(shown))}' runs what is missing (or 'netbench run ... --shard I/"
                     f"{record.get('shards')}' on a machine)")
    return lines
