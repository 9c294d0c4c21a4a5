"""The host side of remote mode: what `netbench node ...` does on a host, over SSH.

A controller plans the changes for each host (changes.py, as for the local testbed) and
sends them as JSON (wire.py); the host applies them with the same executor and adapters,
into its own journal, so `netbench node reset` restores it after any crash. The host's
own network namespace is the one shaped: plans name it `@host`, and the host attaches it
under /run/netns as `nbhost-<inode>` so the namespace-based adapters can address it.
(That name is deliberately not `netbench-*`: a local `netbench reset` stops every process
inside netbench namespaces, and this one is the host's own.)

Protection: a plan that touches the interface carrying this SSH session (from
SSH_CONNECTION) is refused unless forced, so netbench never cuts its own control path.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from netbench import __version__, lease, proc
from netbench.emulation import changes as ch
from netbench.errors import NetbenchError, UsageError
from netbench.journal import Journal, Lock
from netbench.testbed.topology import Node, Topology

HOST_NETNS = "@host"  # in a plan: the host's own network namespace
ATTACH_PREFIX = "nbhost-"


def own_netns_name() -> str:
    """The /run/netns name for this process's network namespace (by inode, so unique)."""
    return f"{ATTACH_PREFIX}{os.stat('/proc/self/ns/net').st_ino}"


def attach_own_netns(journal: Journal) -> str:
    """Make /run/netns/nbhost-<inode> refer to this namespace (ip netns attach); idempotent."""
    name = own_netns_name()
    if proc.netns_inode(name) == os.stat("/proc/self/ns/net").st_ino:
        return name
    journal.record("attach", name=name)
    proc.run(["ip", "netns", "attach", name, str(os.getpid())])
    return name


def detach_own_netns() -> bool:
    name = own_netns_name()
    if proc.netns_inode(name) is None:
        return False
    # `ip netns delete` of an attached name only unmounts the reference: nothing is killed
    proc.run(["ip", "netns", "delete", name], check=False)
    return True


def host_topology(name: str, interface: str, netns: str = HOST_NETNS, address: str = "") -> Topology:
    """A host as a one-node topology: its data-plane interface in its own namespace."""
    node = Node(name=name, netns=netns, ifname=interface, address=address, prefixlen=32, port="")
    return Topology(nodes=(node,), subnet="", switch_netns=netns, bridge="")


def bind_plan(plan: list[ch.Change], netns: str) -> list[ch.Change]:
    """Replace the `@host` placeholder with this host's attached namespace name."""
    return [dataclasses.replace(c, netns=netns) if c.netns == HOST_NETNS else c for c in plan]


def touched_interfaces(plan: list[ch.Change]) -> set[str]:
    """Every interface a plan changes (qdiscs, ingress redirects)."""
    out: set[str] = set()
    for change in plan:
        for attr in ("ifname", "dev"):
            value = getattr(change, attr, None)
            if value:
                out.add(value)
    return out


def ssh_endpoints(environ: dict[str, str] | None = None) -> tuple[str, str] | None:
    """(client address, server address) of the SSH session this runs under, if any."""
    parts = (environ if environ is not None else os.environ).get("SSH_CONNECTION", "").split()
    return (parts[0], parts[2]) if len(parts) == 4 else None


def control_interfaces(environ: dict[str, str] | None = None) -> set[str]:
    """Interfaces carrying the SSH control connection: the one holding the server address
    and the one the route back to the controller leaves by."""
    endpoints = ssh_endpoints(environ)
    if endpoints is None:
        return set()
    from pyroute2 import IPRoute

    client, server = endpoints
    names: set[str] = set()
    with IPRoute() as ipr:
        index_to_name = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        for addr in ipr.get_addr():
            if addr.get_attr("IFA_ADDRESS") == server:
                names.add(index_to_name.get(addr["index"], ""))
        try:
            for route in ipr.route("get", dst=client):
                oif = route.get_attr("RTA_OIF")
                if oif in index_to_name:
                    names.add(index_to_name[oif])
        except Exception:  # no route back (odd, but the address check above still holds)
            pass
    names.discard("lo")
    names.discard("")
    return names


def guard_control_path(plan: list[ch.Change], protected: set[str], force: bool) -> None:
    """Refuse a plan that would shape the SSH control path, unless forced."""
    hit = sorted(touched_interfaces(plan) & protected)
    if hit and not force:
        raise UsageError(f"plan shapes {', '.join(hit)}, which carries this SSH control connection",
                         hint="set the inventory's 'interface' to the data-plane interface, "
                              "or pass --force if another path reaches this host")


def apply_plan(plan: list[ch.Change], journal: Journal, *, lease_s: float = 0.0, force: bool = False,
               environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Apply a controller's plan on this host; with `lease_s` > 0 take a lease and make sure
    a lease watcher runs. Returns what was done, as JSON-able data."""
    from netbench.emulation.apply import real_executor

    guard_control_path(plan, control_interfaces(environ), force)
    with Lock(journal.dir):
        netns = attach_own_netns(journal)
        bound = bind_plan(plan, netns)
        executor = real_executor(journal, detach_engines=True)
        executor.apply(bound)
        watcher = None
        if lease_s > 0:
            lease.write(journal.dir, lease_s, holder=(ssh_endpoints(environ) or ("local",))[0])
            watcher = _ensure_watcher(journal)
        else:
            lease.release(journal.dir)
    return {"applied": [c.describe() for c in bound], "lease_s": lease_s, "watcher_pid": watcher}


def _live_watchers(journal: Journal) -> list[int]:
    return [e.data["pid"] for e in journal.pending() if e.kind == "process" and e.data.get("role") == "lease-watch"
            and proc.is_same_process(e.data["pid"], e.data.get("start"))]


def _ensure_watcher(journal: Journal) -> int:
    live = _live_watchers(journal)
    if live:
        return live[0]
    journal.dir.mkdir(parents=True, exist_ok=True)
    log = journal.dir / "lease-watch.log"
    argv = [sys.executable, "-m", "netbench.cli", "node", "--state-dir", str(journal.dir), "lease-watch"]
    with open(log, "ab") as log_fh:
        # its own session, no tie to this SSH session: it must outlive the controller
        child = proc.spawn(argv, stdout=log_fh, stderr=log_fh, die_with_parent=False,
                           env={"PYTHONPATH": proc.child_pythonpath()})
    journal.record("process", pid=child.pid, start=proc.start_time(child.pid), netns=None, role="lease-watch")
    return child.pid


def reset_host(journal: Journal, keep_pid: int | None = None) -> list[str]:
    """Undo this host's journal (qdiscs, ingress redirects, engines, rules, the lease and its
    watcher); never touches namespaces it did not attach. Idempotent."""
    from netbench.reset import undo_entry

    removed: list[str] = []
    existing = {name for name in os.listdir(proc.NETNS_RUN_DIR)} if proc.NETNS_RUN_DIR.exists() else set()
    if lease.release(journal.dir):
        removed.append("lease")
    for entry in reversed(journal.pending()):
        if entry.kind == "attach":
            continue  # after everything inside it is undone, below
        if entry.kind == "netns" or (entry.kind == "process" and entry.data["pid"] == keep_pid):
            journal.done(entry)  # a host never removes namespaces; the watcher does not stop itself
            continue
        line = undo_entry(entry, existing)
        if line:
            removed.append(line)
        journal.done(entry)
    attached = [e for e in journal.pending() if e.kind == "attach"]
    if attached and detach_own_netns():
        removed.append(f"namespace reference {own_netns_name()}")
    for entry in attached:
        journal.done(entry)
    journal.compact()
    return removed


class _NoSwitch:
    """A host has no switch namespace: no NFQUEUE rules to read."""

    def rules(self, netns: str) -> list[str]:
        return []


def show_host(journal: Journal, interface: str) -> dict[str, Any]:
    """What the host's data-plane interface holds now, its lease and its journal."""
    from netbench.emulation.adapters import NetlinkQdiscs
    from netbench.emulation.apply import read_emulation, recorded_distributions

    netns = own_netns_name()
    rows: list[dict[str, Any]] = []
    if proc.netns_inode(netns) is not None:
        topo = host_topology(platform.node(), interface, netns)
        rows = read_emulation(topo, NetlinkQdiscs(), _NoSwitch(), None, recorded_distributions(journal))
    else:  # never attached: nothing netbench set can be here
        rows = [{"node": platform.node(), "ifname": interface, "qdisc": None, "ingress_qdisc": None,
                 "nfqueue_rules": [], "engine": None, "backend": None, "profile": None}]
    return {"host": platform.node(), "interface": interface, "nodes": rows,
            "lease": lease.read(journal.dir).to_json(), "watchers": _live_watchers(journal),
            "pending": [{"kind": e.kind, **e.data} for e in journal.pending()]}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def host_info(interface: str | None = None, probe: bool = True) -> dict[str, Any]:
    """Facts the controller checks before it drives this host (doctor, apply)."""
    from pyroute2 import IPRoute

    interfaces: dict[str, list[str]] = {}
    with IPRoute() as ipr:
        names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        for name in names.values():
            interfaces[name] = []
        for addr in ipr.get_addr():
            interfaces.setdefault(names.get(addr["index"], "?"), []).append(
                f"{addr.get_attr('IFA_ADDRESS')}/{addr['prefixlen']}")
    info: dict[str, Any] = {
        "host": platform.node(), "netbench": __version__, "python": platform.python_version(),
        "root": os.geteuid() == 0, "kernel": platform.release(),
        "tensorflow": _version("tensorflow-cpu") or _version("tensorflow"),
        "interfaces": interfaces, "control_interfaces": sorted(control_interfaces()),
    }
    if interface is not None:
        info["interface_ok"] = interface in interfaces
    if probe and info["root"]:
        from netbench.emulation.adapters import probe_netem

        try:  # its scratch name is per process: several hosts may share one /run/netns (tests)
            has_netem, why = probe_netem()
        except NetbenchError as exc:
            has_netem, why = False, exc.message
        info["backend"] = "netem" if has_netem else "userspace"
        info["backend_reason"] = why
    return info


def watch_lease(journal: Journal) -> str:
    """Run until the lease expires (then reset this host) or is released."""
    def revert() -> None:
        while True:  # an apply or reset in progress holds the lock: wait for it
            try:
                with Lock(journal.dir):
                    reset_host(journal, keep_pid=os.getpid())
                return
            except NetbenchError as exc:
                if "another netbench command" not in exc.message:
                    raise
                time.sleep(0.2)

    return lease.watch(journal.dir, revert)



TASK_MARK = "netbench-task"  # the first stdout line of `node task`: "netbench-task pid=N"


def run_task(journal: Journal, argv: list[str], env: dict[str, str], role: str, grace: float = 3.0,
             stdin=None, stdout=None) -> int:
    """Run one job process for a controller, over SSH: its stdout is relayed line by line to
    this command's stdout (the SSH channel), its stderr goes straight there.

    The process is journaled while it runs, so `netbench node reset` (or an expired lease)
    stops it after any crash. It is stopped (TERM to its process group, `grace` s, KILL)
    when the controller closes this command's stdin, when the connection drops, or on
    SIGTERM/SIGHUP. Returns its exit code (128 + signal when a signal ended it).
    """
    import signal
    import subprocess
    import threading

    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout.buffer
    child = proc.spawn(argv, env={"PYTHONUNBUFFERED": "1", **env}, stdout=subprocess.PIPE, stderr=None)
    entry = journal.record("process", pid=child.pid, start=proc.start_time(child.pid), netns=None, role=role)

    def on_signal(signum, frame):
        proc.stop_group(child, grace)

    if threading.current_thread() is threading.main_thread():  # (tests call this from a thread)
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGHUP, on_signal)

    def watch_stdin() -> None:
        # the raw descriptor, not the buffered object: a daemon thread blocked inside a
        # buffered read makes the interpreter abort at exit (and lose the exit status)
        try:
            while os.read(stdin.fileno(), 4096):
                pass
        except (OSError, ValueError):
            pass
        proc.stop_group(child, grace)  # EOF: the controller stopped the task, or is gone

    threading.Thread(target=watch_stdin, name="netbench-task-stdin", daemon=True).start()
    try:
        stdout.write(f"{TASK_MARK} pid={child.pid}\n".encode())
        stdout.flush()
        for line in iter(child.stdout.readline, b""):
            stdout.write(line)
            stdout.flush()
    except (BrokenPipeError, OSError, ValueError):
        pass  # the channel is gone: stop the process below
    finally:
        code = proc.stop_group(child, grace)
        if code is None:
            code = child.wait()
        journal.done(entry)
    return 128 - code if code < 0 else code
