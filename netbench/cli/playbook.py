"""The playbook command: run (a whole experiment design from a playbook file), resumable, on
the embedded testbed or with --inventory on SSH hosts, under the live view."""

from __future__ import annotations

import shlex
import sys
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import click
from rich.markup import escape

from netbench import console
from netbench.cli import common
from netbench.cli.common import BACKEND_CHOICES, _sigterm_as_interrupt, handle_errors
from netbench.cli.experiment import _print_launches, _run_on_hosts, _run_with_view
from netbench.cli.groups import GroupedCommand, options
from netbench.cli.types import ShardParam
from netbench.experiment import campaign
from netbench.experiment.campaign import ShardLock
from netbench.cli.option_sets import (Hosts, Launch, Metrics, Probes, congestion_option, hosts_options,
                                      run_as_option,
                                      launch_options, metrics_options, probes_options)

def _playbook_state(output: Path) -> dict | None:
    from netbench.experiment.store import ResultStore

    return ResultStore(output).read_playbook()


@click.command("run", cls=GroupedCommand,
               short_help="Run a playbook: an experiment design in YAML; resumes.")
@click.argument("playbook_file", type=click.Path(dir_okay=False, path_type=Path))
@options("Network", click.option("--backend", type=click.Choice(BACKEND_CHOICES),
                                 help="Override the playbook's emulation backend."))
@congestion_option
@run_as_option
@probes_options
@options(
    "Output and metrics",
    click.option("--output", type=click.Path(file_okay=False, path_type=Path),
                 help="Results folder [default: results/<playbook name>]; an existing one resumes."),
    click.option("--dry-run", is_flag=True, help="List the runs in order (and which are already done); run none."),
    click.option("--shard", type=ShardParam(), default=None,
                 help="Run shard I (0 to N-1) of N of a campaign: a share of the design into --output's shard-I/ "
                      "(whole repetitions; points by estimated time where repetitions are fewer than N)."),
)
@metrics_options
@launch_options
@hosts_options
@handle_errors
def run_playbook(playbook_file: Path, backend: str | None, congestion_control: str | None, run_as: str | None,
                 probes: Probes,
                 output: Path | None, dry_run: bool, shard, metrics: Metrics, launch: Launch, hosts: Hosts) -> None:
    """Run a PLAYBOOK_FILE: a whole experiment design (factors, repetitions, run order).

    An interrupted playbook resumes: run it again with the same results folder and the
    runs already recorded as ok or timeout are skipped. The run order's seed is recorded.
    Exits 1 when any run of this session failed (a timeout is a result, not a failure).
    With --shard I/N it runs one shard of a campaign (netbench submit runs them on a cluster).

    \b
    Example: netbench run playbooks/smoke.yaml --dry-run
    Example: netbench run playbooks/smoke.yaml --inventory hosts.yaml
    Example: netbench run playbooks/smoke.yaml --congestion-control cubic --output results/smoke-cubic --dry-run
    Example: netbench run playbooks/smoke.yaml --shard 0/2 --output results/smoke-campaign --dry-run
    """
    from netbench.experiment.store import ResultStore
    from netbench.model import design
    from netbench.model import playbook as pb

    metrics_wait_s = metrics.wait_s()
    inventory = hosts.inventory
    book = pb.load_playbook(playbook_file)
    for line in book.notes:  # an old key's spelling: it works, and says its name now
        console.note(line)
    where = f"{book.source}: congestion_control"
    if congestion_control:  # the flag stands for the key, in the design's digest too
        book, where = replace(book, congestion_control=congestion_control), "flag --congestion-control"
    output = output or Path("results") / book.name
    output, seed, runs, part = _design_runs(book, output, shard, dry_run, probes.sample_resources or 0.0)
    try:  # a shard refused before it runs leaves nothing of the campaign it began
        state = _playbook_state(output)
        store = ResultStore(output)
        statuses = store.statuses()
        design.check_resume(book, runs, state, output, has_runs=bool(statuses))
        todo = design.pending(runs, statuses)
        if inventory is None:  # the kernel's list: no root needed
            common.check_congestion(book.congestion_control, where, dry_run=True)
        from netbench.model.run import check_step_delays

        check_step_delays(runs)  # a dry run refuses what the run would
        if dry_run:
            if part is not None:
                console.info(f"shard {part.shard} of the campaign in {escape(str(output.parent))}: "
                             f"{escape(campaign.describe_split(part.record))}")
            _print_playbook_plan(book, seed, runs, statuses, output, part)
            _print_launches(todo, design.order_seed(book, seed), launch.settings(), book.step_timeout_s)
            return
        from netbench.jobs import worker
        from netbench.model import job as cluster
        from netbench.jobs.launch import Timeouts

        design.check_supported(book, runs, getattr(cluster, "STRATEGIES", ("allreduce",)), worker.MODELS)
        _check_data_fits(book, runs)
        plans = tuple(todo)
        if not plans:
            console.info(f"playbook [bold]{escape(book.name)}[/]: all {len(runs)} runs are done in {escape(str(output))}; "
                         f"'netbench report {escape(str(output))}' summarises them")
            return
        from netbench.cli.sweep_topology import check_playbook

        check_playbook(book, runs, inventory)
        if inventory is None:
            hosts.refuse_without_inventory()
            common.require_testbed("sweeps")
            common.check_congestion(book.congestion_control, where)
        elif run_as is not None:
            from netbench.errors import UsageError

            raise UsageError("flag --run-as: not with --inventory: each host runs its jobs as the SSH user")
        job_user = common.job_user(run_as) if inventory is None else None
        _sigterm_as_interrupt()
        from netbench.experiment.runner import SweepConfig

        chosen = backend if backend else book.backend
        config = SweepConfig(sweep_id=f"playbook-{book.name}" + (f"-shard{shard.index}of{shard.count}" if shard else ""),
                             shard=str(shard or ""), runs=plans, job=plans[0].job,
                             workers=max(r.workers for r in todo), output=output,
                             backend=None if chosen in (None, "auto") else chosen,
                             timeouts=Timeouts(startup_s=book.startup_timeout_s, step_s=book.step_timeout_s),
                             command_line=shlex.join(["netbench", *sys.argv[1:]]), seed=seed,
                             verify=probes.verify_points, order_seed=design.order_seed(book, seed),
                             topology=book.topology, predict=probes.predict,
                             congestion_control=book.congestion_control, recalibrate=probes.recalibrate,
                             run_as=job_user, **launch.settings())
        if inventory is not None:
            from netbench.testbed.hosts import check_on_hosts

            check_on_hosts(config, inventory)  # before the results folder is written
    except BaseException:
        if part is not None and part.opened is not None:
            part.opened.undo()
        raise
    with ShardLock(output) if part is not None else nullcontext():
        record = design.plan_record(book, seed, runs)
        if part is not None:
            record.update(shard=str(shard), campaign=str(output.parent), extra_runs=list(part.extra))
        record["sessions"] = (state or {}).get("sessions", []) + [{"started": time.time(), "pending": len(todo)}]
        store.write_playbook(record, playbook_file.read_text(encoding="utf-8"))
        console.info(f"playbook [bold]{escape(book.name)}[/]: " + (f"shard {shard} of a campaign, " if shard else "")
                     + f"{len(runs)} runs, seed {seed}; {len(runs) - len(todo)} already done, {len(todo)} to run")

        if inventory is not None:
            results = _run_on_hosts(config, inventory, hosts.insecure_host_keys, False, metrics.metrics_port,
                                    metrics.metrics_address, hosts.takeover, metrics_wait_s)
        else:
            try:
                results = _run_with_view(config, metrics.metrics_port, metrics.metrics_address,
                                         metrics_wait_s=metrics_wait_s)
            finally:
                common.hand_over(output.parent if part is not None else output, job_user)
        record["sessions"][-1].update(ended=time.time(), completed=len(results))
        store.write_playbook(record)
    common.hand_over(output.parent if part is not None else output, job_user)
    shown = output.parent if part is not None else output
    console.info(f"{'progress: netbench status ' + escape(str(shown)) + '; ' if part is not None else ''}"
                 f"figures and a summary: netbench report {escape(str(shown))}")
    common.fail_if_any_failed(results)


def _design_runs(book, output: Path, shard, dry_run: bool, sample_resources_s: float):
    """(results folder, seed, runs, shard plan) of a session: the design's runs into `output`;
    with `shard`, the shard's share of them into its folder in the campaign `output`, the
    campaign's record made first where there is none (not by a dry run)."""
    import random as _random

    from netbench.model import design

    if shard is None:
        campaign.refuse_campaign(output)
        seed = book.seed if book.seed is not None else (_playbook_state(output) or {}).get("seed")
        seed = _random.SystemRandom().randrange(2**31) if seed is None else seed
        return output, seed, design.expand(book, seed, sample_resources_s=sample_resources_s), None
    opened = campaign.open_campaign(book, output, shard.count, write=not dry_run,
                                    sample_resources_s=sample_resources_s)
    part = campaign.shard_plan(output, shard, opened.runs, opened.record, opened)
    return part.folder, opened.seed, part.runs, part


def _print_playbook_plan(book, seed: int, runs, statuses: dict, output: Path, part=None) -> None:
    from rich.table import Table

    from netbench.model import design
    from netbench.model import playbook as pb

    done = sum(1 for r in runs if statuses.get(r.run_id) in design.COMPLETE_STATUSES)
    seed_note = "" if book.seed is not None else " (drawn: the playbook sets none; recorded in the results folder)"
    seed_note += f", order seed {book.order_seed}" if book.order_seed is not None else ""
    if part is None:
        size = f"{len(runs)} runs = {len(runs) // book.repetitions} points x {book.repetitions} repetitions"
    else:
        design_runs = sum(1 for e in part.record["runs"] if not e.get("reference"))
        size = f"{len(runs)} runs of the design's {design_runs} (shard {part.shard}" + \
            (f", {len(part.extra)} of them an extra run of the reference point)" if part.extra else ")")
    console.info(f"[yellow]dry run[/]: playbook [bold]{escape(book.name)}[/] ({escape(book.source)}): {size}, "
                 f"order {book.order}, seed {seed}{seed_note}")
    console.info(f"{book.warmup} warm-up + " + (f"{book.seconds:g} s of" if book.seconds else f"{design.book_steps(book)}")
                 + f" measured steps per run; timeouts: startup {book.startup_timeout_s:g}s, step "
                 f"{book.step_timeout_s:g}s; results -> {escape(str(output))} ({done} done, {len(runs) - done} to run)")
    from netbench.model.congestion import plan_line

    console.plain(plan_line(book.congestion_control, "session"))
    keys = [k for k, _ in book.factors] + [k for entry in book.extra_runs for k, _ in entry] + \
        (["schedule"] if book.schedules else [])
    shown = list(dict.fromkeys(keys))
    table = Table(box=None)
    for col in ("run", "point", "rep", *shown, "nodes", "profile", "state"):
        table.add_column(col)
    for run in runs:
        cells = design.describe_settings(run.settings)
        table.add_row(run.run_id, str(run.point), str(run.repeat), *(escape(design.setting_cell(cells, k)) for k in shown),
                      str(run.settings.nodes), escape(run.profile.name), escape(statuses.get(run.run_id, "to run")))
    console.out.print(table)
    from netbench.model.algorithm_keys import OWNERS

    for key in (k for k in shown if k in OWNERS):  # an algorithm's setting: which runs it changes
        console.plain(f"{key}: strategy {OWNERS[key]}'s setting; '-': a run whose strategy does not use it "
                      "(one point, not one per level)")
    from netbench.cli.render import schedule_plan_line

    shown_schedules = {}
    for run in runs:
        if run.schedule is not None:
            shown_schedules.setdefault(run.schedule.name, schedule_plan_line(run.schedule, run.timeline))
    for line in shown_schedules.values():
        console.plain(line)
    from netbench.cli.user_job import command_plan_lines

    commands = {(run.job, run.workers): None for run in runs if run.job is not None and run.job.command is not None}
    for job, workers in commands:  # a playbook's command: what each rank runs, once per job and worker count
        for line in command_plan_lines(job, workers):
            console.plain(line)
    from netbench.jobs import worker
    from netbench.model import job as cluster
    from netbench.model.job import JobSpec

    try:  # a design may be ahead of this build (a strategy or model still to come): say so now
        design.check_supported(book, runs, getattr(cluster, "STRATEGIES", ("allreduce",)), worker.MODELS)
        for run in runs:
            design.job_fields(book, run.settings, design.fields_of(JobSpec))
    except pb.PlaybookError as exc:
        console.info(f"[yellow]not runnable by this netbench yet[/]: {escape(exc.message)}")


def _check_data_fits(book, runs) -> None:
    """A run whose model cannot take its data (jobs.harness.data.check_fits), named by the key
    that sets the model, before the first run."""
    from netbench.jobs.harness import data as datasets
    from netbench.model import playbook as pb

    for run in runs:
        if run.settings.strategy == "command":
            continue
        try:
            datasets.check_fits(run.settings.model, run.settings.data)
        except datasets.DataError as exc:
            raise pb.fail(book.source, book.where("model"), str(exc), hint="model mlp with data fashion-mnist") from None
