"""`netbench node ...`: what runs on a host, over SSH, for the controller (JSON in, JSON out).

The controller (remote.controller) calls these by name; their flags and JSON are the wire
between controller and host (remote.controller.answer_problem checks the answers).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from netbench import console
from netbench.cli import common
from netbench.cli.common import handle_errors
from netbench.cli.types import Seconds
from netbench.errors import UsageError


@click.group("node", hidden=True)  # run by the controller on hosts, not typed: left out of `netbench --help`
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help="This host's journal folder [default: NETBENCH_STATE_DIR or /run/netbench].")
@click.option("--ssh-connection", metavar="'CLIENT PORT SERVER PORT'",
              help="The SSH session's SSH_CONNECTION, as the login shell saw it (sudo resets the "
                   "environment) [default: this process's SSH_CONNECTION].")
@click.pass_context
def node(ctx: click.Context, state_dir: Path | None, ssh_connection: str | None) -> None:
    """Run on a remote host, by the controller over SSH: apply a change plan, show, reset.

    \b
    Example: netbench node apply --json --lease 60 < plan.json   # a change plan from the controller
    """
    from netbench.state.journal import Journal

    if ssh_connection and len(ssh_connection.split()) != 4:
        raise click.BadParameter(f"expected 'CLIENT PORT SERVER PORT', got {ssh_connection!r}",
                                 param_hint="'--ssh-connection'")
    ctx.meta[SESSION_KEY] = ssh_connection or None  # empty: the login shell had none
    ctx.obj = Journal(state_dir) if state_dir else Journal()


SESSION_KEY = "netbench.ssh_connection"


def _session_environ() -> dict[str, str] | None:
    """The SSH_CONNECTION given to `node --ssh-connection`, as an environment (None: use
    this process's own)."""
    value = click.get_current_context().meta.get(SESSION_KEY)
    return {"SSH_CONNECTION": value} if value else None


def _emit(data: Any) -> None:
    console.plain(json.dumps(data, indent=2, default=str))


@node.command("info")
@click.option("--interface", help="Also say whether this interface exists.")
@click.option("--no-probe", is_flag=True, help="Skip the netem probe (which needs root).")
@handle_errors
def node_info(interface: str | None, no_probe: bool) -> None:
    """Print this host's versions, interfaces, control path and backend as JSON.

    \b
    Example: netbench node info --interface eth1
    """
    from netbench.remote.agent import host_info

    _emit(host_info(interface, probe=not no_probe, environ=_session_environ()))


@node.command("apply")
@click.option("--json", "as_json", is_flag=True, required=True, help="Read the change plan as JSON on stdin.")
@click.option("--lease", "lease_s", default=0.0, show_default=True, type=Seconds(0, 86400),
              help="Seconds the shaping survives without renewal (0: no lease).")
@click.option("--force", is_flag=True, help="Shape even the interface carrying this SSH session.")
@click.option("--holder", help="Who takes the lease: the controller session's token [default: the SSH client address].")
@click.option("--takeover", is_flag=True, help="Apply even over an unexpired lease another holder has.")
@click.pass_obj
@handle_errors
def node_apply(journal, as_json: bool, lease_s: float, force: bool, holder: str | None, takeover: bool) -> None:
    """Apply a change plan (JSON on stdin) to this host, into its own journal.

    \b
    Example: netbench node apply --json --lease 60 < plan.json
    """
    from netbench.emulation.wire import plan_from_json
    from netbench.remote.agent import apply_plan

    plan = plan_from_json(sys.stdin.read())
    common.require_root()
    _emit(apply_plan(plan, journal, lease_s=lease_s, force=force, holder=holder, takeover=takeover,
                     environ=_session_environ()))


@node.command("serve")
@click.pass_obj
@handle_errors
def node_serve(journal) -> None:
    """Answer the controller's requests, one JSON line each, until stdin closes (a schedule's agent).

    Requests: {"op": "apply", "plan": {...}, "lease_s": 60, "holder": "..."} (as 'node apply'),
    {"op": "ping"}, {"op": "bye"}; one JSON reply line each, {"ok": false, "error": ...} on failure.

    \b
    Example: netbench node serve < requests.jsonl
    """
    from netbench.remote.serve import serve

    common.require_root()
    serve(journal, sys.stdin, sys.stdout, environ=_session_environ())


@node.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the only format).")
@click.option("--interface", required=True, help="The data-plane interface to read.")
@click.pass_obj
@handle_errors
def node_show(journal, as_json: bool, interface: str) -> None:
    """Read this host's shaping back from the kernel, with its lease and journal.

    \b
    Example: netbench node show --json --interface eth1
    """
    from netbench.remote.agent import show_host

    common.require_root()
    _emit(show_host(journal, interface))


@node.command("reset")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--holder", help="Reset only if no other holder has an unexpired lease here (a controller "
                               "resetting what it applied): otherwise remove nothing and answer who holds it.")
@click.pass_obj
@handle_errors
def node_reset(journal, as_json: bool, holder: str | None) -> None:
    """Undo everything this host's journal records (its shaping, lease and watcher).

    \b
    Example: netbench node reset --json
    """
    from netbench.state import lease
    from netbench.state.journal import Lock
    from netbench.remote.agent import held_by_another, reset_host

    common.require_root()
    with Lock(journal.dir):
        other = held_by_another(lease.read(journal.dir), holder)
        removed = [] if other else reset_host(journal)
    if as_json:
        _emit({"removed": removed, **({"held_by": other} if other else {})})
    elif other:
        console.info(f"left alone: {escape(other)} holds this host's lease now")
    else:
        for line in removed or ["nothing to remove"]:
            console.info(escape(line))


@node.command("task", context_settings={"ignore_unknown_options": True})
@click.option("--role", required=True, help="The task's role and index, e.g. worker0 (journaled with its pid).")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE", help="Environment for the process (repeatable).")
@click.option("--grace", default=3.0, show_default=True, type=Seconds(0, 600),
              help="Seconds between TERM and KILL when the task is stopped.")
@click.option("--cpus", "cpus_text", metavar="CPUS",
              help="Start the process (and all it starts) in a cgroup of its own limited to CPUS, e.g. 0.5.")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_obj
@handle_errors
def node_task(journal, role: str, env: tuple[str, ...], grace: float, cpus_text, argv: tuple[str, ...]) -> None:
    """Run one job process for the controller, relaying its output; closing stdin stops it.

    The first stdout line is "netbench-task pid=N"; the process's own lines follow. A
    "stop-at N" line on stdin is a user's command's stop request: written into the control
    file this host gives it (its NETBENCH_CONTROL). Exits with the process's exit code (128 + signal when a signal ended it).

    \b
    Example: netbench node task --role worker0 --env TF_CONFIG={...} -- python -m netbench.jobs.worker
    """
    from netbench.remote.agent import run_task

    variables = {}
    for item in env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"flag --env: expected NAME=VALUE, got {item!r}")
        variables[name] = value
    from netbench.model.compute import parse_cpus

    cpus = parse_cpus(cpus_text, "flag --cpus") if cpus_text else None
    sys.exit(run_task(journal, list(argv), variables, role, grace, cpus=cpus))


@node.command("lease-watch")
@click.pass_obj
@handle_errors
def node_lease_watch(journal) -> None:
    """Wait for the lease to expire, then reset this host (started by 'node apply --lease').

    \b
    Example: netbench node lease-watch
    """
    from netbench.state import lease
    from netbench.remote.agent import watch_lease

    def report(exc: Exception) -> None:  # this process's output goes to lease-watch.log
        console.plain(json.dumps({"event": "revert failed", "error": str(exc), "retry_s": lease.REVERT_RETRY_S}))

    started = time.time()
    outcome = watch_lease(journal, on_error=report)
    console.plain(json.dumps({"event": f"lease {outcome}", "after_s": round(time.time() - started, 3)}))
