"""Remote mode on the command line.

- `netbench node ...`: what runs on a host, over SSH (JSON in, JSON out).
- `with_inventory(...)`: gives a local command (apply, show, reset, doctor) an
  `--inventory FILE` option; with it, the command drives the inventory's hosts instead.
- `netbench provision --inventory FILE`: install this netbench on every host.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import click
from rich.markup import escape

from netbench import console
from netbench.cli.types import FiniteFloatRange
from netbench.errors import NetbenchError, UsageError

INVENTORY_HELP = "Drive the SSH hosts of this inventory (YAML) instead of the local testbed."
INSECURE_HELP = "Accept any SSH host key (default: verify against known_hosts)."
TAKEOVER_HELP = ("With --inventory: apply even to hosts whose unexpired lease another controller holds "
                 "(one that is gone, or one you mean to stop).")


def _node_errors(func):
    """the CLI's error translation, looked up at call time (cli.py imports this module)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from netbench.cli.app import handle_errors

        return handle_errors(func)(*args, **kwargs)

    return wrapper


# ---------------------------------------------------------------- host side: netbench node

@click.group("node")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help="This host's journal folder [default: NETBENCH_STATE_DIR or /run/netbench].")
@click.option("--ssh-connection", metavar="'CLIENT PORT SERVER PORT'",
              help="The SSH session's SSH_CONNECTION, as the login shell saw it (sudo resets the "
                   "environment) [default: this process's SSH_CONNECTION].")
@click.pass_context
def node(ctx: click.Context, state_dir: Path | None, ssh_connection: str | None) -> None:
    """Run on a remote host, by the controller over SSH: apply a change plan, show, reset.

    Example: netbench plan JSON | netbench node apply --json --lease 60
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
@_node_errors
def node_info(interface: str | None, no_probe: bool) -> None:
    """Print this host's versions, interfaces, control path and backend as JSON.

    Example: netbench node info --interface eth1
    """
    from netbench.remote.agent import host_info

    _emit(host_info(interface, probe=not no_probe, environ=_session_environ()))


@node.command("apply")
@click.option("--json", "as_json", is_flag=True, required=True, help="Read the change plan as JSON on stdin.")
@click.option("--lease", "lease_s", default=0.0, show_default=True, type=FiniteFloatRange(0, 86400),
              help="Seconds the shaping survives without renewal (0: no lease).")
@click.option("--force", is_flag=True, help="Shape even the interface carrying this SSH session.")
@click.option("--holder", help="Who takes the lease: the controller session's token [default: the SSH client address].")
@click.option("--takeover", is_flag=True, help="Apply even over an unexpired lease another holder has.")
@click.pass_obj
@_node_errors
def node_apply(journal, as_json: bool, lease_s: float, force: bool, holder: str | None, takeover: bool) -> None:
    """Apply a change plan (JSON on stdin) to this host, into its own journal.

    Example: netbench node apply --json --lease 60 < plan.json
    """
    from netbench.cli.app import require_root
    from netbench.emulation.wire import plan_from_json
    from netbench.remote.agent import apply_plan

    plan = plan_from_json(sys.stdin.read())
    require_root()
    _emit(apply_plan(plan, journal, lease_s=lease_s, force=force, holder=holder, takeover=takeover,
                     environ=_session_environ()))


@node.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the only format).")
@click.option("--interface", required=True, help="The data-plane interface to read.")
@click.pass_obj
@_node_errors
def node_show(journal, as_json: bool, interface: str) -> None:
    """Read this host's shaping back from the kernel, with its lease and journal.

    Example: netbench node show --json --interface eth1
    """
    from netbench.cli.app import require_root
    from netbench.remote.agent import show_host

    require_root()
    _emit(show_host(journal, interface))


@node.command("reset")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
@_node_errors
def node_reset(journal, as_json: bool) -> None:
    """Undo everything this host's journal records (its shaping, lease and watcher).

    Example: netbench node reset --json
    """
    from netbench.cli.app import require_root
    from netbench.state.journal import Lock
    from netbench.remote.agent import reset_host

    require_root()
    with Lock(journal.dir):
        removed = reset_host(journal)
    if as_json:
        _emit({"removed": removed})
    else:
        for line in removed or ["nothing to remove"]:
            console.info(escape(line))


@node.command("task", context_settings={"ignore_unknown_options": True})
@click.option("--role", required=True, help="The task's role and index, e.g. worker0 (journaled with its pid).")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE", help="Environment for the process (repeatable).")
@click.option("--grace", default=3.0, show_default=True, type=FiniteFloatRange(0, 600),
              help="Seconds between TERM and KILL when the task is stopped.")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_obj
@_node_errors
def node_task(journal, role: str, env: tuple[str, ...], grace: float, argv: tuple[str, ...]) -> None:
    """Run one job process for the controller, relaying its output; closing stdin stops it.

    The first stdout line is "netbench-task pid=N"; the process's own lines follow.
    Exits with the process's exit code (128 + signal when a signal ended it).

    Example: netbench node task --role worker0 --env TF_CONFIG={...} -- python -m netbench.jobs.worker
    """
    from netbench.remote.agent import run_task

    variables = {}
    for item in env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"flag --env: expected NAME=VALUE, got {item!r}")
        variables[name] = value
    sys.exit(run_task(journal, list(argv), variables, role, grace))


@node.command("lease-watch")
@click.pass_obj
@_node_errors
def node_lease_watch(journal) -> None:
    """Wait for the lease to expire, then reset this host (started by 'node apply --lease').

    Example: netbench node lease-watch
    """
    from netbench.state import lease
    from netbench.remote.agent import watch_lease

    def report(exc: Exception) -> None:  # this process's output goes to lease-watch.log
        console.plain(json.dumps({"event": "revert failed", "error": str(exc), "retry_s": lease.REVERT_RETRY_S}))

    started = time.time()
    outcome = watch_lease(journal, on_error=report)
    console.plain(json.dumps({"event": f"lease {outcome}", "after_s": round(time.time() - started, 3)}))


# ---------------------------------------------------------------- controller side: --inventory

def with_inventory(remote: Callable[..., None], extra: tuple = ()):
    """Add --inventory and --insecure-host-keys (and `extra` remote-only options, which
    default to None) to a local command; with --inventory, `remote(**options)` runs instead."""
    extra_names = [opt.name for opt in extra]

    def decorate(func):
        @functools.wraps(func)
        def wrapper(*args, inventory=None, insecure_host_keys=False, **kwargs):
            remote_only = {name: kwargs.pop(name) for name in extra_names}
            if inventory is None:
                for name, value in remote_only.items():
                    if value not in (None, False):
                        raise UsageError(f"flag --{name.replace('_', '-')}: only with --inventory")
                if insecure_host_keys:
                    raise UsageError("flag --insecure-host-keys: only with --inventory")
                return func(*args, **kwargs)
            return remote(inventory=inventory, insecure_host_keys=insecure_host_keys, **remote_only, **kwargs)

        for option in reversed([
            click.option("--inventory", type=click.Path(dir_okay=False, path_type=Path), help=INVENTORY_HELP),
            click.option("--insecure-host-keys", is_flag=True, help=INSECURE_HELP),
            *[click.option(*opt.decls, **opt.attrs) for opt in extra],
        ]):
            wrapper = option(wrapper)
        return wrapper

    return decorate


class Opt:
    def __init__(self, name: str, *decls: str, **attrs: Any) -> None:
        self.name, self.decls, self.attrs = name, decls, attrs


APPLY_EXTRA = (
    Opt("lease", "--lease", type=FiniteFloatRange(0, 86400), default=None,
        help="With --inventory: lease in seconds [default: 60]; the command holds it until Ctrl-C, and "
             "hosts revert by themselves if it is not renewed. 0: no lease, return at once."),
    Opt("force", "--force", is_flag=True, default=None,
        help="With --inventory: shape even an interface that carries the SSH connection."),
    Opt("takeover", "--takeover", is_flag=True, default=None, help=TAKEOVER_HELP),
)


def _open(inventory_path: Path, insecure: bool):
    from netbench.remote.inventory import load_inventory
    from netbench.remote.ssh import connect_all

    inventory = load_inventory(inventory_path)
    return inventory, connect_all(inventory, insecure_host_keys=insecure)


def _close(conns) -> None:
    for conn in conns:
        try:
            conn.close()
        except Exception:  # closing a broken connection: nothing left to do
            pass


def remote_apply(*, inventory, insecure_host_keys, lease, force, takeover, profile_file, latency, jitter, bandwidth,
                 loss, backend, dry_run) -> None:
    from netbench.remote import controller as remote
    from netbench.state.lease import DEFAULT_LEASE_S, new_holder
    from netbench.model.profile import load_profile, profile_from_flags

    base = load_profile(profile_file) if profile_file else None
    profile = profile_from_flags(base, latency=latency, jitter=jitter, bandwidth=bandwidth, loss=loss)
    if base is None and profile.is_null:
        raise UsageError("nothing to apply: give a PROFILE_FILE or at least one of --latency, --jitter, "
                         "--bandwidth, --loss", hint="e.g. netbench apply --inventory hosts.yaml --bandwidth 100mbit")
    lease_s = DEFAULT_LEASE_S if lease is None else lease
    inv, conns = _open(inventory, insecure_host_keys)
    holder = new_holder()
    try:
        remote.check_lease(lease_s, len(inv.hosts))
        if dry_run and backend != "auto":  # the backend is given: plan without contacting any host
            topology = remote.hosts_topology(inv)
            planned = remote.RemoteApply(backends={h.name: backend for h in inv.hosts},
                                         plans={h.name: remote.plan_for_host(profile, h, backend, topology)
                                                for h in inv.hosts})
        else:
            if dry_run:
                console.info("asking each host for its backend ('netbench node info'; nothing is changed; "
                             "--backend skips this)")
            planned = remote.plan_inventory(inv, conns, profile, None if backend == "auto" else backend)
        for host in inv.hosts:
            backend_name = escape(str(planned.backends[host.name]))
            console.info(f"host [bold]{host.name}[/] ({host.interface}): backend {backend_name}")
            if dry_run:
                for change in planned.plans[host.name]:
                    console.plain("  " + change.describe())
        if dry_run:
            console.info("[yellow]dry run[/]: no host was changed")
            return
        remote.apply_inventory(inv, conns, planned, lease_s=lease_s, force=bool(force), holder=holder,
                               takeover=bool(takeover))
        console.info(f"[green]applied[/] profile {escape(profile.name)} ({escape(profile.label())}) "
                     f"to {len(conns)} host(s)")
        if lease_s <= 0:
            console.info("no lease: it stays until 'netbench reset --inventory ...'")
            return
        _hold(inv, conns, lease_s, holder)
    finally:
        _close(conns)


def _hold(inv, conns, lease_s: float, holder: str) -> None:
    """Renew the lease until Ctrl-C or SIGTERM, then revert every host. Renewal failures are
    shown as they come and go."""
    from rich.markup import escape

    from netbench.remote import controller as remote
    from netbench.cli.app import _sigterm_as_interrupt

    _sigterm_as_interrupt()
    console.info(f"holding a {lease_s:g} s lease on every host as {escape(holder)}; Ctrl-C reverts them "
                 "(if this process dies, each host reverts by itself when the lease runs out)")
    keeper = remote.LeaseKeeper(inv, conns, lease_s, holder)
    shown: dict[str, str] = {}
    try:
        with keeper:
            while not keeper.lost:
                failures = dict(keeper.failures)
                for name, why in failures.items():
                    if shown.get(name) != why:
                        console.info(f"[yellow]{escape(why)}[/] (the host reverts by itself if this lasts {lease_s:g} s)")
                for name in set(shown) - set(failures):
                    console.info(f"host {name}: lease renewed again")
                shown = failures
                time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    # a lost host reverted by itself or is another controller's now: leave it alone
    removed = remote.reset_inventory(inv, [c for c in conns if c.name not in keeper.lost])
    console.info(f"reverted {', '.join(removed) or 'no host'}")
    if keeper.lost:
        lost = "; ".join(f"{name}: {why}" for name, why in keeper.lost.items())
        raise NetbenchError(f"lost the lease on {lost}", hint="renewals did not reach the host in time")


def remote_show(*, inventory, insecure_host_keys, as_json) -> None:
    from netbench.remote import controller as remote

    inv, conns = _open(inventory, insecure_host_keys)
    try:
        shown = remote.show_inventory(inv, conns)
    finally:
        _close(conns)
    if as_json:
        console.plain(json.dumps({"hosts": shown}, indent=2, default=str))
        return
    from rich.table import Table

    from netbench.cli.app import _show_cells

    table = Table(title="active emulation on each host's data-plane interface")
    for col in ("host", "backend", "delay", "jitter", "loss", "rate", "other", "engine", "qdisc drops", "lease"):
        table.add_column(col)
    for name, data in shown.items():
        lease = data["lease"]
        lease_text = f"{lease['remaining_s']:.0f}/{lease['seconds']:g} s" if lease["held"] else "-"
        for row in data["nodes"]:
            table.add_row(name, *_show_cells(row)[1:], lease_text)
    console.out.print(table)


def remote_reset(*, inventory, insecure_host_keys) -> None:
    from netbench.remote import controller as remote

    inv, conns = _open(inventory, insecure_host_keys)
    try:
        removed = remote.reset_inventory(inv, conns)
    finally:
        _close(conns)
    for name, lines in removed.items():
        for line in lines:
            console.info(f"{name}: removed {escape(str(line))}")
        if not lines:
            console.info(f"{name}: nothing to remove")
    from netbench.metrics.exporter import remove_stale_targets, targets_dir

    for line in remove_stale_targets(targets_dir()):  # this controller's side: a killed sweep's target file
        console.info(f"removed {line}")


def remote_doctor(*, inventory, insecure_host_keys, as_json, no_tensorflow) -> None:
    from importlib import metadata

    from rich.table import Table

    from netbench.remote import controller as remote

    tensorflow = None
    if not no_tensorflow:
        for dist in ("tensorflow-cpu", "tensorflow"):
            try:
                tensorflow = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    inv, conns = _open(inventory, insecure_host_keys)
    by_name = {h.name: h for h in inv.hosts}
    try:
        results = remote.in_parallel(conns, lambda c: remote.doctor_host(c, by_name[c.name], tensorflow))
    finally:
        _close(conns)
    rows = {name: (r if not isinstance(r, Exception) else [("reachable", "missing", r.message)])
            for name, r in results.items()}
    if no_tensorflow:
        rows = {name: [row for row in r if row[0] != "tensorflow"] for name, r in rows.items()}
    ready = all(all(status in ("ok", "limited") for _, status, _ in r) for r in rows.values())
    if as_json:
        console.plain(json.dumps({"ready": ready, "hosts": {n: [{"check": c, "status": s, "detail": d}
                                                                 for c, s, d in r] for n, r in rows.items()}},
                                 indent=2))
    else:
        table = Table(title=f"hosts of {escape(inv.path)}")
        for col in ("host", "check", "status", "detail"):
            table.add_column(col)
        colour = {"ok": "green", "limited": "yellow"}
        for name, r in rows.items():
            for check, status, detail in r:
                table.add_row(name, escape(str(check)), f"[{colour.get(status, 'red')}]{escape(str(status))}[/]",
                              escape(str(detail)))
        console.out.print(table)
    if not ready:
        sys.exit(1)


# ---------------------------------------------------------------- sweeps and playbooks over hosts

def hosts_options(func):
    """--inventory, --insecure-host-keys and --takeover for sweep and run (their own bodies use them)."""
    for option in reversed([
        click.option("--inventory", type=click.Path(dir_okay=False, path_type=Path),
                     help="Run on the SSH hosts of this inventory (YAML) instead of the local testbed."),
        click.option("--insecure-host-keys", is_flag=True, help=INSECURE_HELP),
        click.option("--takeover", is_flag=True, help=TAKEOVER_HELP),
    ]):
        func = option(func)
    return func


def check_on_hosts(config, inventory_path: Path):
    """Load the inventory and place every run on its hosts (no connection); bad input raises."""
    from netbench.remote.inventory import load_inventory
    from netbench.testbed.hosts import place_hosts

    if config.verify:
        raise UsageError("flag --verify: not with --inventory (it measures between local namespaces)",
                         hint="measure the hosts' links with ping and iperf3 on the hosts themselves")
    inventory = load_inventory(inventory_path)
    for run in config.runs:
        place_hosts(inventory, run.job, run.workers)
    return inventory


@contextlib.contextmanager
def hosts_testbed(inventory_path: Path, insecure: bool, config, takeover: bool = False):
    """The inventory's hosts as the sweep's testbed; every run is placed on hosts first
    (pure checks, no connection), and the connections are closed afterwards."""
    from netbench.testbed.hosts import HostsTestbed
    from netbench.remote.ssh import connect_all

    inventory = check_on_hosts(config, inventory_path)
    conns = connect_all(inventory, insecure_host_keys=insecure)  # connects on first use
    try:
        yield HostsTestbed(inventory, conns, config.backend, takeover=takeover)
    finally:
        _close(conns)


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


# ---------------------------------------------------------------- provision

@click.command("provision")
@click.option("--inventory", required=True, type=click.Path(dir_okay=False, path_type=Path), help=INVENTORY_HELP)
@click.option("--insecure-host-keys", is_flag=True, help=INSECURE_HELP)
@click.option("--wheel", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Install this wheel [default: build one from this netbench's source].")
@click.option("--pip-args", default="", help="Extra arguments for pip on the hosts, e.g. '--no-index --find-links /srv'.")
def provision(inventory: Path, insecure_host_keys: bool, wheel: Path | None, pip_args: str) -> None:
    """Install this controller's netbench on every host: build a wheel, copy it, and install
    it into each host's venv (inventory key 'venv', created if missing).

    Example: netbench provision --inventory hosts.yaml
    """
    from netbench.cli.app import handle_errors

    try:
        pip_words = shlex.split(pip_args)
    except ValueError as exc:
        raise click.BadParameter(f"cannot split {pip_args!r}: {exc}", param_hint="'--pip-args'") from None
    handle_errors(_provision)(inventory, insecure_host_keys, wheel, pip_words)


def build_wheel(out_dir: Path) -> Path:
    """A wheel of the netbench this controller runs (its source tree, no dependencies)."""
    source = Path(__file__).resolve().parents[2]
    if not (source / "setup.cfg").exists():
        raise UsageError("this netbench was not installed from a source tree: cannot build a wheel",
                         hint="pass --wheel PATH")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                             "-w", str(out_dir), str(source)], capture_output=True, text=True)
    wheels = sorted(out_dir.glob("netbench-*.whl"))
    if result.returncode != 0 or not wheels:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise NetbenchError(f"building the netbench wheel failed: {detail[-1] if detail else result.returncode}")
    return wheels[-1]


def _provision(inventory_path: Path, insecure: bool, wheel: Path | None, pip_words: list[str]) -> None:
    from netbench.remote import controller as remote

    inv, conns = _open(inventory_path, insecure)
    by_name = {h.name: h for h in inv.hosts}
    q = shlex.quote
    with tempfile.TemporaryDirectory(prefix="netbench-wheel-") as tmp:
        wheel = wheel or build_wheel(Path(tmp))
        constraints = Path(__file__).resolve().parents[2] / "constraints.txt"

        def install(conn) -> str:
            host = by_name[conn.name]
            sudo = "sudo -n " if host.sudo else ""
            stage = private_stage(conn)  # root installs from it: nobody else may swap the wheel
            try:
                staged = f"{stage}/{wheel.name}"
                conn.put(wheel, staged)
                cflag = ""
                if constraints.exists():
                    conn.put(constraints, f"{stage}/constraints.txt")
                    cflag = f" -c {q(stage + '/constraints.txt')}"
                venv = host.venv
                make_venv = f"test -x {q(venv + '/bin/python')} || python3 -m venv {q(venv)}"
                run_checked(conn, f"{sudo}sh -c {q(make_venv)}")
                run_checked(conn, f"{sudo}{q(venv + '/bin/pip')} install -q --disable-pip-version-check{cflag} "
                                  + "".join(f"{q(word)} " for word in pip_words) + q(staged), timeout=600)
                return run_checked(conn, f"{q(venv + '/bin/netbench')} --version").strip()
            finally:
                with contextlib.suppress(NetbenchError):  # best effort: the error that matters is above
                    conn.run(f"rm -rf -- {q(stage)}", timeout=120)

        try:
            results = remote.in_parallel(conns, install)
        finally:
            _close(conns)
    for name, result in results.items():
        if isinstance(result, Exception):
            console.error(result.message, getattr(result, "hint", None))
        else:
            console.info(f"{name}: [green]installed[/] {escape(str(result))} in {escape(by_name[name].venv)}")
    if any(isinstance(r, Exception) for r in results.values()):
        sys.exit(1)


def private_stage(conn) -> str:
    """A fresh staging folder on the host (mktemp -d), checked to be a directory owned by
    the SSH user with mode 700, so no other local user can change what is installed."""
    from netbench.remote.controller import RemoteError

    stage = run_checked(conn, 'mktemp -d "${TMPDIR:-/tmp}/netbench-provision.XXXXXXXXXX"').strip()
    if not stage.startswith("/") or "\n" in stage:
        raise RemoteError(f"host {conn.name}: mktemp -d printed {stage!r}, not a folder")
    facts = run_checked(conn, f"stat -c '%u %a %F' -- {shlex.quote(stage)} && id -u").split("\n")
    owner, mode, kind = (facts[0].split(" ", 2) + ["", "", ""])[:3]
    me = facts[1].strip() if len(facts) > 1 else "?"
    if (owner, mode, kind) != (me, "700", "directory"):
        raise RemoteError(f"host {conn.name}: staging folder {stage} is not private: {kind or '?'} owned by uid "
                          f"{owner or '?'}, mode {mode or '?'} (expected a directory owned by uid {me}, mode 700)",
                          hint="check the host's TMPDIR and /tmp")
    return stage


def run_checked(conn, command: str, timeout: float = 120.0) -> str:
    from netbench.remote.controller import RemoteError

    result = conn.run(command, timeout=timeout)
    if not result.ok:
        lines = (result.stderr or result.stdout).strip().splitlines()
        raise RemoteError(f"host {conn.name}: {command.split()[0]} failed: {lines[-1] if lines else result.exit_code}")
    return result.stdout
