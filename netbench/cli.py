"""netbench's command line: thin click commands over the library.

Each command parses flags, makes one library call, and renders the result with rich.
Errors from the library (NetbenchError) become a one-line message and an exit code here,
and nowhere else.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import click

from netbench import __version__, console, units
from netbench.errors import NetbenchError, PrivilegeError, TestbedError, UsageError
from netbench.profile import Profile, load_profile, parse_levels, profile_from_flags

BACKEND_CHOICES = ("auto", "netem", "userspace")


def handle_errors(func):
    """Translate library errors into a message and exit code; Ctrl-C exits 130."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except NetbenchError as exc:
            console.error(exc.message, exc.hint)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            console.error("interrupted")
            sys.exit(130)

    return wrapper


def require_root() -> None:
    if os.geteuid() != 0:
        raise PrivilegeError("this command changes network namespaces and needs root",
                             hint="run it with sudo, or as root")


def _sigterm_as_interrupt() -> None:
    """SIGTERM takes the same path as Ctrl-C: reset, then exit."""

    main_pid = os.getpid()

    def raise_interrupt(signum, frame):
        # pyroute2 forks short-lived helpers that inherit this handler; they must just exit,
        # never unwind into the controller's clean-up code
        if os.getpid() != main_pid:
            os._exit(0)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, raise_interrupt)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="netbench")
def main() -> None:
    """Emulate slow, lossy or distant networks between nodes and measure how
    distributed TensorFlow training throughput responds.

    \b
    Typical use:
      netbench sweep --latency 1,10,100ms     # a latency sweep on the embedded testbed
      netbench reset                          # remove everything netbench made
    """


# ---------------------------------------------------------------- profiles

@main.group()
def profile() -> None:
    """Validate and inspect network profiles (YAML)."""


@profile.command("check")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@handle_errors
def profile_check(files: tuple[Path, ...]) -> None:
    """Validate profile FILES without touching the network.

    Example: netbench profile check profiles/wan.yaml
    """
    for path in files:
        loaded = load_profile(path)
        console.info(f"[green]ok[/] {path}: {loaded.name}: delay {units.format_duration_us(loaded.delay_us)}, "
                     f"jitter {units.format_duration_us(loaded.jitter_us)}, loss {units.format_ratio(loaded.loss)}, "
                     f"rate {units.format_rate_bps(loaded.rate_bps)}")


# ---------------------------------------------------------------- testbed

@main.group()
def testbed() -> None:
    """Bring the embedded testbed (network namespaces on this machine) up and down."""


@testbed.command("up")
@click.option("--nodes", default=2, show_default=True, type=click.IntRange(1, 64), help="Number of nodes.")
@handle_errors
def testbed_up(nodes: int) -> None:
    """Create NODES namespaces joined by a bridge.

    Example: netbench testbed up --nodes 3
    """
    from netbench.journal import Journal, Lock
    from netbench.testbed import local

    require_root()
    journal = Journal()
    with Lock(journal.dir):
        topo = local.up(nodes, journal)
    console.info(f"testbed up: {len(topo.nodes)} nodes on {topo.subnet}")
    _print_topology(topo)


@testbed.command("down")
@handle_errors
def testbed_down() -> None:
    """Remove the testbed's namespaces (and every process and qdisc inside them).

    Example: netbench testbed down
    """
    from netbench.journal import Journal, Lock
    from netbench.testbed import local

    require_root()
    journal = Journal()
    with Lock(journal.dir):
        removed = local.down(journal)
        journal.compact()
    console.info(f"removed {', '.join(removed)}" if removed else "no testbed was up")


@testbed.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {subnet, nodes: [{name, netns, address, ...}]}.")
@handle_errors
def testbed_show(as_json: bool) -> None:
    """Show the testbed as the kernel holds it.

    Example: netbench testbed show --json
    """
    from netbench.testbed import local

    topo = local.discover()
    if as_json:
        console.plain(json.dumps(topo.to_json() if topo else {"nodes": []}, indent=2))
        return
    if topo is None:
        console.info("no testbed is up (start one with 'netbench testbed up')")
        return
    _print_topology(topo)


def _print_topology(topo) -> None:
    from rich.table import Table

    table = Table(title=f"testbed on {topo.subnet}")
    for col in ("node", "namespace", "interface", "address"):
        table.add_column(col)
    for node in topo.nodes:
        table.add_row(node.name, node.netns, node.ifname, f"{node.address}/{node.prefixlen}")
    console.out.print(table)


@main.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("node")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@handle_errors
def exec_(node: str, command: tuple[str, ...]) -> None:
    """Run COMMAND inside testbed NODE, as Mininet's 'h1 ping h2'.

    Example: netbench exec n1 -- ping -c 3 n2
    Node names in COMMAND's arguments (n1, n2, ...) are replaced by their addresses.
    """
    from netbench import proc
    from netbench.testbed import local

    require_root()
    topo = local.discover()
    if topo is None:
        raise TestbedError("no testbed is up", hint="start one with 'netbench testbed up'")
    target = topo.node(node)
    if target is None:
        raise UsageError(f"argument NODE: no node {node!r}",
                         hint=f"nodes: {', '.join(n.name for n in topo.nodes)}")
    names = {n.name: n.address for n in topo.nodes}
    argv = [names.get(arg, arg) for arg in command]
    child = proc.spawn(argv, netns=target.netns, stdin=None)
    try:
        sys.exit(child.wait())
    except KeyboardInterrupt:
        proc.stop(child)
        sys.exit(130)


# ---------------------------------------------------------------- emulation

def _profile_options(func):
    for option in reversed([
        click.option("--latency", metavar="DURATION", help="One-way delay at each node's egress, e.g. 10ms."),
        click.option("--jitter", metavar="DURATION", help="Delay variation (+-), e.g. 1ms."),
        click.option("--bandwidth", metavar="RATE", help="Egress rate limit, e.g. 250mbit."),
        click.option("--loss", metavar="PERCENT", help="Packet loss at egress, e.g. 1%."),
    ]):
        func = option(func)
    return func


@main.command("apply")
@click.argument("profile_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@_profile_options
@click.option("--backend", type=click.Choice(BACKEND_CHOICES), default="auto", show_default=True,
              help="Emulation backend; auto probes the kernel for netem.")
@click.option("--dry-run", is_flag=True, help="Print the exact planned changes and make none.")
@handle_errors
def apply_(profile_file, latency, jitter, bandwidth, loss, backend, dry_run) -> None:
    """Apply a profile (a PROFILE_FILE, flags, or both) to every testbed link.

    Flags override the file's values. Delay is one-way at each node's egress, so the
    round trip between two nodes is twice the delay.

    Example: netbench apply profiles/wan.yaml --loss 1%
    """
    from netbench.emulation import changes as ch
    from netbench.emulation.apply import choose_backend, real_executor
    from netbench.journal import Journal, Lock
    from netbench.testbed import local

    base = load_profile(profile_file) if profile_file else None
    chosen_profile = profile_from_flags(base, latency=latency, jitter=jitter, bandwidth=bandwidth, loss=loss)
    if base is None and chosen_profile.is_null:
        raise UsageError("nothing to apply: give a PROFILE_FILE or at least one of --latency, --jitter, "
                         "--bandwidth, --loss", hint="e.g. netbench apply --latency 10ms")
    require_root()
    topo = local.discover()
    if topo is None:
        raise TestbedError("no testbed is up", hint="start one with 'netbench testbed up'")
    choice = choose_backend(None if backend == "auto" else backend)
    plan = ch.plan_apply(chosen_profile, topo, choice.name)
    console.info(f"profile [bold]{chosen_profile.name}[/] ({chosen_profile.label()}), backend "
                 f"[bold]{choice.name}[/]: {choice.reason}")
    if dry_run:
        console.info("[yellow]dry run[/]: these changes would be made:")
        for change in plan:
            console.plain("  " + change.describe())
        return
    journal = Journal()
    with Lock(journal.dir):
        real_executor(journal, detach_engines=True,
                      on_change=lambda c: console.info(f"  [dim]{c.describe()}[/]")).apply(plan)
    console.info("[green]applied[/]; read it back with 'netbench show', remove it with 'netbench reset'")


@main.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@handle_errors
def show(as_json: bool) -> None:
    """Read the active emulation back from the kernel and the delay engines.

    Example: netbench show --json
    """
    from netbench.emulation.adapters import Engines, Iptables, NetlinkQdiscs
    from netbench.emulation.apply import read_emulation
    from netbench.journal import state_dir
    from netbench.testbed import local

    require_root()
    topo = local.discover()
    if topo is None:
        if as_json:
            console.plain(json.dumps({"nodes": []}))
        else:
            console.info("no testbed is up")
        return
    rows = read_emulation(topo, NetlinkQdiscs(), Iptables(), Engines(state_dir()))
    if as_json:
        console.plain(json.dumps({"nodes": rows}, indent=2, default=str))
        return
    from rich.table import Table

    table = Table(title="active emulation (egress of each node)")
    for col in ("node", "backend", "delay", "jitter", "loss", "rate", "engine", "qdisc drops"):
        table.add_column(col)
    for row in rows:
        table.add_row(*_show_cells(row))
    console.out.print(table)


def _show_cells(row: dict) -> list[str]:
    qdisc, engine = row.get("qdisc") or {}, row.get("engine") or {}
    params = engine.get("params", {}) if engine else {}
    delay = qdisc.get("delay_us", params.get("delay_us"))
    jitter = qdisc.get("jitter_us", params.get("jitter_us"))
    loss = qdisc.get("loss", params.get("loss"))
    rate = qdisc.get("rate_bps")
    if engine:
        engine_text = ("running" if engine.get("alive") else "[red]dead[/]") + \
            f" pid {engine.get('pid')}, {engine.get('received', 0)} pkts, {engine.get('dropped', 0)} dropped"
    else:
        engine_text = "-"
    return [row["node"], row.get("backend") or "none",
            units.format_duration_us(delay) if delay is not None else "-",
            units.format_duration_us(jitter) if jitter is not None else "-",
            units.format_ratio(loss) if loss is not None else "-",
            units.format_rate_bps(rate) if rate else "unlimited",
            engine_text, str(qdisc.get("drops", "-"))]


@main.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--no-tensorflow", is_flag=True, help="Skip the slow TensorFlow import check.")
@handle_errors
def doctor_cmd(as_json: bool, no_tensorflow: bool) -> None:
    """Check what this host can do, by trying it, and which emulation backend netbench will use.

    Works without root (namespace checks are then skipped). Exits 1 when no backend can run.

    Example: sudo netbench doctor --no-tensorflow
    """
    from netbench import doctor

    report = doctor.run_doctor(tensorflow=not no_tensorflow)
    if as_json:
        console.plain(json.dumps(doctor.to_json(report), indent=2))
    else:
        console.out.print(doctor.render(report))
    if not report.ready:
        sys.exit(1)


@main.command("reset")
@handle_errors
def reset_cmd() -> None:
    """Remove everything netbench made: qdiscs, iptables rules, delay engines, TF processes,
    namespaces, veths and the bridge. Works after a crash; safe to run twice.

    Example: netbench reset
    """
    from netbench.journal import Journal
    from netbench.reset import reset

    require_root()
    removed = reset(Journal())
    for line in removed:
        console.info(f"removed {line}")
    console.info("[green]clean[/]: nothing netbench made is left" if removed
                 else "nothing to remove: the machine is clean")


# ---------------------------------------------------------------- sweep

@main.command("sweep")
@click.option("--profile", "profile_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Base profile; swept flags replace its values.")
@click.option("--latency", metavar="LIST", help="One-way delays to sweep, e.g. 1,10,100ms.")
@click.option("--bandwidth", metavar="LIST", help="Rates to sweep, e.g. 250,500,1000mbit.")
@click.option("--loss", metavar="LIST", help="Losses to sweep, e.g. 0,1,10%.")
@click.option("--jitter", metavar="LIST", help="Jitters to sweep, e.g. 0,1ms.")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 64), help="Training processes, one per node.")
@click.option("--model", default="mlp", show_default=True, type=click.Choice(["mlp", "cnn"]), help="Model to train.")
@click.option("--batch-size", default=64, show_default=True, type=click.IntRange(1, 65536), help="Per-worker batch size.")
@click.option("--warmup", default=10, show_default=True, type=click.IntRange(0, 100000), help="Warm-up steps, excluded from statistics.")
@click.option("--steps", default=30, show_default=True, type=click.IntRange(2, 1000000), help="Measured steps per run.")
@click.option("--seconds", type=click.FloatRange(0.1, 86400), help="Measured window in seconds instead of --steps (all workers agree on the step count after warm-up).")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 1000), help="Repetitions of each point.")
@click.option("--step-timeout", default=60.0, show_default=True, type=click.FloatRange(1, 86400), help="Seconds a step may take before the run ends as 'timeout'.")
@click.option("--startup-timeout", default=240.0, show_default=True, type=click.FloatRange(1, 86400), help="Seconds until the first step.")
@click.option("--backend", type=click.Choice(BACKEND_CHOICES), default="auto", show_default=True, help="Emulation backend.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed for loss/jitter draws and data.")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), help="Results folder [default: results/<sweep-id>].")
@click.option("--dry-run", is_flag=True, help="Print the planned runs and changes; make none.")
@handle_errors
def sweep(profile_file, latency, bandwidth, loss, jitter, workers, model, batch_size, warmup, steps, seconds, repeat,
          step_timeout, startup_timeout, backend, seed, output, dry_run) -> None:
    """Train under every combination of the swept levels and record images/sec.

    Runs the cartesian product of --latency, --bandwidth, --loss and --jitter levels,
    --repeat times each. A unit on the last level applies to the bare numbers before it.

    Example: netbench sweep --latency 1,10,100ms --repeat 2
    """
    from netbench import plan as sweep_plan
    from netbench.jobs.cluster import JobSpec
    from netbench.jobs.launch import Timeouts

    if seconds and warmup < 1:
        raise UsageError("flag --seconds needs --warmup of at least 1: workers agree on the step count "
                         "from the warm-up step times", hint="e.g. --seconds 30 --warmup 10")
    base = load_profile(profile_file) if profile_file else Profile(name="base")
    levels = sweep_plan.SweepLevels(
        delay_us=tuple(parse_levels(latency, "--latency", units.parse_duration_us)) if latency else (),
        rate_bps=tuple(parse_levels(bandwidth, "--bandwidth", units.parse_rate_bps)) if bandwidth else (),
        loss=tuple(parse_levels(loss, "--loss", units.parse_ratio)) if loss else (),
        jitter_us=tuple(parse_levels(jitter, "--jitter", units.parse_duration_us)) if jitter else (),
    )
    runs = _plan_runs(base, levels, repeat)
    sweep_id = time.strftime("sweep-%Y%m%d-%H%M%S")
    config_job = JobSpec(model=model, batch_size=batch_size, warmup=warmup, steps=steps, seconds=seconds, seed=seed)
    from netbench.runner import SweepConfig

    config = SweepConfig(sweep_id=sweep_id, runs=tuple(runs), job=config_job, workers=workers,
                         output=output or Path("results") / sweep_id,
                         backend=None if backend == "auto" else backend,
                         timeouts=Timeouts(startup_s=startup_timeout, step_s=step_timeout),
                         command_line=shlex.join(["netbench", *sys.argv[1:]]), seed=seed)
    if dry_run:
        _print_sweep_plan(config)
        return
    require_root()
    _sigterm_as_interrupt()
    from netbench.runner import run_sweep
    from netbench.ui import SweepView

    with SweepView(config) as view:
        results = run_sweep(config, view)
    view.summary(results)


def _plan_runs(base, levels, repeat):
    from netbench import plan as sweep_plan
    from netbench.errors import ProfileError

    try:
        return sweep_plan.plan_sweep(base, levels, repeat)
    except ProfileError as exc:
        # the swept value came from a flag; say which
        raise ProfileError(exc.message.replace("sweep: delay", "flag --latency").replace(
            "sweep: rate", "flag --bandwidth").replace("sweep: jitter", "flag --jitter").replace(
            "sweep: loss", "flag --loss"), exc.hint) from None


def _print_sweep_plan(config) -> None:
    from netbench.emulation import changes as ch
    from netbench.testbed import topology

    topo = topology.plan_topology(config.workers, topology.choose_subnet([]))
    console.info(f"[yellow]dry run[/]: {len(config.runs)} runs, {config.workers} workers, "
                 f"model {config.job.model}, batch {config.job.batch_size}/worker, "
                 f"{config.job.warmup} warm-up + "
                 + (f"{config.job.seconds:g} s of" if config.job.seconds else f"{config.job.steps}")
                 + f" measured steps; results -> {config.output}")
    for run in config.runs:
        console.plain(f"{run.run_id}  {run.profile.name}  repeat {run.repeat}")
        for change in ch.plan_apply(run.profile, topo, config.backend or "userspace",
                                    seed=config.seed + 100 * run.index):
            console.plain("    " + change.describe())


if __name__ == "__main__":  # pragma: no cover
    main()
