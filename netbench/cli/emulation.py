"""Emulation commands: profile check, apply, show, verify, reset, doctor.

apply, show, reset and doctor act on one Target (testbed.base.open_target): the embedded
namespaces, or with --inventory the inventory's SSH hosts.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click
from rich.markup import escape

from netbench import console, units
from netbench.cli import common, render, render_pairs, schedule_apply
from netbench.cli.common import (BACKEND_CHOICES, apply_remote_options, check_local_flags, handle_errors,
                                 inventory_options, profile_options)
from netbench.cli.groups import GroupedCommand, options
from netbench.cli.types import FiniteFloatRange, Seconds
from netbench.errors import NetbenchError, ResetIncomplete, UsageError, VerifyFailed
from netbench.model.profile import load_profile, profile_from_flags
from netbench.testbed.base import common_profile
from netbench.testbed.targets import open_target

# ---------------------------------------------------------------- profiles


@click.group(short_help="Check network profiles (YAML) without touching the network.")
def profile() -> None:
    """Validate and inspect network profiles (YAML)."""


@profile.command("check", short_help="Validate profile FILES without touching the network.")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@handle_errors
def profile_check(files: tuple[Path, ...]) -> None:
    """Validate profile FILES without touching the network.

    \b
    Example: netbench profile check profiles/wan.yaml
    """
    for path in files:
        loaded = load_profile(path)
        console.info(f"[green]ok[/] {escape(str(path))}: {escape(loaded.name)}: "
                     f"delay {units.format_duration_us(loaded.delay_us)}, "
                     f"jitter {units.format_duration_us(loaded.jitter_us)}, loss {units.format_ratio(loaded.loss)}, "
                     f"rate {units.format_rate_bps(loaded.rate_bps)}")


# ---------------------------------------------------------------- apply

@click.command("apply", cls=GroupedCommand,
               short_help="Shape every node's link: a profile, flags, schedule or topology.")
@click.argument("profile_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@profile_options
@options(
    "Network",
    click.option("--backend", type=click.Choice(BACKEND_CHOICES), default="auto", show_default=True,
                 help="Emulation backend; auto probes the kernel for netem."),
    click.option("--schedule", "schedule_file", type=click.Path(dir_okay=False, path_type=Path),
                 help="Change the link over time as this schedule (YAML) says, in the foreground; Ctrl-C puts "
                      "the link back as it was. Not with a PROFILE_FILE or profile flags."),
    click.option("--topology", "topology_file", type=click.Path(dir_okay=False, path_type=Path),
                 help="Shape every ordered pair of nodes as this topology (YAML: groups and links, or a matrix; "
                      "see profiles/topologies/) says. Not with a PROFILE_FILE, profile flags or --schedule."),
    click.option("--scale", type=FiniteFloatRange(0.001, 1000), help="With --topology: multiply every delay and jitter."),
)
@options("Output and metrics", click.option("--dry-run", is_flag=True,
                                            help="Print the exact planned changes and make none."))
@handle_errors
@inventory_options
@apply_remote_options
def apply_(profile_file, latency, jitter, bandwidth, loss, backend, dry_run, schedule_file, topology_file, scale,
           inventory, insecure_host_keys, lease, force, takeover) -> None:
    """Apply a profile (a PROFILE_FILE, flags, or both) to every testbed link.

    Flags override the file's values. Delay is one-way at each node's egress, so the
    round trip between two nodes is twice the delay.

    \b
    Example: netbench apply profiles/wan.yaml --loss 1%

    \b
    Example: netbench apply --schedule profiles/schedules/spike.yaml --dry-run

    \b
    Example: netbench apply --topology profiles/topologies/two-regions.yaml --scale 2
    """
    if scale is not None and topology_file is None:
        raise UsageError("flag --scale: only with --topology", hint="e.g. --topology two-regions.yaml --scale 2")
    check_local_flags(inventory, insecure_host_keys, lease=lease, force=force, takeover=takeover)
    if topology_file is not None:
        given = [name for name, value in (("PROFILE_FILE", profile_file), ("--latency", latency),
                                          ("--jitter", jitter), ("--bandwidth", bandwidth), ("--loss", loss),
                                          ("--schedule", schedule_file)) if value is not None]
        if given:
            raise UsageError(f"flag --topology: not with {', '.join(given)}: the topology says what every pair gets",
                             hint="put per-pair settings in the topology file ('default:' for the pairs not named)")
        network = _load_topology(topology_file, scale)
        if inventory is not None:  # each host its row: its egress toward the other hosts' tf_address
            _apply_to_hosts(network, inventory, insecure_host_keys, backend, dry_run, lease, force, takeover)
            return
        _apply_network(network, backend, dry_run)
        return
    if schedule_file is not None:
        given = [name for name, value in (("PROFILE_FILE", profile_file), ("--latency", latency),
                                          ("--jitter", jitter), ("--bandwidth", bandwidth), ("--loss", loss))
                 if value is not None]
        if given:
            raise UsageError(f"flag --schedule: not with {', '.join(given)}: the schedule says what to apply",
                             hint="put the base profile in the schedule's 'profile:' key")
        if inventory is not None:
            schedule_apply.apply_schedule_to_hosts(schedule_file, backend, dry_run, inventory, insecure_host_keys, lease, force,
                                     takeover)
            return
        schedule_apply.apply_schedule(schedule_file, backend, dry_run)
        return
    base = load_profile(profile_file) if profile_file else None
    chosen = profile_from_flags(base, latency=latency, jitter=jitter, bandwidth=bandwidth, loss=loss)
    if base is None and chosen.is_null:
        raise UsageError("nothing to apply: give a PROFILE_FILE or at least one of --latency, --jitter, "
                         "--bandwidth, --loss", hint="e.g. netbench apply --latency 10ms" if inventory is None
                         else "e.g. netbench apply --inventory hosts.yaml --bandwidth 100mbit")
    if inventory is None:
        _apply_network(chosen, backend, dry_run)
        return
    _apply_to_hosts(chosen, inventory, insecure_host_keys, backend, dry_run, lease, force, takeover)


def _load_topology(path: Path, scale: float | None):
    from netbench.model.pairs import scaled
    from netbench.model.pairs_file import load_pair_topology

    topology = load_pair_topology(path)
    return topology if scale is None else scaled(topology, scale)


def _apply_network(network, backend: str, dry_run: bool) -> None:
    """A profile or a per-pair topology on the embedded testbed."""
    common.require_testbed("uses")
    with open_target() as target:
        planned = target.plan(network, backend)
        render.planned(target.kind, planned, dry_run=dry_run)
        if dry_run:
            return
        target.apply_plan(planned, on_change=lambda c: console.info(f"  [dim]{escape(c.describe())}[/]"))
    console.info("[green]applied[/]; read it back with 'netbench show', remove it with 'netbench reset'")


def _apply_to_hosts(chosen, inventory, insecure_host_keys, backend, dry_run, lease, force, takeover) -> None:
    from netbench.remote import keeper as leases
    from netbench.state.lease import DEFAULT_LEASE_S, new_holder

    lease_s = DEFAULT_LEASE_S if lease is None else lease
    with open_target(inventory, insecure_host_keys, takeover=bool(takeover)) as target:
        holder = new_holder()
        leases.check_lease(lease_s, len(target.inventory.hosts))
        probe = not (dry_run and backend != "auto")  # the backend is given: plan without contacting any host
        if dry_run and probe:
            console.info("asking each host for its backend ('netbench node info'; nothing is changed; "
                         "--backend skips this)")
        planned = target.plan(chosen, backend, probe=probe)
        render.planned(target.kind, planned, target.inventory.hosts, dry_run=dry_run)
        if dry_run:
            console.info("[yellow]dry run[/]: no host was changed")
            return
        target.apply_plan(planned, lease_s=lease_s, force=bool(force), holder=holder)
        what = f"topology {escape(chosen.name)}" if hasattr(chosen, "links") else f"profile {escape(chosen.name)}"
        what += f" ({len(chosen.links)} shaped pair(s))" if hasattr(chosen, "links") else f" ({escape(chosen.label())})"
        console.info(f"[green]applied[/] {what} to {len(target.conns)} host(s)")
        if lease_s <= 0:
            console.info("no lease: it stays until 'netbench reset --inventory ...'")
            return
        _hold(target.inventory, target.conns, lease_s, holder)


def _hold(inv, conns, lease_s: float, holder: str) -> None:
    """Renew the lease until Ctrl-C or SIGTERM, then revert every host. Renewal failures are
    shown as they come and go."""
    from netbench.remote import controller as remote, keeper as leases

    common.sigterm_as_interrupt()
    console.info(f"holding a {lease_s:g} s lease on every host as {escape(holder)}; Ctrl-C reverts them "
                 "(if this process dies, each host reverts by itself when the lease runs out)")
    keeper = leases.LeaseKeeper(inv, conns, lease_s, holder)
    shown: dict[str, str] = {}
    try:
        with keeper:
            try:
                while not keeper.lost:
                    failures = dict(keeper.failures)
                    for name, why in failures.items():
                        if shown.get(name) != why:
                            console.info(f"[yellow]{escape(why)}[/] (the host reverts by itself "
                                         f"if this lasts {lease_s:g} s)")
                    for name in set(shown) - set(failures):
                        console.info(f"host {name}: lease renewed again")
                    shown = failures
                    time.sleep(0.2)
            except KeyboardInterrupt:
                pass
            # the first lost host ends the loop while the others' renewals may still be in
            # flight: every host answers before any is reset (one taken over is not ours)
            keeper.settle()
    except KeyboardInterrupt:
        pass
    # a lost host reverted by itself or is another controller's now: leave it alone
    kept: dict[str, str] = {}
    removed = remote.reset_inventory(inv, [c for c in conns if c.name not in keeper.lost], holder, kept)
    console.info(f"reverted {', '.join(removed) or 'no host'}")
    for name, other in kept.items():  # taken over after the keeper's last answer
        keeper.lost[name] = f"another controller took it over ({other})"
    if keeper.lost:
        lost = "; ".join(f"{name}: {why}" for name, why in keeper.lost.items())
        raise NetbenchError(f"lost the lease on {lost}", hint="renewals did not reach the host in time")


# ---------------------------------------------------------------- show

@click.command("show", short_help="Read the shaping back from the kernel and the delay engines.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the profile every node holds to this file (YAML), which 'netbench apply FILE' "
                   "takes back (refused when nodes hold different profiles); for a per-pair emulation, the "
                   "topology as a matrix, which 'netbench apply --topology FILE' takes back.")
@handle_errors
@inventory_options
def show(as_json: bool, output: Path | None, inventory, insecure_host_keys) -> None:
    """Read the active emulation back from the kernel and the delay engines.

    \b
    Example: netbench show --json

    \b
    Example: netbench show --output active.yaml && netbench apply active.yaml
    """
    check_local_flags(inventory, insecure_host_keys)
    if inventory is None:
        common.require_testbed("uses")
    with open_target(inventory, insecure_host_keys) as target:
        shown = target.show()
    held_pairs = target.held_pairs  # the per-pair emulation the nodes or hosts hold, read back by show()
    if inventory is not None:
        if as_json:
            console.plain(json.dumps(shown, indent=2, default=str))
        else:
            render.hosts_emulation_table(shown["hosts"])
            if held_pairs is not None:
                render_pairs.held_pairs_matrix(held_pairs)
    elif as_json:
        console.plain(json.dumps(shown, indent=2, default=str) if shown["nodes"] else json.dumps(shown))
    elif held_pairs is not None:
        render_pairs.held_pairs_matrix(held_pairs)
    elif shown["nodes"]:
        render.emulation_table(shown["nodes"])
    else:
        console.info("no testbed is up")
    if output is not None:  # after the table, so a refusal can be read against it
        if held_pairs is not None:
            from netbench.model.pairs import to_matrix_mapping

            _write_profile(output, to_matrix_mapping(held_pairs), quiet=as_json, what="topology")
        else:
            _write_profile(output, common_profile(shown), quiet=as_json)


def _write_profile(path: Path, mapping: dict, quiet: bool, what: str = "profile") -> None:
    """The read-back profile (or per-pair topology) as a file; it loads back to the same plan."""
    import yaml

    back = "netbench apply --topology FILE" if what == "topology" else "netbench apply FILE"
    text = (f"# read back by 'netbench show --output'; '{back}' takes it back\n"
            + yaml.safe_dump(mapping, sort_keys=False, default_flow_style=False, allow_unicode=True))
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"flag --output: cannot write {path}: {exc.strerror or exc}") from None
    if not quiet:
        flag = "--topology " if what == "topology" else ""
        console.info(f"wrote {what} {escape(str(mapping.get('name')))} to {escape(str(path))}; "
                     f"apply it with 'netbench apply {flag}{escape(str(path))}'")


# ---------------------------------------------------------------- verify

@click.command("verify", short_help="Measure a shaped link (ping, iperf3) against its settings.")
@click.option("--from", "src_name", metavar="NODE", help="Node that sends the probes [default: the first].")
@click.option("--to", "dst_name", metavar="NODE", help="Node probed [default: the second].")
@click.option("--all-pairs", is_flag=True,
              help="Measure every ordered pair of nodes and print the RTT matrix beside the configured one.")
@click.option("--throughput", is_flag=True, help="With --all-pairs: also iperf3 every ordered pair, one at a time.")
@click.option("--topology", "topology_file", type=click.Path(dir_okay=False, path_type=Path),
              help="With --all-pairs: the per-pair topology (YAML) to expect [default: the profile each node "
                   "holds, read back].")
@click.option("--tolerance", metavar="TOL",
              help="RTT tolerance, a floor plus a share of the configured RTT [default: 0.5ms or 5% for one "
                   "pair, whichever is larger; 0.5ms+2% with --all-pairs].")
@click.option("--count", type=click.IntRange(5, 100000), help="Pings to send [default: 100; 50 per pair with "
                                                               "--all-pairs].")
@click.option("--interval", default=0.02, show_default=True, type=Seconds(0.002, 10),
              help="Seconds between pings.")
@click.option("--seconds", type=Seconds(0, 3600),
              help="Length of each iperf3 TCP test (0: no throughput test) [default: 3; 2 with --throughput].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@handle_errors
def verify_cmd(src_name, dst_name, all_pairs, throughput, topology_file, tolerance, count, interval, seconds,
               as_json) -> None:
    """Measure the active profile between two nodes (or every pair) and compare it with what is configured.

    RTT and loss come from ping, throughput from iperf3, both between the nodes; the
    configured values are read back from the kernel and the delay engines (or, with
    --topology, taken from that file). Exits 1 when a measurement is outside its tolerance.

    \b
    Example: netbench apply --latency 10ms --bandwidth 100mbit && netbench verify

    \b
    Example: netbench verify --all-pairs --topology profiles/topologies/two-regions.yaml
    """
    from netbench.experiment import verify
    from netbench.experiment.verify_pairs import parse_tolerance
    from netbench.model.profile import profile_from_mapping
    from netbench.testbed import netns as local

    if all_pairs:
        refused = [flag for flag, value in (("--from", src_name), ("--to", dst_name)) if value is not None]
        if refused:
            raise UsageError(f"flag {refused[0]}: not with --all-pairs, which measures every ordered pair")
    else:
        given = [flag for flag, value in (("--throughput", throughput), ("--topology", topology_file)) if value]
        if given:
            raise UsageError(f"flag {given[0]}: only with --all-pairs",
                             hint="one pair measures throughput unless --seconds 0")
    rtt_tolerance = None if tolerance is None else parse_tolerance(tolerance)
    common.require_testbed("uses")
    topo = local.discover()
    if topo is None or len(topo.nodes) < 2:
        raise UsageError("netbench verify needs a testbed of at least 2 nodes",
                         hint="netbench testbed up --nodes 2, then netbench apply ...")
    if all_pairs:
        from netbench.cli.verify_pairs import verify_all_pairs_cmd

        verify_all_pairs_cmd(topo, topology_file, rtt_tolerance, count or 50, interval,
                             (2.0 if seconds is None else seconds) if throughput else 0.0, as_json)
        return
    count, seconds = count or 100, 3.0 if seconds is None else seconds
    by_name = {node.name: node for node in topo.nodes}
    for flag, name in (("--from", src_name), ("--to", dst_name)):
        if name is not None and name not in by_name:
            raise UsageError(f"flag {flag}: no node {name} in the testbed ({', '.join(by_name)})")
    src = by_name[src_name] if src_name else topo.nodes[0]
    dst = by_name[dst_name] if dst_name else next(n for n in topo.nodes if n.name != src.name)
    if src.name == dst.name:
        raise UsageError("flags --from and --to name the same node", hint="probe between two nodes")
    with open_target() as target:
        rows = {row["node"]: row for row in target.show()["nodes"]}
    profiles = {name: profile_from_mapping(rows[name]["profile"], "read-back") if rows[name]["profile"] else None
                for name in (src.name, dst.name)}
    if not as_json:
        console.info(f"measuring {src.name} -> {dst.name}: {count} pings every {interval:g} s"
                     + (f", iperf3 for {seconds:g} s" if seconds else ""))
    record = verify.verify(src, profiles[src.name], dst, profiles[dst.name],
                           verify.Settings(ping_count=count, ping_interval_s=interval, iperf_seconds=seconds),
                           rtt_tolerance or verify.Tolerance())
    if as_json:
        console.plain(json.dumps({"from": src.name, "to": dst.name, **record}, indent=2))
    else:
        render.checks_table(record["checks"])
    if not record["ok"]:
        raise VerifyFailed("measured values differ from the configured profile beyond tolerance",
                           hint="see the rows marked 'no'; a loaded machine inflates RTT")


# ---------------------------------------------------------------- doctor and reset

@click.command("doctor", short_help="Check what this host can do, and the backend netbench will use.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--no-tensorflow", is_flag=True, help="Skip the slow TensorFlow import check.")
@handle_errors
@inventory_options
def doctor_cmd(as_json: bool, no_tensorflow: bool, inventory, insecure_host_keys) -> None:
    """Check what this host can do, by trying it, and which emulation backend netbench will use.

    Works without root (namespace checks are then skipped; under sudo, name the tool by its
    path: sudo .venv/bin/netbench doctor). Exits 1 when no backend can run.
    Lists the GPUs (nvidia-smi, torch.cuda), CUDA and NCCL, and says what RDMA means here.

    \b
    Example: netbench doctor --no-tensorflow
    """
    from netbench.experiment import doctor, gpus

    check_local_flags(inventory, insecure_host_keys)
    limits = None
    if inventory is None and os.geteuid() != 0 or os.environ.get("NETBENCH_PRIVILEGE") == "rootless":
        limits = _rootless_limits()  # without root: probed in a sandbox of its own, where the host allows one
    with open_target(inventory, insecure_host_keys) as target:
        report = target.doctor(tensorflow=not no_tensorflow)
    if inventory is not None:
        render.hosts_doctor(report, as_json)
    elif as_json:
        console.plain(json.dumps({**doctor.to_json(report), "gpus": gpus.to_json(gpus.probe_gpus()),
                                  **({"rootless": limits} if limits is not None else {})}, indent=2))
    else:
        console.out.print(render.doctor_table(report))
        if limits is not None:
            render.rootless_limits(limits)
        for line in gpus.gpu_lines(gpus.probe_gpus()):
            console.plain(line)
    if not report.ready:
        sys.exit(int(common.ExitStatus.ERROR))


def _rootless_limits() -> list[dict]:
    """What this host withholds from a user without root (testbed/rootless.py), as rows; moves
    the doctor into a sandbox of its own to probe there, unless the host allows none."""
    from dataclasses import asdict

    from netbench.testbed import rootless, sandbox

    if os.environ.get("NETBENCH_SANDBOX"):
        sandbox.take_testbed(sandbox.PROBES, sys.argv[1:])  # inside it: its folder goes when the doctor ends
    elif not os.environ.get(sandbox.NO_SANDBOX_ENV):
        if rootless.refusal() is None:
            sandbox.take_testbed(sandbox.PROBES, sys.argv[1:])  # runs the doctor again in there
        os.environ[sandbox.NO_SANDBOX_ENV] = "1"
    limits = rootless.limits(rootless.read_host())
    blocking = rootless.refusal() if os.environ.get(sandbox.NO_SANDBOX_ENV) else None
    if blocking is not None and blocking.what not in {limit.what for limit in limits}:
        limits.insert(0, blocking)
    return [asdict(limit) for limit in limits]


@click.command("reset", short_help="Undo everything netbench recorded, also after a crash.")
@click.option("--all-namespaces", is_flag=True, help="Also remove testbed namespaces this state folder's "
              "journal did not record (another state folder's testbed, perhaps in use) and every process in them.")
@handle_errors
@inventory_options
def reset_cmd(all_namespaces: bool, inventory, insecure_host_keys) -> None:
    """Remove everything netbench recorded in its journal: qdiscs, iptables rules, delay engines,
    training processes, namespaces, veths and the bridge, cgroups and congestion-control settings. Works after a crash; safe to run twice. A
    testbed namespace the journal did not record stays unless --all-namespaces asks for it.

    \b
    Example: netbench reset
    """
    check_local_flags(inventory, insecure_host_keys)
    if inventory is not None and all_namespaces:  # refused before connecting to any host
        raise UsageError("flag --all-namespaces: only without --inventory (a host never removes namespaces)")
    from netbench.testbed.base import EMBEDDED

    kind, removed, failed = "embedded", {}, None
    if inventory is not None or os.geteuid() == 0:  # a user without root has only sandboxes
        with open_target(inventory, insecure_host_keys) as target:
            kind = target.kind
            try:
                removed = target.reset(warn=console.warning, all_namespaces=all_namespaces)
            except ResetIncomplete as exc:
                removed, failed = exc.removed, exc
    if inventory is None:  # the sandboxes: a user's testbeds, root's second ones beside its default
        try:
            removed.setdefault(EMBEDDED, []).extend(_reset_sandboxes(include_default=os.geteuid() != 0))
        except ResetIncomplete as exc:
            removed.setdefault(EMBEDDED, []).extend(exc.removed)
            failed = exc if failed is None else ResetIncomplete(removed, failed.failures + exc.failures)
    render.removed(kind, removed, complete=failed is None)  # what was removed, then each failure: exit 1
    if failed is not None:
        raise failed


def _reset_sandboxes(include_default: bool) -> list[str]:
    from netbench.state import places
    from netbench.testbed import sandboxes

    return sandboxes.reset_sandboxes(places.base_dir(os.environ, os.geteuid()), console.warning, include_default)

