"""The host side of remote mode: what `netbench node ...` does on a host, over SSH.

A controller plans the changes for each host (changes.py, as for the local testbed) and
sends them as JSON (wire.py); the host applies them with the same executor and adapters,
into its own journal, so `netbench node reset` restores it after any crash. The host's
own network namespace is the one shaped: plans name it `@host`, and the host attaches it
under /run/netns as `nbhost-<inode>` so the namespace-based adapters can address it.
(That name is deliberately not `netbench-*`: a local `netbench reset` stops every process
inside netbench namespaces, and this one is the host's own.)

Protection: a plan that touches the interface carrying this SSH session, or a device
stacked with it (its bridge or bond, their ports, a VLAN's parent), is refused unless forced,
so netbench never cuts its own control path. The session's endpoints come from
SSH_CONNECTION, which the controller passes as `node --ssh-connection` (sudo resets the
environment); when they are unknown, a plan is refused unless forced.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time
from importlib import metadata
from typing import Any

from netbench import __version__, proc, provenance
from netbench.state import lease
from netbench.emulation import changes as ch
from netbench.errors import NetbenchError, StateError, UsageError
from netbench.state.journal import Journal, Lock
from netbench.model.topology import Node, Topology
from netbench.remote.task_setup import CONTROL_VARIABLE, control_file, take_request, task_group

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


@dataclasses.dataclass(frozen=True)
class LinkInfo:
    """What the control-path guard needs of one interface: its stacking (ifindex-based)."""

    index: int
    name: str
    master: int | None = None  # IFLA_MASTER: the bridge or bond this is a port of
    parent: int | None = None  # IFLA_LINK in this namespace: the device a VLAN or macvlan sits on


def stacked_devices(names: set[str], links: list[LinkInfo]) -> set[str]:
    """`names` with every device stacked with them (pure): below (a bridge's or bond's ports,
    a VLAN's parent, recursively) and above (the bridge or bond it is a port of, recursively).
    Shaping any of those would shape the traffic of `names` too."""
    by_index = {link.index: link for link in links}
    by_name = {link.name: link for link in links}
    out = set(names)
    for start in (by_name[n] for n in names if n in by_name):
        below, seen = [start], {start.index}
        while below:
            link = below.pop()
            lower = [l for l in links if l.master == link.index]
            if link.parent in by_index:
                lower.append(by_index[link.parent])
            for l in lower:
                if l.index not in seen:
                    seen.add(l.index)
                    below.append(l)
                    out.add(l.name)
        link, above = start, {start.index}
        while link.master in by_index and link.master not in above:
            link = by_index[link.master]
            above.add(link.index)
            out.add(link.name)
    return out


def _plain_address(address: str) -> str:
    """An address as interfaces hold it: no IPv6 scope (fe80::1%eth0), an IPv4-mapped IPv6
    address (::ffff:10.0.0.1) as IPv4."""
    address = address.split("%")[0]
    return address[7:] if address.lower().startswith("::ffff:") and "." in address else address


def control_interfaces(environ: dict[str, str] | None = None) -> set[str] | None:
    """Interfaces carrying the SSH control connection: the one holding the server address,
    the one the route back to the controller leaves by, and every device stacked with them.
    None when that is unknown (no SSH_CONNECTION, or no interface matches it)."""
    endpoints = ssh_endpoints(environ)
    if endpoints is None:
        return None
    from pyroute2 import IPRoute

    client, server = (_plain_address(a) for a in endpoints)
    names: set[str] = set()
    with IPRoute() as ipr:
        links = [LinkInfo(index=link["index"], name=link.get_attr("IFLA_IFNAME"),
                          master=link.get_attr("IFLA_MASTER"),
                          # an IFLA_LINK with a netnsid is an index in another namespace (a veth's peer)
                          parent=None if link.get_attr("IFLA_LINK_NETNSID") is not None
                          else link.get_attr("IFLA_LINK"))
                 for link in ipr.get_links()]
        index_to_name = {link.index: link.name for link in links}
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
    names.discard("")
    if not names:
        return None  # the endpoints match nothing here: the control path is unknown
    return stacked_devices(names, links) - {"lo"}


def guard_control_path(plan: list[ch.Change], protected: set[str] | None, force: bool) -> None:
    """Refuse a plan that would shape the SSH control path, unless forced; with the control
    path unknown (`protected` None), refuse any plan unless forced."""
    if force:
        return
    if protected is None:
        raise UsageError("cannot tell which interface carries this SSH control connection "
                         "(its endpoints are unknown here)",
                         hint="drive the host with 'netbench apply --inventory ...', which passes them, "
                              "or pass --force if another path reaches this host")
    hit = sorted(touched_interfaces(plan) & protected)
    if hit:
        raise UsageError(f"plan shapes {', '.join(hit)}, which carries this SSH control connection",
                         hint="set the inventory's 'interface' to the data-plane interface, "
                              "or pass --force if another path reaches this host")


def apply_plan(plan: list[ch.Change], journal: Journal, *, lease_s: float = 0.0, force: bool = False,
               environ: dict[str, str] | None = None, holder: str | None = None,
               takeover: bool = False, executor: Any = None) -> dict[str, Any]:
    """Apply a controller's plan on this host; with `lease_s` > 0 take a lease for `holder`
    and make sure a lease watcher runs. An unexpired lease another holder has is refused
    unless `takeover`. If applying fails, this host's changes are undone before the error is
    raised. `executor`: a long-lived one (`node serve`'s, its netlink sockets held) instead
    of a fresh one. Returns what was done, as JSON-able data."""
    from netbench.emulation.executor import real_executor
    from netbench.emulation.held import held_from_entries
    from netbench.emulation.in_place import in_place

    guard_control_path(plan, control_interfaces(environ), force)
    if holder is None:
        holder = (ssh_endpoints(environ) or ("local",))[0]
    with Lock(journal.dir):
        check_holder(lease.read(journal.dir), holder, takeover)
        try:
            netns = attach_own_netns(journal)
            # planned without this host's journal: made in place against what it holds here
            bound = in_place(bind_plan(plan, netns), held_from_entries(journal.pending()))
            (executor or real_executor(journal, detach_engines=True)).apply(bound)
            watcher = None
            if lease_s > 0:
                lease.write(journal.dir, lease_s, holder=holder)
                watcher = _ensure_watcher(journal)
            else:
                lease.release(journal.dir)
        except Exception as exc:
            _undo_failed_apply(journal, exc)
            raise
    return {"applied": [c.describe() for c in bound], "lease_s": lease_s, "watcher_pid": watcher}


def held_by_another(state: lease.LeaseState, holder: str | None) -> str | None:
    """Who else holds this host now (an unexpired lease of another holder), or None (pure).
    A controller resetting what it applied leaves such a host alone: it was taken over
    between its last renewal and its reset."""
    if holder is None or not state.held or state.expired or state.holder == holder:
        return None
    return state.holder or "an unnamed holder"


def check_holder(state: lease.LeaseState, holder: str, takeover: bool) -> None:
    """Refuse to change a host whose unexpired lease another controller holds (pure)."""
    if not state.held or state.expired or state.holder == holder or takeover:
        return
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.taken)) if state.taken else "?"
    raise StateError(f"lease held by {state.holder or 'an unnamed holder'} since {since}, "
                     f"expires in {state.remaining_s:.0f} s unless renewed",
                     hint="another controller drives this host: wait for it, or pass --takeover "
                          "if it is gone")


def _undo_failed_apply(journal: Journal, exc: Exception) -> None:
    """Reset this host after a failed apply (the lock is held); a failure to do so is added
    to the apply error's hint, never raised in its place."""
    try:
        reset_host(journal)
    except Exception as undo:  # noqa: BLE001 - the apply error is the one to report
        if isinstance(exc, NetbenchError):
            note = f"undoing the partial apply also failed: {undo}; run 'netbench node reset'"
            exc.hint = f"{exc.hint}; {note}" if exc.hint else note


def _live_watchers(journal: Journal) -> list[int]:
    return [e.data["pid"] for e in journal.pending() if e.kind == "process" and e.data.get("role") == "lease-watch"
            and proc.is_same_process(e.data["pid"], e.data.get("start"))]


def _ensure_watcher(journal: Journal) -> int:
    # A live watcher is reused even when it was about to revert: it looks at the lease again
    # under the lock (held here) before reverting, so it sees the fresh lease and watches on;
    # one that has reverted marked its journal entry done, so it is not found here.
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
    watcher) through the undo registry the local reset uses; never touches namespaces it did
    not attach. Idempotent. An undo that fails does not stop the rest: ResetIncomplete at
    the end names each failure."""
    from netbench.errors import ResetIncomplete
    from netbench.state.reset import undo_each

    removed: list[str] = []
    failures: list[str] = []
    existing = {name for name in os.listdir(proc.NETNS_RUN_DIR)} if proc.NETNS_RUN_DIR.exists() else set()
    if lease.release(journal.dir):
        removed.append("lease")
    pending = list(reversed(journal.pending()))
    undo: list = []
    # the attached namespace reference goes last, after everything inside it is undone
    for entry in [e for e in pending if e.kind != "attach"] + [e for e in pending if e.kind == "attach"]:
        if entry.kind == "netns" or (entry.kind == "process" and entry.data["pid"] == keep_pid):
            journal.done(entry)  # a host never removes namespaces; the watcher does not stop itself
        else:
            undo.append(entry)
    removed += undo_each(journal, undo, existing, lambda line: None, failures)
    journal.compact()
    if failures:
        raise ResetIncomplete(removed, failures)
    return removed


class _NoSwitch:
    """A host has no switch namespace: no NFQUEUE rules to read."""

    def rules(self, netns: str) -> list[str]:
        return []


def show_host(journal: Journal, interface: str) -> dict[str, Any]:
    """What the host's data-plane interface holds now, its lease and its journal."""
    from netbench.emulation.netlink.qdisc import NetlinkQdiscs
    from netbench.emulation.executor import read_emulation, recorded_distributions

    netns = own_netns_name()
    rows: list[dict[str, Any]] = []
    if proc.netns_inode(netns) is not None:
        topo = host_topology(platform.node(), interface, netns)
        rows = read_emulation(topo, NetlinkQdiscs(), _NoSwitch(), None, recorded_distributions(journal))
    else:  # never attached: nothing netbench set can be here
        rows = [{"node": platform.node(), "ifname": interface, "qdisc": None, "ingress_qdisc": None,
                 "nfqueue_rules": [], "engine": None, "backend": None, "profile": None}]
    return {"host": platform.node(), "interface": interface, "nodes": [_plain_pairs(row) for row in rows],
            "lease": lease.read(journal.dir).to_json(), "watchers": _live_watchers(journal),
            "pending": [{"kind": e.kind, **e.data} for e in journal.pending()]}


def _plain_pairs(row: dict[str, Any]) -> dict[str, Any]:
    """A read-back row with a per-destination tree's netem leaves as JSON objects (they are
    NetemParams), so the controller reads each destination back (remote/pairs.hosts_pairs)."""
    tree = row.get("qdisc")
    if not isinstance(tree, dict) or not tree.get("pairs"):
        return row
    pairs = [{**entry, "netem": dataclasses.asdict(entry["netem"])} if dataclasses.is_dataclass(entry.get("netem"))
             else entry for entry in tree["pairs"]]
    return {**row, "qdisc": {**tree, "pairs": pairs}}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def host_info(interface: str | None = None, probe: bool = True,
              environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Facts the controller checks before it drives this host (doctor, apply). `environ`
    holds the SSH session's SSH_CONNECTION (default: this process's environment)."""
    from pyroute2 import IPRoute

    from netbench.testbed.netns import congestion_control

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
        "interfaces": interfaces, "tcp_congestion_control": congestion_control(),
        **{k: v for k, v in provenance.machine().items() if k not in ("host", "kernel", "shard")},
    }
    control = control_interfaces(environ)
    info["control_interfaces"] = sorted(control or ())
    info["control_path_known"] = control is not None  # False: `node apply` refuses without --force
    if interface is not None:
        info["interface_ok"] = interface in interfaces
    if probe and info["root"]:
        from netbench.emulation.probe import probe_netem

        try:  # its scratch name is per process: several hosts may share one /run/netns (tests)
            has_netem, why = probe_netem()
        except NetbenchError as exc:
            has_netem, why = False, exc.message
        info["backend"] = "netem" if has_netem else "userspace"
        info["backend_reason"] = why
    return info


def watch_lease(journal: Journal, on_error=None) -> str:
    """Run until the lease expires (then reset this host) or is released; a failed reset is
    reported to `on_error` and tried again."""
    def revert() -> bool:
        while True:  # an apply or reset in progress holds the lock: wait for it
            try:
                with Lock(journal.dir):
                    # look again under the lock: an apply that held it may have taken a fresh lease
                    if not lease.read(journal.dir).expired:
                        return False
                    reset_host(journal, keep_pid=os.getpid())  # releases the lease too
                return True
            except NetbenchError as exc:
                if "another netbench command" not in exc.message:
                    raise
                time.sleep(0.2)

    return lease.watch(journal.dir, revert, on_error=on_error)


TASK_MARK = "netbench-task"  # the first stdout line of `node task`: "netbench-task pid=N"


def run_task(journal: Journal, argv: list[str], env: dict[str, str], role: str, grace: float = 3.0,
             stdin=None, stdout=None, cpus: float | None = None, cgroups=None) -> int:
    """Run one job process for a controller, over SSH: its stdout is relayed line by line to
    this command's stdout (the SSH channel), its stderr goes straight there.

    The process is journaled while it runs, so `netbench node reset` (or an expired lease)
    stops it after any crash. It is stopped (TERM to its process group, `grace` s, KILL)
    when the controller closes this command's stdin, when the connection drops, or on
    SIGTERM/SIGHUP; once the process exits, what it left in its group (a background process,
    which would hold the relay's pipe) is stopped the same way. Returns its exit code (128 + signal when a signal ended it).

    A user's command (its environment names NETBENCH_CONTROL, a path on the controller) gets
    a control file of its own on this host instead: a "stop-at N" line from the controller
    on stdin is written there, where netbench.track's stop_requested() reads it.
    """
    import signal
    import subprocess
    import threading

    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout.buffer
    control = control_file() if CONTROL_VARIABLE in env else None
    if control is not None:
        env = {**env, CONTROL_VARIABLE: str(control)}
    groups, group = task_group(journal, role, cpus, cgroups)
    try:
        child = proc.spawn(argv, env={"PYTHONUNBUFFERED": "1", **env}, stdout=subprocess.PIPE, stderr=None,
                           cgroup=None if groups is None else str(groups.cgroups.path(group) / "cgroup.procs"))
    except BaseException:
        if groups is not None:
            groups.remove_all()
        raise
    entry = journal.record("process", pid=child.pid, start=proc.start_time(child.pid), netns=None, role=role)

    def on_signal(signum, frame):
        proc.stop_group(child, grace)

    if threading.current_thread() is threading.main_thread():  # (tests call this from a thread)
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGHUP, on_signal)

    def watch_stdin() -> None:
        # the raw descriptor, not the buffered object: a daemon thread blocked inside a
        # buffered read makes the interpreter abort at exit (and lose the exit status)
        pending = b""
        try:
            while chunk := os.read(stdin.fileno(), 4096):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    take_request(line, control)
        except (OSError, ValueError):
            pass
        proc.stop_group(child, grace)  # EOF: the controller stopped the task, or is gone

    def watch_child() -> None:
        # what the process left in its group (a background process of a script that exited)
        # would hold the relay's pipe open, unjournaled: ended as soon as the process exits
        child.wait()
        proc.stop_group(child, grace)

    threading.Thread(target=watch_stdin, name="netbench-task-stdin", daemon=True).start()
    threading.Thread(target=watch_child, name="netbench-task-exit", daemon=True).start()
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
        if control is not None:
            import shutil

            shutil.rmtree(control.parent, ignore_errors=True)
        if groups is not None:
            groups.remove_all()  # what cannot be removed stays journaled for 'netbench node reset'
    return 128 - code if code < 0 else code
