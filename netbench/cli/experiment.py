"""Experiment commands: sweep (levels from flags) and run (a playbook), on the embedded
testbed or with --inventory on SSH hosts, under the live view (render.SweepView)."""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import click
from rich.markup import escape

from netbench import console
from netbench.cli import common
from netbench.cli.algorithm_options import Algorithm, algorithm_options, finish_job
from netbench.cli.common import BACKEND_CHOICES, _sigterm_as_interrupt, handle_errors
from netbench.cli.framework import check_framework, require_framework
from netbench.cli.groups import GroupedCommand, options
from netbench.cli.option_sets import (Hosts, Launch, Levels, Metrics, Precision, Probes, congestion_option, run_as_option,
                                      hosts_options, launch_options, levels_options, metrics_options,
                                      precision_options, probes_options)
from netbench.cli.ranks import Ranks, ranks_options, require_device
from netbench.cli.save_playbook import save as save_playbook_file, save_option
from netbench.cli.sweep_options import (Compute, Training, Window, compute_options, training_options,
                                        window_options)
from netbench.cli.user_job import UserCommandFlags, command_options
from netbench.errors import UsageError
from netbench.model.profile import Profile, load_profile

# ---------------------------------------------------------------- sweep


@click.command("sweep", cls=GroupedCommand,
               short_help="Train at every combination of network levels; record each run.")
@options("Network", click.option("--profile", "profile_file", type=click.Path(dir_okay=False, path_type=Path),
                                 help="Base profile; swept flags replace its values."))
@levels_options
@options(
    "Network",
    click.option("--schedule", "schedule_files", multiple=True, metavar="FILE[,FILE]",
                 help="A schedule (YAML) the link follows during a run; each is one more point after the "
                      "--latency/... grid (or the only points without one), starting from --profile. Repeatable."),
    click.option("--backend", type=click.Choice(BACKEND_CHOICES), default="auto", show_default=True,
                 help="Emulation backend."),
)
@congestion_option
@run_as_option
@options("Nodes and compute", click.option(
    "--workers", type=click.IntRange(1, 64),
    help="Training workers (ranks), one per node unless --ranks-per-node [default: 2; 1 with single]."))
@ranks_options
@compute_options
@training_options
@window_options
@precision_options
@probes_options
@options(
    "Output and metrics",
    click.option("--output", type=click.Path(file_okay=False, path_type=Path),
                 help="Results folder [default: results/<sweep-id>]; one that holds files is refused without --append."),
    click.option("--append", is_flag=True,
                 help="Add this sweep's runs to a --output folder that holds results (numbered after its runs)."),
    click.option("--dry-run", is_flag=True, help="Print the planned runs and changes; make none."),
    save_option,
)
@metrics_options
@command_options
@algorithm_options
@launch_options
@options("Launch and settle", click.option(
    "--order-seed", type=click.IntRange(0, 2**31 - 1),
    help="Seed of the points' order within each launch (ties under --order descending) "
         "[default: drawn; recorded in the manifest]."))
@hosts_options
@options("Other", click.option("--seed", default=0, show_default=True, type=click.IntRange(0, 2**32 - 1),
                               help="Seed for loss/jitter draws and data (0 to 2^32-1)."))
@handle_errors
def sweep(profile_file: Path | None, levels: Levels, schedule_files: tuple[str, ...], backend: str,
          congestion_control: str | None, run_as: str | None, workers: int | None, ranks: Ranks, compute: Compute, training: Training,
          window: Window, precision: Precision, probes: Probes, output: Path | None, append: bool, dry_run: bool,
          save_playbook: Path | None, metrics: Metrics, command: UserCommandFlags, algorithm: Algorithm,
          launch: Launch, order_seed: int | None, hosts: Hosts, seed: int) -> None:
    """Train under every combination of the swept levels and record images/sec.

    Runs the cartesian product of --latency, --bandwidth, --loss and --jitter levels,
    --repeat times each. A unit on the last level applies to the bare numbers before it.
    The job's processes start once per repetition (a launch) and move through the points, each
    applied in place, each change only narrowing the path (--order); --isolate starts them anew
    for every point. docs/background/launches.md says what a shared launch carries over and how it settles.
    After '--', your own COMMAND runs once per node instead (docs/guide/your-own-job.md):
    its steps come from netbench.track or --step-regex; with neither, netbench measures the
    bytes on each node's link over --seconds after --warmup seconds, and says so.

    Exits 1 when any run failed (a timeout is a result, not a failure), after recording every run.

    \b
    Example: netbench sweep --latency 1,10,100ms --repeat 2
    Example: netbench sweep --latency 1ms --cpus n2=max,0.5,0.2 --step-delay n2=0,40ms
    Example: netbench sweep --latency 1,10,50ms --bandwidth 100mbit,1gbit --precision 2%
    Example: netbench sweep --bandwidth 100mbit --latency 1ms --precision 2% --congestion-control cubic
    Example: netbench sweep --strategy ps --ps 1 --workers 3 --bandwidth 100,1000mbit
    Example: netbench sweep --inventory hosts.yaml --bandwidth 100,1000mbit
    Example: netbench sweep --schedule profiles/schedules/spike.yaml --latency 10ms
    Example: netbench sweep --topology profiles/topologies/world.yaml --workers 8 --scale 1,2
    Example: netbench sweep --strategy ps-ssp --staleness 3 --data fashion-mnist --train-steps 200 --latency 1,50ms
    Example: netbench sweep --latency 1,20ms --workers 2 -- python examples/torch_ddp.py
    Example: netbench sweep --framework torch --model mlp --latency 1,20ms --workers 2
    Example: netbench sweep --framework torch --latency 1,20ms --workers 4 --ranks-per-node 2 --collective hierarchical
    """
    from netbench.model import design as sweep_plan
    from netbench.experiment import store as results

    window.check()
    metrics_wait_s = metrics.wait_s()
    from netbench.cli import sweep_topology

    inventory = hosts.inventory
    sweep_topology.check_flags(levels.topology_file, levels.scale, {"--profile": profile_file, **levels.given(),
                               "--schedule": schedule_files}, inventory)
    base = load_profile(profile_file) if profile_file else Profile(name="base")
    swept_levels = levels.sweep_levels()
    if levels.topology_file is not None:
        compute.refuse_with_topology()
    computes = compute.points(inventory)
    schedules = _load_schedules(schedule_files)
    if schedules and inventory is not None:
        raise UsageError("flag --schedule: not with --inventory: schedules run on the embedded testbed only",
                         hint="drop --inventory, or sweep static levels on the hosts")
    points = (_plan_runs(base, swept_levels, window.repeat, len(schedules), len(computes))
              if levels.swept or not schedules else ())
    sweep_id = time.strftime("sweep-%Y%m%d-%H%M%S")
    output = output or Path("results") / sweep_id
    try:  # a second sweep into a folder would overwrite its runs/r000.json and mix its results.csv
        first = results.first_run_index(output, append)
    except results.ResultsError as exc:
        raise UsageError(f"flag --output: {exc.message}", exc.hint) from None
    from netbench.model.job import nodes_needed, window_steps

    precise = precision.settings()
    config_job, workers = _job_from_flags(training, workers, warmup=window.warmup, seconds=window.seconds, seed=seed,
                                          steps=window_steps(window.steps, precise["precision"], window.seconds),
                                          sample_resources_s=probes.sample_resources or 0.0,
                                          **algorithm.job_fields(), **precise)
    config_job = command.apply(config_job, workers=workers, verify=probes.verify_points, schedules=schedule_files,
                               topology=levels.topology_file)
    config_job = ranks.apply(config_job, workers)
    _check_nodes(config_job, workers)
    _check_placed(compute, schedules, nodes_needed(config_job, workers))
    if inventory is None and not dry_run and not command.user_command:
        require_framework(training.framework)
        require_device(ranks.device)
    pairs = None
    if levels.topology_file is not None:
        pairs, runs = sweep_topology.topology_runs(levels.topology_file, levels.scale, window.repeat, config_job,
                                                   workers, first)
    else:
        try:
            runs = sweep_plan.sweep_runs(points, window.repeat, config_job, workers, first, schedules=schedules,
                                         base=base, computes=computes)
        except UsageError as exc:
            raise UsageError(f"flag --schedule: {exc.message}", exc.hint) from None
    from netbench.experiment.runner import SweepConfig

    config = SweepConfig(sweep_id=sweep_id, runs=tuple(runs), job=config_job, workers=workers,
                         output=output,
                         backend=None if backend == "auto" else backend,
                         timeouts=window.timeouts(),
                         command_line=shlex.join(["netbench", *sys.argv[1:]]), seed=seed, verify=probes.verify_points,
                         order_seed=order_seed, topology=pairs, predict=probes.predict,
                         congestion_control=congestion_control, recalibrate=probes.recalibrate, **launch.settings())
    from netbench.model.run import check_step_delays

    check_step_delays(config.runs)  # a dry run refuses what the run would
    if save_playbook is not None:  # written before anything runs, checked to give the same runs
        save_playbook_file(save_playbook, config, swept_levels, click.get_current_context().params)
    if inventory is not None:
        if run_as is not None:
            raise UsageError("flag --run-as: not with --inventory: each host runs its jobs as the SSH user")
        common.fail_if_any_failed(_run_on_hosts(config, inventory, hosts.insecure_host_keys, dry_run,
                                                metrics.metrics_port, metrics.metrics_address, hosts.takeover,
                                                metrics_wait_s))
        return
    hosts.refuse_without_inventory()
    common.check_congestion(congestion_control, dry_run=True)  # the kernel's list: no root needed
    if dry_run:
        _print_sweep_plan(replace(config, run_as=common.job_user(run_as)))
        return
    common.require_testbed("sweeps")
    common.check_congestion(congestion_control)
    config = replace(config, run_as=common.job_user(run_as))
    _sigterm_as_interrupt()
    try:
        results = _run_with_view(config, metrics.metrics_port, metrics.metrics_address, metrics_wait_s=metrics_wait_s)
    finally:
        common.hand_over(config.output, config.run_as)
    common.fail_if_any_failed(results)


def _run_on_hosts(config, inventory: Path, insecure: bool, dry_run: bool, metrics_port, metrics_address,
                  takeover: bool = False, metrics_wait_s: float = 0.0) -> list:
    """A sweep or playbook on the inventory's SSH hosts (the controller needs no root)."""
    from netbench.testbed.targets import hosts_testbed

    with hosts_testbed(inventory, insecure, config, takeover) as hosts:
        if dry_run:
            print_hosts_plan(config, hosts.inventory)
            return []
        _sigterm_as_interrupt()
        return _run_with_view(config, metrics_port, metrics_address, testbed=hosts, metrics_wait_s=metrics_wait_s)


def _check_placed(compute: Compute, schedules: tuple, nodes: int) -> None:
    """A --cpus or --step-delay level, or a --schedule step's, for a node that holds none of the
    job's processes is refused before anything is applied (it would be recorded, not applied)."""
    from netbench.model.schedule import check_placed

    compute.check_placed(nodes)
    for schedule in schedules:
        try:
            check_placed(schedule, nodes)
        except UsageError as exc:
            raise UsageError(f"flag --schedule: {exc.message}", exc.hint) from None


def _load_schedules(values) -> tuple:
    """Every --schedule file (repeatable, or a comma list), loaded; one name per schedule."""
    from netbench.model.schedule import load_schedule

    paths = [part.strip() for value in values for part in value.split(",")]
    if any(not path for path in paths):
        raise UsageError("flag --schedule: an empty file name in the list", hint="e.g. --schedule a.yaml,b.yaml")
    schedules, names = [], {}
    for path in paths:
        try:
            schedule = load_schedule(path)
        except UsageError as exc:
            raise UsageError(f"flag --schedule: {exc.message}", exc.hint) from None
        if schedule.name in names:
            raise UsageError(f"flag --schedule: {path} and {names[schedule.name]} are both named "
                             f"{schedule.name!r}; a schedule names its point",
                             hint="give one of them another 'name:'")
        names[schedule.name] = path
        schedules.append(schedule)
    return tuple(schedules)


def _run_with_view(config, metrics_port, metrics_address, testbed=None, metrics_wait_s: float = 0.0) -> list:
    """run_sweep under the live terminal view, serving metrics when a port is given (and, with
    `metrics_wait_s`, waiting up to that long for a first scrape before the first run)."""
    from netbench.metrics import serving
    from netbench.experiment.runner import run_sweep
    from netbench.cli.render import SweepView

    with serving(metrics_port, metrics_address or "127.0.0.1") as metrics, \
            SweepView(config, metrics_url=metrics.url if metrics else None) as view:
        for warning in metrics.warnings if metrics else ():
            view.warn(warning)
        if metrics and metrics_wait_s > 0 and not metrics.wait_for_scrape(metrics_wait_s):
            view.warn(f"no scrape of {metrics.url} within {metrics_wait_s:g}s; running anyway")
        results = run_sweep(config, metrics.observe(view) if metrics else view, testbed=testbed)
    view.summary(results)
    return results


def _job_from_flags(training: Training, workers: int | None, **rest):
    """The JobSpec and worker count the sweep flags ask for (`rest`: JobSpec's other fields);
    bad input names its flag."""
    from netbench.jobs.harness import data as datasets
    from netbench.model.job import JobSpec
    from netbench.jobs.harness.models import DEFAULT_CLASSES, DEFAULT_INPUT_SHAPES, check_input, parse_input_shape

    strategy, model, data, input_shape, classes = (training.strategy, training.model, training.data,
                                                   training.input_shape, training.classes)
    if strategy == "single" and workers not in (None, 1):
        raise UsageError(f"flag --workers: strategy single runs one process, got {workers}",
                         hint="drop --workers, or choose --strategy allreduce")
    check_framework(training.framework, strategy, model)
    workers = workers or (1 if strategy == "single" else 2)
    shape = None
    if input_shape:
        try:
            shape = parse_input_shape(input_shape)
        except ValueError as exc:
            raise UsageError(f"flag --input-shape: {exc}", hint="e.g. --input-shape 32x32x3") from None
    try:
        datasets.check_source(data)
    except datasets.DataError as exc:
        raise UsageError(f"flag --data: {exc}") from None
    try:
        datasets.check_fits(model, data)
    except datasets.DataError as exc:
        raise UsageError(f"flag --model: {exc}", hint="--model mlp with --data fashion-mnist, or the model "
                         "with --data synthetic, an .npz or a folder of images") from None
    if data == datasets.SYNTHETIC:
        try:
            check_input(model, shape or DEFAULT_INPUT_SHAPES[model], classes or DEFAULT_CLASSES)
        except ValueError as exc:
            raise UsageError(f"flag --input-shape: {exc}") from None
    if data not in (datasets.SYNTHETIC, datasets.FASHION_MNIST):
        data = str(Path(data).resolve())  # workers start elsewhere
    return finish_job(JobSpec(strategy=strategy, model=model, accum_steps=training.accum_steps, ps=training.ps_count,
                              data=data, input_shape=shape, classes=classes, batch_size=training.batch_size,
                              framework=training.framework, **rest), workers), workers


def _check_nodes(job, workers: int) -> None:
    """The testbed holds at most MAX_NODES nodes: workers and parameter servers together."""
    from netbench.model.job import nodes_needed
    from netbench.model.topology import MAX_NODES

    needed = nodes_needed(job, workers)
    if needed > MAX_NODES:
        raise UsageError(f"flag --workers: {workers} workers" + (f" and {job.ps} parameter servers" if job.ps
                         and needed > workers else "") + f" need {needed} nodes, more than the {MAX_NODES} a "
                         "testbed has", hint="fewer --workers or --ps, or more --ranks-per-node")


def _plan_runs(base, levels, repeat, schedules=0, computes=1):
    from netbench.model import design as sweep_plan
    from netbench.model.run import check_size
    from netbench.errors import ProfileError

    grid = 1
    for values in (levels.delay_us, levels.rate_bps, levels.loss, levels.jitter_us):
        grid *= max(1, len(values))
    check_size((grid * computes, schedules * computes), repeat,
               "flags --latency, --bandwidth, --loss, --jitter, --schedule, --cpus, --step-delay and --repeat")
    try:
        return sweep_plan.sweep_points(base, levels)
    except ProfileError as exc:
        # the swept value came from a flag; say which
        raise ProfileError(exc.message.replace("sweep: delay", "flag --latency").replace(
            "sweep: rate", "flag --bandwidth").replace("sweep: jitter", "flag --jitter").replace(
            "sweep: loss", "flag --loss"), exc.hint) from None


def _print_sweep_plan(config) -> None:
    from netbench.cli.sweep_topology import plan_lines, testbed_size
    from netbench.model.job import describe_algorithm, describe_plan, nodes_needed, plan_job
    from netbench.model import topology

    topo = topology.plan_topology(testbed_size(nodes_needed(config.job, config.workers), config.topology),
                                  topology.choose_subnet([]))
    accum = f" ({config.job.accum_steps} batches per all-reduce)" if config.job.strategy == "allreduce-accum" else ""
    framework = "" if config.job.framework == "tensorflow" else f"framework {config.job.framework}, "
    console.info(f"[yellow]dry run[/]: {len(config.runs)} runs, {framework}strategy {config.job.strategy}{accum}, "
                 f"{config.workers} workers, "
                 f"model {config.job.model}, batch {config.job.batch_size}/worker, "
                 f"{config.job.warmup} warm-up + "
                 + (f"{config.job.seconds:g} s of" if config.job.seconds else f"{config.job.steps}")
                 + f" measured steps{common.precision_note(config.job)}; results -> {escape(str(config.output))}")
    if config.job.command is not None:
        from netbench.cli.user_job import command_plan_lines

        for line in command_plan_lines(config.job, config.workers):
            console.plain(line)
    else:
        console.plain(f"placement on {len(topo.nodes)} nodes (each run on a fresh port):")
        for line in describe_plan(plan_job(config.job, topo.nodes, config.workers, port=0)):
            console.plain("  " + line)
    for line in describe_algorithm(config.job, config.workers):
        console.plain(line)
    from netbench.model.congestion import plan_line

    console.plain(plan_line(config.congestion_control, "sweep"))
    from netbench.cli.render import schedule_plan_line

    for run in config.runs:
        console.plain(f"{run.run_id}  {run.profile.name}  repeat {run.repeat}")
        for line in plan_lines(run, topo, config.backend or "userspace", seed=config.seed + 100 * run.index):
            console.plain("    " + line)
        if run.compute.limited:
            console.plain(f"    compute: {run.compute.label()} (a CPU limit is a cgroup quota per node)")
        if run.schedule is not None:
            console.plain("    " + schedule_plan_line(run.schedule, run.timeline))
        if config.verify:
            console.plain(f"    verify: {topo.nodes[0].name} -> {topo.nodes[1].name}, "
                          f"{verify_settings_text()}" if len(topo.nodes) > 1 else "    verify: skipped (one node)")
    _print_launches(config.runs, config.order_seed, {"isolate": config.isolate, "order": config.order,
                                                     "settle": config.settle}, config.timeouts.step_s)


def _print_launches(runs, seed: int | None, launches: dict, step_timeout_s: float) -> None:
    """A dry run's launches (`launches`: common.launch_settings) and the design's estimated wall time."""
    from netbench.cli.render_estimate import design_estimate
    from netbench.experiment.launch import describe_launches

    isolate = launches["isolate"] or bool(runs) and all(r.job.train_steps for r in runs)
    for line in describe_launches(runs, seed, isolate, launches["order"]):
        console.plain(line)
    design_estimate(runs, isolate, launches["settle"], step_timeout_s, order=launches["order"])


def verify_settings_text() -> str:
    from netbench.experiment.verify import QUICK

    return (f"{QUICK.ping_count} pings every {QUICK.ping_interval_s:g} s"
            f" and {QUICK.iperf_seconds:g} s of iperf3 where a rate is set")


def print_hosts_plan(config, inventory) -> None:
    """A sweep's dry run over hosts: placement on hosts and each run's profile; no host is
    contacted, so the changes are listed only when --backend names the hosts' backend."""
    from netbench.remote import controller as remote
    from netbench.model.job import describe_plan, plan_job
    from netbench.testbed.hosts import host_node, place_hosts

    console.info(f"[yellow]dry run[/]: {len(config.runs)} runs on the hosts of {escape(inventory.path)}, strategy "
                 f"{config.job.strategy}, {config.workers} workers, model {config.job.model}; "
                 f"results -> {escape(str(config.output))}")
    nodes = tuple(host_node(h) for h in place_hosts(inventory, config.job, config.workers))
    console.plain("placement on hosts (tf_address; each run on a fresh port):")
    for line in describe_plan(plan_job(config.job, nodes, config.workers, port=0)):
        console.plain("  " + line)
    topology = remote.hosts_topology(inventory)
    for run in config.runs:
        console.plain(f"{run.run_id}  {run.profile.name}  repeat {run.repeat}")
        if config.backend is None:
            continue
        for host in inventory.hosts:
            for change in remote.plan_for_host(run.profile, host, config.backend, topology):
                console.plain(f"    {change.describe()}")
    if config.backend is None:
        console.info("no host was contacted: each host's backend is probed when the sweep runs "
                     "(give --backend to list the changes)")
