"""A sweep's user command: ``netbench sweep [points...] -- COMMAND [ARGS...]`` (click only)."""

from __future__ import annotations

from dataclasses import dataclass

import click

from netbench.cli.groups import ENDS_WITH_DASHES, option_set
from netbench.errors import UsageError


@dataclass(frozen=True)
class UserCommandFlags:
    """COMMAND after '--' (empty: netbench's own job), --images-per-step and --step-regex."""

    user_command: tuple[str, ...]
    images_per_step: int | None
    step_regex: str | None

    def apply(self, job, *, workers: int, verify: bool, schedules: tuple, topology):
        """`job` running the command (with_command)."""
        return with_command(job, self.user_command, self.images_per_step, self.step_regex, workers=workers,
                            verify=verify, schedules=schedules, topology=topology)


# the command receives them as `command`, a UserCommandFlags
command_options = option_set(
    UserCommandFlags, "command", "Your own command",
    click.option("--images-per-step", type=click.IntRange(1, 2**31), metavar="N",
                 help="With a COMMAND: images the whole cluster trains on per step [default: what "
                      "netbench.track's events say]."),
    click.option("--step-regex", metavar="REGEX",
                 help="With a COMMAND that does not use netbench.track: one step per line of rank 0's "
                      "output that matches (named groups 'step', and 'seconds' or 'ms'; without a time "
                      "group, the time between lines)."),
    click.argument("user_command", nargs=-1, type=click.UNPROCESSED, metavar="[-- COMMAND [ARGS]...]"),
)


def with_command(job, argv: tuple[str, ...], images_per_step: int | None, step_regex: str | None, *,
                 workers: int, verify: bool, schedules: tuple, topology) -> object:
    """`job` running the user's command `argv` (the job itself when there is none); a flag
    that needs a command, or that a command cannot take, is a UsageError naming it."""
    from netbench.model.command_job import UserCommand, check_command
    from netbench.model.frameworks import DEFAULT_FRAMEWORK
    from netbench.model.job import command_spec

    if not argv:
        context = click.get_current_context(silent=True)
        if context is not None and context.meta.get(ENDS_WITH_DASHES):
            raise UsageError("nothing after '--': give the COMMAND to run there, or drop '--' to train "
                             "netbench's own job", hint="e.g. netbench sweep --latency 1,20ms -- python train.py")
        for flag, value in (("--images-per-step", images_per_step), ("--step-regex", step_regex)):
            if value:
                raise UsageError(f"flag {flag}: only with a COMMAND", hint="e.g. netbench sweep --latency 1,20ms "
                                 "--workers 2 -- python train.py")
        return job
    if job.framework != DEFAULT_FRAMEWORK:  # it picks netbench's own workload; a COMMAND is the user's
        raise UsageError(f"flag --framework: {job.framework} picks netbench's built-in workload, not a COMMAND's",
                         hint="drop --framework: a COMMAND runs as given, and every rank has torchrun's and "
                              "TF_CONFIG's variables whatever its framework")
    for flag, value in (("--verify", verify), ("--schedule", schedules)):
        if value:  # a user's command runs in launches, which neither verify nor drive schedules
            raise UsageError(f"flag {flag}: not with a COMMAND (yet)", hint="sweep --latency, --bandwidth, "
                             "--loss or --jitter levels, or a --topology, with a COMMAND")
    command = UserCommand(argv=tuple(argv), images_per_step=images_per_step, step_regex=step_regex or "")
    try:
        check_command(command)
    except ValueError as exc:
        raise UsageError(f"flag --{exc}") from None
    return command_spec(job, command, workers)


def command_plan_lines(job, workers: int) -> list[str]:
    """A dry run's lines for a job that runs a user's command: where its steps come from, then
    each rank's node, command line and environment (none for netbench's own jobs)."""
    from netbench.model import topology
    from netbench.model.command_job import describe_source
    from netbench.model.job import describe_plan, nodes_needed, plan_job

    if job is None or job.command is None:
        return []
    nodes = topology.plan_topology(nodes_needed(job, workers), topology.choose_subnet([])).nodes
    return [describe_source(job.command, job.warmup, job.seconds),
            f"placement on {len(nodes)} nodes (each launch on a fresh port):",
            *("  " + line for line in describe_plan(plan_job(job, nodes, workers, port=0)))]
