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
from rich.markup import escape

from netbench import __version__, console, units
from netbench.cli.types import FiniteFloatRange
from netbench.errors import NetbenchError, PrivilegeError, TestbedError, UsageError, VerifyFailed
from netbench.model.profile import Profile, load_profile, parse_levels, profile_from_flags
from netbench.cli.remote import (APPLY_EXTRA, hosts_options, node, provision, remote_apply, remote_doctor,
                                 remote_reset, remote_show, with_inventory)

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
    """SIGTERM and SIGHUP (a closed terminal or SSH session) take the same path as Ctrl-C:
    reset, then exit."""
    from netbench import interrupts

    interrupts.as_interrupt(signal.SIGTERM, signal.SIGHUP)


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
        console.info(f"[green]ok[/] {escape(str(path))}: {escape(loaded.name)}: "
                     f"delay {units.format_duration_us(loaded.delay_us)}, "
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
    from netbench.state.journal import Journal, Lock
    from netbench.testbed import netns as local

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
    from netbench.state.journal import Journal, Lock
    from netbench.testbed import netns as local

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
    from netbench.testbed import netns as local

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
    from netbench.testbed import netns as local

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
@with_inventory(remote_apply, APPLY_EXTRA)
def apply_(profile_file, latency, jitter, bandwidth, loss, backend, dry_run) -> None:
    """Apply a profile (a PROFILE_FILE, flags, or both) to every testbed link.

    Flags override the file's values. Delay is one-way at each node's egress, so the
    round trip between two nodes is twice the delay.

    Example: netbench apply profiles/wan.yaml --loss 1%
    """
    from netbench.emulation import backends, changes as ch
    from netbench.emulation.executor import choose_backend, real_executor
    from netbench.state.journal import Journal, Lock
    from netbench.testbed import netns as local

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
    plan = backends.plan_apply(chosen_profile, topo, choice.name)
    console.info(f"profile [bold]{escape(chosen_profile.name)}[/] ({escape(chosen_profile.label())}), backend "
                 f"[bold]{choice.name}[/]: {escape(choice.reason)}")
    if dry_run:
        console.info("[yellow]dry run[/]: these changes would be made:")
        for change in plan:
            console.plain("  " + change.describe())
        return
    journal = Journal()
    with Lock(journal.dir):
        real_executor(journal, detach_engines=True,
                      on_change=lambda c: console.info(f"  [dim]{escape(c.describe())}[/]")).apply(plan)
    console.info("[green]applied[/]; read it back with 'netbench show', remove it with 'netbench reset'")


@main.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@handle_errors
@with_inventory(remote_show)
def show(as_json: bool) -> None:
    """Read the active emulation back from the kernel and the delay engines.

    Example: netbench show --json
    """
    from netbench.emulation.engines import Engines
    from netbench.emulation.iptables import Iptables
    from netbench.emulation.netlink.qdisc import NetlinkQdiscs
    from netbench.emulation.executor import read_emulation
    from netbench.state.journal import state_dir
    from netbench.testbed import netns as local

    require_root()
    topo = local.discover()
    if topo is None:
        if as_json:
            console.plain(json.dumps({"nodes": []}))
        else:
            console.info("no testbed is up")
        return
    from netbench.emulation.executor import recorded_distributions
    from netbench.state.journal import Journal

    rows = read_emulation(topo, NetlinkQdiscs(), Iptables(), Engines(state_dir()), recorded_distributions(Journal()))
    if as_json:
        console.plain(json.dumps({"nodes": rows}, indent=2, default=str))
        return
    from rich.table import Table

    table = Table(title="active emulation")
    for col in ("node", "backend", "delay", "jitter", "loss", "rate", "other", "engine", "qdisc drops"):
        table.add_column(col)
    for row in rows:
        table.add_row(*_show_cells(row))
    console.out.print(table)


def _show_cells(row: dict) -> list[str]:
    """One node's row: the profile its links amount to, then the other netem keys."""
    profile, qdisc, engine = row.get("profile") or {}, row.get("qdisc") or {}, row.get("engine") or {}
    if engine:  # every cell is markup: what the kernel or a host reported is escaped
        engine_text = ("running" if engine.get("alive") else "[red]dead[/]") + \
            escape(f" pid {engine.get('pid')}, {engine.get('received', 0)} pkts, {engine.get('dropped', 0)} dropped")
    else:
        engine_text = "-"
    shown = ("name", "delay", "jitter", "loss", "rate")
    other = ", ".join(f"{key} {', '.join(value) if isinstance(value, list) else value}"
                      for key, value in profile.items() if key not in shown) or "-"
    loss = profile.get("loss", "-")
    if isinstance(loss, dict):
        loss = f"{loss.get('model')} p {loss.get('p')} r {loss.get('r')}"
    cells = [row["node"], row.get("backend") or "none", profile.get("delay", "-"), profile.get("jitter", "-"),
             loss, profile.get("rate", "unlimited" if profile else "-"), other]
    return [escape(str(cell)) for cell in cells] + [engine_text, escape(str(qdisc.get("drops", "-")))]


# ---------------------------------------------------------------- verify

@main.command("verify")
@click.option("--from", "src_name", metavar="NODE", help="Node that sends the probes [default: the first].")
@click.option("--to", "dst_name", metavar="NODE", help="Node probed [default: the second].")
@click.option("--count", default=100, show_default=True, type=click.IntRange(5, 100000), help="Pings to send.")
@click.option("--interval", default=0.02, show_default=True, type=FiniteFloatRange(0.002, 10),
              help="Seconds between pings.")
@click.option("--seconds", default=3.0, show_default=True, type=FiniteFloatRange(0, 3600),
              help="Length of the iperf3 TCP test (0: no throughput test).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@handle_errors
def verify_cmd(src_name, dst_name, count, interval, seconds, as_json) -> None:
    """Measure the active profile between two nodes and compare it with what is configured.

    RTT and loss come from ping, throughput from iperf3, both between the nodes; the
    configured values are read back from the kernel and the delay engines. Exits 1 when a
    measurement is outside its tolerance.

    Example: netbench apply --latency 10ms --bandwidth 100mbit && netbench verify
    """
    from netbench.experiment import verify
    from netbench.emulation.engines import Engines
    from netbench.emulation.iptables import Iptables
    from netbench.emulation.netlink.qdisc import NetlinkQdiscs
    from netbench.emulation.executor import read_emulation
    from netbench.state.journal import Journal
    from netbench.model.profile import profile_from_mapping
    from netbench.testbed import netns as local

    require_root()
    topo = local.discover()
    if topo is None or len(topo.nodes) < 2:
        raise UsageError("netbench verify needs a testbed of at least 2 nodes",
                         hint="netbench testbed up --nodes 2, then netbench apply ...")
    by_name = {node.name: node for node in topo.nodes}
    for flag, name in (("--from", src_name), ("--to", dst_name)):
        if name is not None and name not in by_name:
            raise UsageError(f"flag {flag}: no node {name} in the testbed ({', '.join(by_name)})")
    src = by_name[src_name] if src_name else topo.nodes[0]
    dst = by_name[dst_name] if dst_name else next(n for n in topo.nodes if n.name != src.name)
    if src.name == dst.name:
        raise UsageError("flags --from and --to name the same node", hint="probe between two nodes")
    journal = Journal()
    from netbench.emulation.executor import recorded_distributions

    rows = {row["node"]: row for row in read_emulation(topo, NetlinkQdiscs(), Iptables(), Engines(journal.dir),
                                                        recorded_distributions(journal))}
    profiles = {name: profile_from_mapping(rows[name]["profile"], "read-back") if rows[name]["profile"] else None
                for name in (src.name, dst.name)}
    if not as_json:
        console.info(f"measuring {src.name} -> {dst.name}: {count} pings every {interval:g} s"
                     + (f", iperf3 for {seconds:g} s" if seconds else ""))
    record = verify.verify(src, profiles[src.name], dst, profiles[dst.name],
                           verify.Settings(ping_count=count, ping_interval_s=interval, iperf_seconds=seconds))
    if as_json:
        console.plain(json.dumps({"from": src.name, "to": dst.name, **record}, indent=2))
    else:
        _print_checks(record["checks"])
    if not record["ok"]:
        raise VerifyFailed("measured values differ from the configured profile beyond tolerance",
                           hint="see the rows marked 'no'; a loaded machine inflates RTT")


def _print_checks(checks: list[dict]) -> None:
    from rich.table import Table

    def value(metric: str, number) -> str:
        if number is None:
            return "-"
        return {"rtt": f"{number:.3f} ms", "loss": units.format_ratio(number),
                "rate": units.format_rate_bps(int(number))}[metric]

    table = Table(title="configured vs measured")
    for col in ("metric", "configured", "measured", "error", "ok", "rule"):
        table.add_column(col)
    for c in checks:
        if c["error"] is None:
            error = "-"
        elif c["metric"] == "rate":
            error = f"{c['error']:+.1%}"
        elif c["metric"] == "rtt":
            error = f"{c['error']:+.3f} ms"
        else:
            error = f"{c['error']:+.4f}"
        ok = {True: "[green]yes[/]", False: "[red]no[/]", None: "-"}[c["ok"]]
        table.add_row(c["metric"], value(c["metric"], c["configured"]), value(c["metric"], c["measured"]), error, ok,
                      c["rule"])
    console.out.print(table)


@main.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--no-tensorflow", is_flag=True, help="Skip the slow TensorFlow import check.")
@handle_errors
@with_inventory(remote_doctor)
def doctor_cmd(as_json: bool, no_tensorflow: bool) -> None:
    """Check what this host can do, by trying it, and which emulation backend netbench will use.

    Works without root (namespace checks are then skipped). Exits 1 when no backend can run.

    Example: sudo netbench doctor --no-tensorflow
    """
    from netbench.experiment import doctor

    report = doctor.run_doctor(tensorflow=not no_tensorflow)
    if as_json:
        console.plain(json.dumps(doctor.to_json(report), indent=2))
    else:
        console.out.print(doctor.render(report))
    if not report.ready:
        sys.exit(1)


@main.command("reset")
@handle_errors
@with_inventory(remote_reset)
def reset_cmd() -> None:
    """Remove everything netbench made: qdiscs, iptables rules, delay engines, TF processes,
    namespaces, veths and the bridge. Works after a crash; safe to run twice.

    Example: netbench reset
    """
    from netbench.state.journal import Journal, Lock
    from netbench.state.reset import reset

    require_root()
    journal = Journal()
    with Lock(journal.dir):  # never undo changes a running command is making
        removed = reset(journal, warn=console.warning)
    for line in removed:
        console.info(f"removed {escape(line)}")
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
@click.option("--strategy", default="allreduce", show_default=True,
              type=click.Choice(["allreduce", "allreduce-accum", "ps", "single"]),
              help="allreduce: all-reduce every step; allreduce-accum: every --accum-steps batches; "
                   "ps: parameter servers and a coordinator (asynchronous); single: one process, no network.")
@click.option("--workers", type=click.IntRange(1, 64), help="Training workers, one per node [default: 2; 1 with single].")
@click.option("--accum-steps", default=4, show_default=True, type=click.IntRange(1, 10000),
              help="Local batches per all-reduce with --strategy allreduce-accum.")
@click.option("--ps", "ps_count", default=1, show_default=True, type=click.IntRange(1, 16),
              help="Parameter servers with --strategy ps (each on its own node, plus one for the coordinator).")
@click.option("--model", default="mlp", show_default=True,
              type=click.Choice(["mlp", "cnn", "resnet18", "mobilenetv2", "resnet50", "efficientnetb0", "vgg16"]),
              help="Model to train (Keras applications with random weights; nothing is downloaded).")
@click.option("--data", default="synthetic", show_default=True, metavar="SOURCE",
              help="synthetic (in memory), an .npz with x_train/y_train, or a folder of class folders of images.")
@click.option("--input-shape", metavar="SHAPE", help="Per-example input shape, e.g. 32x32x3 [default: the model's or the data's].")
@click.option("--classes", type=click.IntRange(2, 100000), help="Output classes [default: 10, or the data's].")
@click.option("--batch-size", default=64, show_default=True, type=click.IntRange(1, 65536), help="Per-worker batch size.")
@click.option("--warmup", default=10, show_default=True, type=click.IntRange(0, 100000), help="Warm-up steps, excluded from statistics.")
@click.option("--steps", default=30, show_default=True, type=click.IntRange(2, 1000000), help="Measured steps per run.")
@click.option("--seconds", type=FiniteFloatRange(0.1, 86400), help="Measured window in seconds instead of --steps (all workers agree on the step count after warm-up).")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 1000), help="Repetitions of each point.")
@click.option("--step-timeout", default=60.0, show_default=True, type=FiniteFloatRange(1, 86400), help="Seconds a step may take before the run ends as 'timeout'.")
@click.option("--startup-timeout", default=240.0, show_default=True, type=FiniteFloatRange(1, 86400), help="Seconds until the first step.")
@click.option("--backend", type=click.Choice(BACKEND_CHOICES), default="auto", show_default=True, help="Emulation backend.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, 2**32 - 1),
              help="Seed for loss/jitter draws and data (0 to 2^32-1).")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path),
              help="Results folder [default: results/<sweep-id>]; one that holds files is refused without --append.")
@click.option("--append", is_flag=True,
              help="Add this sweep's runs to a --output folder that holds results (numbered after its runs).")
@click.option("--verify", "verify_points", is_flag=True,
              help="Before each point, measure the link (ping, iperf3 if a rate is set) and record it beside the profile.")
@click.option("--sample-resources", metavar="SECONDS", type=FiniteFloatRange(0.1, 3600),
              help="Every process samples its CPU, memory and its node's network bytes this often; "
                   "summaries per process go into each run's record.")
@click.option("--dry-run", is_flag=True, help="Print the planned runs and changes; make none.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), help="Serve live Prometheus metrics on this port (0: any free port).")
@click.option("--metrics-address", metavar="IP", help="Address to serve metrics on [default: 127.0.0.1].")
@hosts_options
@handle_errors
def sweep(profile_file, latency, bandwidth, loss, jitter, strategy, workers, accum_steps, ps_count, model, data,
          input_shape, classes, batch_size, warmup, steps, seconds, repeat,
          step_timeout, startup_timeout, backend, seed, output, append, verify_points, sample_resources, dry_run,
          metrics_port, metrics_address, inventory, insecure_host_keys, takeover) -> None:
    """Train under every combination of the swept levels and record images/sec.

    Runs the cartesian product of --latency, --bandwidth, --loss and --jitter levels,
    --repeat times each. A unit on the last level applies to the bare numbers before it.

    Example: netbench sweep --latency 1,10,100ms --repeat 2
    Example: netbench sweep --strategy ps --ps 1 --workers 3 --bandwidth 100,1000mbit
    Example: netbench sweep --inventory hosts.yaml --bandwidth 100,1000mbit
    """
    from netbench.model import design as sweep_plan
    from netbench.experiment import store as results
    from netbench.model.job import JobSpec
    from netbench.jobs.launch import Timeouts

    if seconds and warmup < 1:
        raise UsageError("flag --seconds needs --warmup of at least 1: workers agree on the step count "
                         "from the warm-up step times", hint="e.g. --seconds 30 --warmup 10")
    _check_metrics_flags(metrics_port, metrics_address)
    base = load_profile(profile_file) if profile_file else Profile(name="base")
    levels = sweep_plan.SweepLevels(
        delay_us=tuple(parse_levels(latency, "--latency", units.parse_duration_us)) if latency else (),
        rate_bps=tuple(parse_levels(bandwidth, "--bandwidth", units.parse_rate_bps)) if bandwidth else (),
        loss=tuple(parse_levels(loss, "--loss", units.parse_ratio)) if loss else (),
        jitter_us=tuple(parse_levels(jitter, "--jitter", units.parse_duration_us)) if jitter else (),
    )
    points = _plan_runs(base, levels, repeat)
    sweep_id = time.strftime("sweep-%Y%m%d-%H%M%S")
    output = output or Path("results") / sweep_id
    try:  # a second sweep into a folder would overwrite its runs/r000.json and mix its results.csv
        first = results.first_run_index(output, append)
    except results.ResultsError as exc:
        raise UsageError(f"flag --output: {exc.message}", exc.hint) from None
    config_job, workers = _job_from_flags(strategy, workers, accum_steps, ps_count, model, data, input_shape, classes,
                                          batch_size=batch_size, warmup=warmup, steps=steps, seconds=seconds, seed=seed,
                                          sample_resources_s=sample_resources or 0.0)
    runs = sweep_plan.sweep_runs(points, repeat, config_job, workers, first)
    from netbench.experiment.runner import SweepConfig

    config = SweepConfig(sweep_id=sweep_id, runs=tuple(runs), job=config_job, workers=workers,
                         output=output,
                         backend=None if backend == "auto" else backend,
                         timeouts=Timeouts(startup_s=startup_timeout, step_s=step_timeout),
                         command_line=shlex.join(["netbench", *sys.argv[1:]]), seed=seed, verify=verify_points)
    if inventory is not None:
        _run_on_hosts(config, inventory, insecure_host_keys, dry_run, metrics_port, metrics_address, takeover)
        return
    if insecure_host_keys:
        raise UsageError("flag --insecure-host-keys: only with --inventory")
    if takeover:
        raise UsageError("flag --takeover: only with --inventory")
    if dry_run:
        _print_sweep_plan(config)
        return
    require_root()
    _sigterm_as_interrupt()
    _run_with_view(config, metrics_port, metrics_address)


def _run_on_hosts(config, inventory: Path, insecure: bool, dry_run: bool, metrics_port, metrics_address,
                  takeover: bool = False) -> list:
    """A sweep or playbook on the inventory's SSH hosts (the controller needs no root)."""
    from netbench.cli.remote import hosts_testbed, print_hosts_plan

    with hosts_testbed(inventory, insecure, config, takeover) as hosts:
        if dry_run:
            print_hosts_plan(config, hosts.inventory)
            return []
        _sigterm_as_interrupt()
        return _run_with_view(config, metrics_port, metrics_address, testbed=hosts)


def _check_metrics_flags(metrics_port, metrics_address) -> None:
    if metrics_address is not None:
        from netbench.metrics import check_address

        if metrics_port is None:
            raise UsageError("flag --metrics-address needs --metrics-port", hint="e.g. --metrics-port 9464")
        check_address(metrics_address)


def _run_with_view(config, metrics_port, metrics_address, testbed=None) -> list:
    """run_sweep under the live terminal view, serving metrics when a port is given."""
    from netbench.metrics import serving
    from netbench.experiment.runner import run_sweep
    from netbench.cli.render import SweepView

    with serving(metrics_port, metrics_address or "127.0.0.1") as metrics, \
            SweepView(config, metrics_url=metrics.url if metrics else None) as view:
        for warning in metrics.warnings if metrics else ():
            view.warn(warning)
        results = run_sweep(config, metrics.observe(view) if metrics else view, testbed=testbed)
    view.summary(results)
    return results


def _job_from_flags(strategy, workers, accum_steps, ps_count, model, data, input_shape, classes, **rest):
    """The JobSpec and worker count the sweep flags ask for; bad input names its flag."""
    from netbench.jobs.harness import data as datasets
    from netbench.model.job import JobSpec
    from netbench.jobs.harness.models import DEFAULT_CLASSES, DEFAULT_INPUT_SHAPES, check_input, parse_input_shape

    if strategy == "single" and workers not in (None, 1):
        raise UsageError(f"flag --workers: strategy single runs one process, got {workers}",
                         hint="drop --workers, or choose --strategy allreduce")
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
    if data == datasets.SYNTHETIC:
        try:
            check_input(model, shape or DEFAULT_INPUT_SHAPES[model], classes or DEFAULT_CLASSES)
        except ValueError as exc:
            raise UsageError(f"flag --input-shape: {exc}") from None
    data = data if data == datasets.SYNTHETIC else str(Path(data).resolve())  # workers start elsewhere
    return JobSpec(strategy=strategy, model=model, accum_steps=accum_steps, ps=ps_count, data=data,
                   input_shape=shape, classes=classes, **rest), workers


def _plan_runs(base, levels, repeat):
    from netbench.model import design as sweep_plan
    from netbench.errors import ProfileError

    try:
        return sweep_plan.sweep_points(base, levels)
    except ProfileError as exc:
        # the swept value came from a flag; say which
        raise ProfileError(exc.message.replace("sweep: delay", "flag --latency").replace(
            "sweep: rate", "flag --bandwidth").replace("sweep: jitter", "flag --jitter").replace(
            "sweep: loss", "flag --loss"), exc.hint) from None


def _print_sweep_plan(config) -> None:
    from netbench.emulation import backends, changes as ch
    from netbench.model.job import describe_plan, nodes_needed, plan_job
    from netbench.model import topology

    topo = topology.plan_topology(nodes_needed(config.job, config.workers), topology.choose_subnet([]))
    accum = f" ({config.job.accum_steps} batches per all-reduce)" if config.job.strategy == "allreduce-accum" else ""
    console.info(f"[yellow]dry run[/]: {len(config.runs)} runs, strategy {config.job.strategy}{accum}, "
                 f"{config.workers} workers, "
                 f"model {config.job.model}, batch {config.job.batch_size}/worker, "
                 f"{config.job.warmup} warm-up + "
                 + (f"{config.job.seconds:g} s of" if config.job.seconds else f"{config.job.steps}")
                 + f" measured steps; results -> {escape(str(config.output))}")
    console.plain(f"placement on {len(topo.nodes)} nodes (each run on a fresh port):")
    for line in describe_plan(plan_job(config.job, topo.nodes, config.workers, port=0)):
        console.plain("  " + line)
    for run in config.runs:
        console.plain(f"{run.run_id}  {run.profile.name}  repeat {run.repeat}")
        for change in backends.plan_apply(run.profile, topo, config.backend or "userspace",
                                    seed=config.seed + 100 * run.index):
            console.plain("    " + change.describe())
        if config.verify:
            console.plain(f"    verify: {topo.nodes[0].name} -> {topo.nodes[1].name}, "
                          f"{verify_settings_text()}" if len(topo.nodes) > 1 else "    verify: skipped (one node)")


def verify_settings_text() -> str:
    from netbench.experiment.verify import QUICK

    return (f"{QUICK.ping_count} pings every {QUICK.ping_interval_s:g} s"
            f" and {QUICK.iperf_seconds:g} s of iperf3 where a rate is set")


# ---------------------------------------------------------------- playbooks and reports

def _playbook_state(output: Path) -> dict | None:
    from netbench.experiment.store import ResultStore

    return ResultStore(output).read_playbook()


@main.command("run")
@click.argument("playbook_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--output", type=click.Path(file_okay=False, path_type=Path),
              help="Results folder [default: results/<playbook name>]; an existing one resumes.")
@click.option("--backend", type=click.Choice(BACKEND_CHOICES), help="Override the playbook's emulation backend.")
@click.option("--verify", "verify_points", is_flag=True,
              help="Before each run, measure the link (ping, iperf3 if a rate is set) and record it.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), help="Serve live Prometheus metrics on this port (0: any free port).")
@click.option("--metrics-address", metavar="IP", help="Address to serve metrics on [default: 127.0.0.1].")
@click.option("--sample-resources", metavar="SECONDS", type=FiniteFloatRange(0.1, 3600),
              help="Every process samples its CPU, memory and its node's network bytes this often; "
                   "summaries per process go into each run's record.")
@click.option("--dry-run", is_flag=True, help="List the runs in order (and which are already done); run none.")
@hosts_options
@handle_errors
def run_playbook(playbook_file: Path, output: Path | None, backend: str | None, verify_points: bool,
                 metrics_port: int | None, metrics_address: str | None, sample_resources: float | None,
                 dry_run: bool, inventory: Path | None, insecure_host_keys: bool, takeover: bool) -> None:
    """Run a PLAYBOOK_FILE: a whole experiment design (factors, repetitions, run order).

    An interrupted playbook resumes: run it again with the same results folder and the
    runs already recorded as ok or timeout are skipped. The run order's seed is recorded.

    Example: netbench run playbooks/smoke.yaml --dry-run
    Example: netbench run playbooks/smoke.yaml --inventory hosts.yaml
    """
    import random as _random

    from netbench.experiment.store import ResultStore
    from netbench.model import design
    from netbench.model import playbook as pb

    _check_metrics_flags(metrics_port, metrics_address)
    book = pb.load_playbook(playbook_file)
    output = output or Path("results") / book.name
    state = _playbook_state(output)
    seed = book.seed if book.seed is not None else (state or {}).get("seed")
    if seed is None:
        seed = _random.SystemRandom().randrange(2**31)
    runs = design.expand(book, seed, sample_resources_s=sample_resources or 0.0)
    store = ResultStore(output)
    statuses = store.statuses()
    design.check_resume(book, runs, state, output, has_runs=bool(statuses))
    todo = design.pending(runs, statuses)
    if dry_run:
        _print_playbook_plan(book, seed, runs, statuses, output)
        return
    from netbench.jobs import worker
    from netbench.model import job as cluster
    from netbench.jobs.launch import Timeouts

    design.check_supported(book, runs, getattr(cluster, "STRATEGIES", ("allreduce",)), worker.MODELS)
    plans = tuple(todo)
    if not plans:
        console.info(f"playbook [bold]{escape(book.name)}[/]: all {len(runs)} runs are done in {escape(str(output))}; "
                     f"'netbench report {escape(str(output))}' summarises them")
        return
    if inventory is None:
        if insecure_host_keys:
            raise UsageError("flag --insecure-host-keys: only with --inventory")
        if takeover:
            raise UsageError("flag --takeover: only with --inventory")
        require_root()
    _sigterm_as_interrupt()
    from netbench.experiment.runner import SweepConfig

    chosen = backend if backend else book.backend
    config = SweepConfig(sweep_id=f"playbook-{book.name}", runs=plans, job=plans[0].job,
                         workers=max(r.workers for r in todo), output=output,
                         backend=None if chosen in (None, "auto") else chosen,
                         timeouts=Timeouts(startup_s=book.startup_timeout_s, step_s=book.step_timeout_s),
                         command_line=shlex.join(["netbench", *sys.argv[1:]]), seed=seed, verify=verify_points)
    if inventory is not None:
        from netbench.cli.remote import check_on_hosts

        check_on_hosts(config, inventory)  # before the results folder is written
    record = design.plan_record(book, seed, runs)
    record["sessions"] = (state or {}).get("sessions", []) + [{"started": time.time(), "pending": len(todo)}]
    store.write_playbook(record, playbook_file.read_text(encoding="utf-8"))
    console.info(f"playbook [bold]{escape(book.name)}[/]: {len(runs)} runs, seed {seed}; "
                 f"{len(runs) - len(todo)} already done, {len(todo)} to run")

    if inventory is not None:
        results = _run_on_hosts(config, inventory, insecure_host_keys, False, metrics_port, metrics_address, takeover)
    else:
        results = _run_with_view(config, metrics_port, metrics_address)
    record["sessions"][-1].update(ended=time.time(), completed=len(results))
    store.write_playbook(record)
    console.info(f"figures and a summary: netbench report {escape(str(output))}")


def _print_playbook_plan(book, seed: int, runs, statuses: dict, output: Path) -> None:
    from rich.table import Table

    from netbench.model import design
    from netbench.model import playbook as pb

    done = sum(1 for r in runs if statuses.get(r.run_id) in design.COMPLETE_STATUSES)
    seed_note = "" if book.seed is not None else " (drawn: the playbook sets none; recorded in the results folder)"
    console.info(f"[yellow]dry run[/]: playbook [bold]{escape(book.name)}[/] ({escape(book.source)}): {len(runs)} runs "
                 f"= {len(runs) // book.repetitions} points x {book.repetitions} repetitions, "
                 f"order {book.order}, seed {seed}{seed_note}")
    console.info(f"{book.warmup} warm-up + " + (f"{book.seconds:g} s of" if book.seconds else f"{book.steps}")
                 + f" measured steps per run; timeouts: startup {book.startup_timeout_s:g}s, step "
                 f"{book.step_timeout_s:g}s; results -> {escape(str(output))} ({done} done, {len(runs) - done} to run)")
    keys = [k for k, _ in book.factors] + [k for entry in book.extra_runs for k, _ in entry]
    shown = list(dict.fromkeys(keys))
    table = Table(box=None)
    for col in ("run", "point", "rep", *shown, "nodes", "profile", "state"):
        table.add_column(col)
    for run in runs:
        cells = design.describe_settings(run.settings)
        table.add_row(run.run_id, str(run.point), str(run.repeat), *(escape(cells[k]) for k in shown),
                      str(run.settings.nodes), escape(run.profile.name), escape(statuses.get(run.run_id, "to run")))
    console.out.print(table)
    from netbench.jobs import worker
    from netbench.model import job as cluster
    from netbench.model.job import JobSpec

    try:  # a design may be ahead of this build (a strategy or model still to come): say so now
        design.check_supported(book, runs, getattr(cluster, "STRATEGIES", ("allreduce",)), worker.MODELS)
        for run in runs:
            design.job_fields(book, run.settings, design.fields_of(JobSpec))
    except pb.PlaybookError as exc:
        console.info(f"[yellow]not runnable by this netbench yet[/]: {escape(exc.message)}")


@main.command("report")
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
    from netbench.cli import report_tables

    out = output or results_dir / "report"
    written = report.write_report(results_dir, out, confidence=confidence)
    console.out.print(report_tables.runs_table(written.observations))
    console.out.print(report_tables.groups_table(written.groups, confidence))
    ratios = report.speedups(written.groups, confidence)
    if ratios:
        console.out.print(report_tables.speedups_table(ratios))
    for path in written.files:
        console.info(f"wrote {escape(str(path))}")


# ---------------------------------------------------------------- remote hosts (remote_cli.py)

main.add_command(node)
main.add_command(provision)


if __name__ == "__main__":  # pragma: no cover
    main()
