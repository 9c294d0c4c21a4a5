"""Testbed commands: bring the embedded namespaces up and down, show them, run in a node."""

from __future__ import annotations

import json
import sys

import click

from netbench import console
from netbench.cli import common, render
from netbench.cli.common import handle_errors
from netbench.errors import TestbedError, UsageError


@click.group(short_help="Bring the embedded testbed (namespaces here) up, show it, down.")
def testbed() -> None:
    """Bring the embedded testbed (network namespaces on this machine) up and down."""


@testbed.command("up", short_help="Create --nodes namespaces joined by a bridge.")
@click.option("--nodes", default=2, show_default=True, type=click.IntRange(1, 64), help="Number of nodes.")
@handle_errors
def testbed_up(nodes: int) -> None:
    """Create --nodes namespaces (n1, n2, ...) joined by a bridge in a switch namespace.

    \b
    Example: netbench testbed up --nodes 3
    """
    from netbench.state.journal import Journal, Lock
    from netbench.testbed import netns as local

    common.require_testbed("up")
    journal = Journal()
    with Lock(journal.dir):
        topo = local.up(nodes, journal)
    console.info(f"testbed up: {len(topo.nodes)} nodes on {topo.subnet}")
    render.topology_table(topo)


@testbed.command("down", short_help="Remove the testbed's namespaces and everything in them.")
@handle_errors
def testbed_down() -> None:
    """Remove the testbed's namespaces (and every process and qdisc inside them).

    \b
    Example: netbench testbed down
    """
    from netbench.state.journal import Journal, Lock
    from netbench.testbed import netns as local

    from netbench.testbed import sandbox

    common.require_testbed("uses")
    journal = Journal()
    with Lock(journal.dir):
        removed = local.down(journal)
        journal.compact()
    kept = sandbox.settle_in()  # a user's testbed: its keeper has nothing left to hold
    if kept is not None and kept.kind == sandbox.KEEPER:
        sandbox.stop_keeper(kept)
    console.info(f"removed {', '.join(removed)}" if removed else "no testbed was up")


@testbed.command("show", short_help="Show the testbed as the kernel holds it.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {subnet, nodes: [{name, netns, address, ...}]}.")
@handle_errors
def testbed_show(as_json: bool) -> None:
    """Show the testbed as the kernel holds it.

    \b
    Example: netbench testbed show --json
    """
    import os

    from netbench import proc
    from netbench.state import places
    from netbench.state.journal import state_dir
    from netbench.testbed import netns as local, sandboxes

    common.require_testbed("shows")  # a user's own testbed is in their keeper's sandbox
    inside = bool(os.environ.get(places.SANDBOX_ENV))
    topo = local.discover() if inside or os.geteuid() == 0 else None
    euid = proc.owner_uid() if inside else os.geteuid()
    others = sandboxes.listing(sandboxes.bases_to_list(0 if euid == 0 else euid, os.environ), skip=state_dir())
    if as_json:
        console.plain(json.dumps({**(topo.to_json() if topo else {"nodes": []}), "testbeds": others}, indent=2))
        return
    if topo is None:
        console.info("no testbed is up (start one with 'netbench testbed up')")
    else:
        render.topology_table(topo)
    if others:
        render.testbeds_table(others)


@click.command("exec", short_help="Run a command inside a testbed node.", context_settings={"ignore_unknown_options": True})
@click.argument("node")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@handle_errors
def exec_(node: str, command: tuple[str, ...]) -> None:
    """Run COMMAND inside testbed NODE, as Mininet's 'h1 ping h2'.

    \b
    Example: netbench exec n1 -- ping -c 3 n2
    Node names in COMMAND's arguments (n1, n2, ...) are replaced by their addresses.
    """
    from netbench import proc
    from netbench.testbed import netns as local

    common.require_testbed("uses")
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
        sys.exit(int(common.ExitStatus.INTERRUPTED))
