"""The campaign commands: submit (a design's shards as a Slurm job array) and status (a
campaign's progress from its folder)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from netbench import console
from netbench.cli.common import handle_errors
from netbench.errors import UsageError


@click.command("submit", short_help="Run a design's shards as a Slurm job array.")
@click.argument("playbook_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--slurm", is_flag=True, help="Submit to Slurm (sbatch): a job array, one task per shard.")
@click.option("--shards", type=click.IntRange(1), required=True,
              help="How many shards (array tasks, one machine each) the design is shared among.")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path),
              help="The campaign folder [default: results/<playbook name>]; an existing one resumes.")
@click.option("--partition", help="Slurm partition to run in (sbatch --partition).")
@click.option("--time", "time_limit", metavar="TIME",
              help="Each task's time limit, as Slurm takes it (e.g. 2:00:00 or 1-0); at the limit a shard "
                   "stops and keeps every run it recorded.")
@click.option("--cpus-per-task", type=click.IntRange(1),
              help="Cores per task instead of a whole node (the default, --exclusive: timings need one).")
@click.option("--sbatch-arg", "sbatch_args", multiple=True, metavar="OPTION",
              help="One more sbatch option, as sbatch takes it (e.g. --sbatch-arg=--mem=8G); repeatable.")
@click.option("--dry-run", is_flag=True, help="Print the batch script (to stdout); write and submit nothing.")
@handle_errors
def submit(playbook_file: Path, slurm: bool, shards: int, output: Path | None, partition: str | None,
           time_limit: str | None, cpus_per_task: int | None, sbatch_args: tuple[str, ...], dry_run: bool) -> None:
    """Run a PLAYBOOK_FILE's design as a campaign: its shards as a Slurm job array, each
    task `netbench run PLAYBOOK_FILE --shard I/N` on a node of its own, into one campaign
    folder. Prints the job id and the folder.

    Submitting again submits only the shards with runs still missing (not those a job still
    has pending or running); a shard cancelled mid-way (scancel, the time limit) keeps every
    run it recorded. 'netbench status' shows the progress, 'netbench report' the answer.

    \b
    Example: netbench submit playbooks/ps-check.yaml --slurm --shards 2 --dry-run
    Example: netbench submit playbooks/ps-check.yaml --slurm --shards 2 --partition compute --time 1:00:00
    """
    from netbench.cluster.slurm import SlurmCluster
    from netbench.experiment import submit as campaigns
    from netbench.model import playbook as pb

    if not slurm:
        raise UsageError("name the cluster manager: --slurm (the one netbench submits to for now)",
                         hint=f"netbench submit {playbook_file} --slurm --shards {shards}")
    options = campaigns.batch_options(partition, time_limit, cpus_per_task, sbatch_args)
    book = pb.load_playbook(playbook_file)
    for line in book.notes:
        console.note(line)
    folder = output or Path("results") / book.name
    done = campaigns.submit(book, playbook_file, folder, shards, SlurmCluster(), options, dry_run=dry_run)
    from netbench.experiment.campaign import describe_split

    say = console.err.print if dry_run else console.info  # a dry run's stdout is the script alone
    say(f"campaign [bold]{escape(book.name)}[/] in {escape(str(done.campaign))}: {escape(describe_split(done.record))}")
    for shard, job in sorted(done.active.items()):
        say(f"shard {shard}: still pending or running as job {job}_{shard}; not submitted again")
    if done.finished:
        say(f"shard(s) {', '.join(map(str, done.finished))}: every run recorded; not submitted again")
    if not done.array:
        if not done.active:
            say(f"nothing left to run: 'netbench report {escape(str(folder))}' gives the answer")
        return
    if dry_run:
        say(f"[yellow]dry run[/]: the batch script for shard(s) {', '.join(map(str, done.array))} of {shards} "
            "(submitted, it is written to the campaign's slurm/ folder):")
        console.plain(done.script)
        return
    console.info(f"submitted job {done.job_id}: array task(s) {', '.join(map(str, done.array))} of {shards} shards "
                 f"({escape(str(done.script_path))})")
    console.info(f"progress: netbench status {escape(str(folder))}; the answer: netbench report {escape(str(folder))}")


@click.command("status", short_help="A campaign's runs done, failed and left, per shard.")
@click.argument("campaign_dir", type=click.Path(file_okay=False, path_type=Path))
@handle_errors
def status(campaign_dir: Path) -> None:
    """A campaign's progress, from its folder alone (also while its shards run): each
    shard's runs done, failed and left, its state and host, failures with their reasons, and
    the time left.

    \b
    Example: netbench status results/smoke-campaign
    """
    from netbench.cli.render_campaign import progress_lines
    from netbench.experiment.campaign_status import progress

    for line in progress_lines(progress(campaign_dir), campaign_dir):
        console.out.print(line)
