"""collective: time all-reduce, broadcast and all-gather on the testbed's links, per point."""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import click

from netbench.cli import common
from netbench.cli.common import BACKEND_CHOICES, handle_errors
from netbench.cli.groups import GroupedCommand, options
from netbench.cli.option_sets import Hosts, Levels, hosts_options, levels_options
from netbench.cli.types import Seconds
from netbench.errors import UsageError


def _settings(sizes: str, ops: str, warmup: int, reps: int, timeout: float):
    from netbench.experiment.collective import Settings
    from netbench.model import collective as maths

    try:
        parsed = maths.parse_sizes(sizes)
    except ValueError as exc:
        raise UsageError(f"flag --sizes: {exc}", hint="e.g. --sizes 8-64MiB or --sizes 8,1KiB,1MiB") from None
    chosen = tuple(op.strip() for op in ops.split(",") if op.strip())
    unknown = [op for op in chosen if op not in maths.OPS]
    if unknown or not chosen:
        raise UsageError(f"flag --ops: unknown {', '.join(unknown) or 'empty list'}",
                         hint=f"choose from {', '.join(maths.OPS)}")
    return Settings(sizes=parsed, ops=chosen, warmup=warmup, reps=reps, timeout_s=timeout)


def _frameworks(text: str) -> tuple[str, ...]:
    from netbench.experiment.collective import available_frameworks

    have = available_frameworks()
    if text == "auto":
        return have
    chosen = tuple(f.strip() for f in text.split(",") if f.strip())
    for name in chosen:
        if name not in ("tf", "gloo"):
            raise UsageError(f"flag --framework: unknown {name!r}", hint="choose from auto, tf, gloo")
        if name not in have:
            raise UsageError("flag --framework: gloo needs PyTorch, which this Python cannot import",
                             hint="install torch==2.13.0+cpu (PyTorch's CPU build) into netbench's environment, "
                                  "or use --framework tf")
    return chosen


def _job(workers: int, ranks_per_node: int):
    """The benchmark's placement: one process per node, or ranks_per_node of them."""
    from netbench.cli.ranks import with_ranks
    from netbench.experiment.collective import JOB

    return with_ranks(JOB, workers, ranks_per_node, "ring", "cpu", 0)


def _runs(levels, workers, job):
    from netbench.cli import sweep_topology
    from netbench.cli.experiment import _plan_runs
    from netbench.model import design
    from netbench.model.profile import Profile

    sweep_topology.check_flags(levels.topology_file, levels.scale, levels.given(), None)
    if levels.topology_file is not None:
        return sweep_topology.topology_runs(levels.topology_file, levels.scale, 1, job, workers, 0)
    base = Profile(name="base")
    return None, design.sweep_runs(_plan_runs(base, levels.sweep_levels(), 1), 1, job, workers, 0, base=base)


@click.command("collective", cls=GroupedCommand)
@levels_options
@options("Network", click.option("--backend", type=click.Choice(BACKEND_CHOICES), default="auto", show_default=True,
                                 help="Emulation backend."))
@options(
    "Nodes and compute",
    click.option("--workers", default=2, show_default=True, type=click.IntRange(2, 64),
                 help="Processes, one per node unless --ranks-per-node."),
    click.option("--ranks-per-node", default=1, show_default=True, type=click.IntRange(1, 64),
                 help="Processes on each node (nodes = workers / ranks per node); between them over the node's "
                      "loopback."),
)
@options(
    "Job",
    click.option("--sizes", default="8-64MiB", show_default=True,
                 help="Message sizes: LOW-HIGH doubling, or a list such as 8,1KiB,1MiB (per worker)."),
    click.option("--ops", default="allreduce,broadcast,allgather", show_default=True, help="Operations to time."),
    click.option("--framework", default="auto", show_default=True,
                 help="tf, gloo or tf,gloo; auto: tf, and gloo when PyTorch is importable."),
)
@options(
    "Measurement and precision",
    click.option("--warmup", default=2, show_default=True, type=click.IntRange(0, 1000),
                 help="Untimed repetitions per size."),
    click.option("--reps", default=5, show_default=True, type=click.IntRange(1, 10000),
                 help="Timed repetitions per size."),
    click.option("--timeout", default=120.0, show_default=True, type=Seconds(1, 86400),
                 help="Seconds one collective may take."),
)
@options(
    "Output and metrics",
    click.option("--output", type=click.Path(file_okay=False, path_type=Path),
                 help="Results folder [default: results/collective-<time>]."),
    click.option("--json", "as_json", is_flag=True,
                 help="Print the TensorFlow points' fits and all-reduce sizes as JSON."),
)
@hosts_options
@options("Other", click.option("--seed", default=0, show_default=True, type=click.IntRange(0, 2**32 - 1),
                               help="Seed for loss/jitter draws."))
@handle_errors
def collective(levels: Levels, backend: str, workers: int, ranks_per_node: int, sizes: str, ops: str, framework: str,
               warmup: int, reps: int, timeout: float, output: Path | None, as_json: bool, hosts: Hosts,
               seed: int) -> None:
    """Time collectives (like nccl-tests) on the testbed's links at every point.

    For each point (the product of the level flags, or a --topology), applies it as a sweep
    does, then times every operation at every size with TensorFlow's collective ops (those
    MultiWorkerMirroredStrategy runs) and with gloo when PyTorch is installed; fits the
    all-reduce's time to alpha + beta x bytes.

    With --inventory the processes run on the SSH hosts (one per host, as a sweep places
    workers) and the hosts' links are shaped; every host is put back afterwards.

    \b
    Example: netbench collective --latency 1,10ms --sizes 8-1MiB --reps 3
    Example: netbench collective --bandwidth 100mbit --ops allreduce --json
    Example: netbench collective --inventory hosts.yaml --bandwidth 100,1000mbit --sizes 8-16MiB
    """
    from netbench.cli import render_collective
    from netbench.experiment.collective import CollectiveConfig, json_report, run_collective

    settings = _settings(sizes, ops, warmup, reps, timeout)
    frameworks = _frameworks(framework)
    job = _job(workers, ranks_per_node)
    pairs, runs = _runs(levels, workers, job)
    output = output or Path("results") / time.strftime("collective-%Y%m%d-%H%M%S")
    if output.exists() and any(output.iterdir()):
        raise UsageError(f"flag --output: {output} holds files", hint="choose an empty or new folder")
    config = CollectiveConfig(runs=tuple(runs), workers=workers, output=output, settings=settings,
                              frameworks=frameworks, backend=None if backend == "auto" else backend,
                              command_line=shlex.join(["netbench", *sys.argv[1:]]), seed=seed, topology=pairs,
                              job=job)
    view = render_collective.CollectiveView(quiet=as_json)
    if hosts.inventory is None:
        common.check_local_flags(None, hosts.insecure_host_keys, takeover=hosts.takeover)
        common.require_testbed("sweeps")
        config = replace(config, run_as=common.job_user(None))  # with sudo: the user who ran it
        common.sigterm_as_interrupt()
        try:
            points = run_collective(config, view)
        finally:
            common.hand_over(config.output, config.run_as)
    else:  # the controller needs no root: the hosts shape their own links
        from netbench.testbed.targets import open_target

        with open_target(hosts.inventory, hosts.insecure_host_keys, config.backend, takeover=hosts.takeover) as target:
            common.sigterm_as_interrupt()
            points = run_collective(config, view, testbed=target)
    if as_json:
        render_collective.as_json(json_report(points, frameworks[0]))
    else:
        render_collective.done(output)
