"""The embedded testbed: network namespaces, veths and a bridge on this machine, via pyroute2.

Every namespace is journaled before it is created, so `netbench reset` can remove it after
any crash. Removing a namespace removes its veths, qdiscs and iptables rules with it.
"""

from __future__ import annotations

import errno
from contextlib import closing

from pyroute2 import IPRoute, NetNS
from pyroute2.netlink.exceptions import NetlinkError

from netbench import proc
from netbench.emulation.netlink import rtnl
from netbench.errors import PrivilegeError, TestbedError
from netbench.state.journal import Entry, Journal
from netbench.model import topology as topo

netns = proc.pyroute2_netns()  # pyroute2's, in this testbed's folder of namespaces


def _netlink_error(action: str, exc: NetlinkError) -> TestbedError:
    if exc.code == errno.EPERM:
        return PrivilegeError(f"{action}: permission denied", hint="run netbench as root")
    return TestbedError(f"{action}: {exc.args[1] if len(exc.args) > 1 else exc}")


def host_networks() -> list[str]:
    """CIDRs of every IPv4 route in the host's namespace (to avoid colliding with them)."""
    with IPRoute() as ipr:
        nets = []
        for route in ipr.get_routes(family=2):
            dst = route.get_attr("RTA_DST")
            if dst:
                nets.append(f"{dst}/{route['dst_len']}")
        for addr in ipr.get_addr(family=2):
            nets.append(f"{addr.get_attr('IFA_ADDRESS')}/{addr['prefixlen']}")
    return nets


def list_netbench_netns() -> list[str]:
    """The testbed's namespaces: only the names plan_topology gives, and never one that is a
    reference to the host's own namespace (see proc.is_host_netns)."""
    return sorted(name for name in netns.listnetns()
                  if topo.is_netbench_netns(name) and not proc.is_host_netns(name))


def host_netns_references() -> list[str]:
    """Testbed names that are references to the host's own namespace: left alone."""
    return sorted(name for name in netns.listnetns() if topo.is_netbench_netns(name) and proc.is_host_netns(name))


def stale_scratch_netns() -> list[str]:
    """Scratch namespaces (doctor, backend probe) whose maker is no longer running."""
    stale = []
    for name in netns.listnetns():
        owner = topo.scratch_owner(name)
        if owner is not None and not proc.is_same_process(*owner):
            stale.append(name)
    return sorted(stale)


def _create_netns(name: str, journal: Journal, made: list[tuple[str, Entry]]) -> None:
    """Journal, then create namespace `name`; on success add it to `made`."""
    entry = journal.record("netns", name=name)
    try:
        netns.create(name)
    except OSError as exc:
        journal.done(entry)  # nothing was made (an existing one is not ours to remove)
        if exc.errno == errno.EPERM:
            raise PrivilegeError(f"cannot create namespace {name}: permission denied",
                                 hint="run netbench as root") from None
        raise TestbedError(f"cannot create namespace {name}: {exc}") from None
    made.append((name, entry))


def _take_down(made: list[tuple[str, Entry]], journal: Journal) -> None:
    """Remove what a failed `up` made, newest first, so no half-built testbed stays."""
    for name, entry in reversed(made):
        try:
            remove_netns(name)
        except TestbedError:
            continue  # stays journaled: 'netbench reset' tries again
        journal.done(entry)


def up(nodes: int, journal: Journal) -> topo.Topology:
    """Create the switch namespace with its bridge and `nodes` node namespaces."""
    if list_netbench_netns():
        raise TestbedError("a testbed is already up",
                           hint="use it, or take it down with 'netbench testbed down'")
    subnet = topo.choose_subnet(host_networks())
    plan = topo.plan_topology(nodes, subnet)
    made: list[tuple[str, Entry]] = []
    try:
        try:
            _create_netns(plan.switch_netns, journal, made)
            with NetNS(plan.switch_netns, flags=0) as sw:
                _set_up(sw, "lo")
                sw.link("add", ifname=plan.bridge, kind="bridge")
                bridge = _set_up(sw, plan.bridge)
                for node in plan.nodes:
                    _create_netns(node.netns, journal, made)
                    sw.link("add", ifname=node.port, kind="veth",
                            # the full path: pyroute2 looks a bare name up in /var/run/netns,
                            # never in a sandbox's folder of namespaces
                            peer={"ifname": node.ifname, "net_ns_fd": str(proc.NETNS_RUN_DIR / node.netns)})
                    port = sw.link_lookup(ifname=node.port)[0]
                    sw.link("set", index=port, master=bridge, state="up")
            for node in plan.nodes:
                with NetNS(node.netns, flags=0) as ns:
                    _set_up(ns, "lo")
                    index = ns.link_lookup(ifname=node.ifname)[0]
                    ns.addr("add", index=index, address=node.address, prefixlen=node.prefixlen)
                    ns.link("set", index=index, state="up")
        except NetlinkError as exc:
            raise _netlink_error("creating the testbed", exc) from None
        except OSError as exc:  # a namespace removed under us (NetNS never re-creates it)
            raise TestbedError(f"creating the testbed: {exc.strerror or exc}") from None
    except BaseException:
        _take_down(made, journal)  # a failure halfway (or Ctrl-C) leaves nothing behind
        raise
    return plan


def _set_up(ipr: NetNS, ifname: str) -> int:
    index = ipr.link_lookup(ifname=ifname)[0]
    ipr.link("set", index=index, state="up")
    return index


def discover(open_socket=None) -> topo.Topology | None:
    """Read the testbed back from the kernel: None when no netbench namespace exists.
    `open_socket(netns)`: a context manager giving an IPRoute in netns (a pool the caller's
    changes reuse); by default one made and closed here per namespace."""
    names = list_netbench_netns()
    if not names:
        return None
    nodes = []
    subnet = ""
    node_names = sorted((n for n in names if n != topo.SWITCH_NETNS),
                        key=lambda n: (len(n), n))
    for name in node_names:
        short = name[len(topo.PREFIX):]
        address, prefixlen = "", 0
        try:
            # a socket made in-process (never a namespace re-created: pyroute2's NetNS would)
            with (open_socket(name) if open_socket else closing(rtnl.iproute_in(name))) as ns:
                found = ns.link_lookup(ifname=topo.NODE_IFNAME)
                if found:
                    for addr in ns.get_addr(index=found[0], family=2):
                        address, prefixlen = addr.get_attr("IFA_ADDRESS"), addr["prefixlen"]
        except (NetlinkError, OSError):
            pass
        if address and not subnet:
            import ipaddress
            subnet = str(ipaddress.ip_interface(f"{address}/{prefixlen}").network)
        nodes.append(topo.Node(name=short, netns=name, ifname=topo.NODE_IFNAME, address=address,
                               prefixlen=prefixlen, port=f"nb-{short}"))
    return topo.Topology(nodes=tuple(nodes), subnet=subnet)


def link_counters(name: str, ifname: str) -> tuple[int, int]:
    """(rx_bytes, tx_bytes) of interface `ifname` in namespace `name`, read over netlink (a
    socket made in-process in the namespace: no fork, a few milliseconds)."""
    try:
        with closing(rtnl.iproute_in(name)) as ns:
            links = ns.get_links(ifname=ifname)
            stats = dict(links[0].get_attr("IFLA_STATS64") or links[0].get_attr("IFLA_STATS") or {}) if links else None
    except (NetlinkError, OSError) as exc:
        raise TestbedError(f"node {name}: cannot read {ifname}'s counters: {exc}") from None
    if stats is None:
        raise TestbedError(f"node {name}: no interface {ifname}")
    return int(stats.get("rx_bytes", 0)), int(stats.get("tx_bytes", 0))


CONGESTION_CONTROL_SYSCTL = "/proc/sys/net/ipv4/tcp_congestion_control"


def congestion_control(name: str | None = None) -> str:
    """The TCP congestion control that new connections in namespace `name` use (a namespace
    starts with the host's default; None: this process's namespace); "" when it cannot be read."""
    return read_sysctl("net.ipv4.tcp_congestion_control", name)


def _sysctl_path(key: str) -> str:
    return "/proc/sys/" + key.replace(".", "/")


def read_sysctl(key: str, name: str | None = None) -> str:
    """A sysctl's value (e.g. net.ipv4.tcp_congestion_control) in namespace `name` (None: this
    process's namespace); "" when it cannot be read."""
    if name is None:
        try:
            with open(_sysctl_path(key)) as fh:
                return fh.read().strip()
        except OSError:
            return ""
    result = proc.run(["cat", _sysctl_path(key)], netns=name, check=False)
    return result.stdout.strip() if result.returncode == 0 else ""


def write_sysctl(key: str, value: str, name: str | None = None) -> None:
    """Set a sysctl in namespace `name` (None: this process's namespace); TestbedError with the
    kernel's reason when it refuses (an algorithm a namespace may not choose: "Operation not
    permitted"; one the kernel does not have: "No such file or directory")."""
    result = proc.run(["sysctl", "-q", "-w", f"{key}={value}"], netns=name, check=False)
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        where = f" in {name}" if name else " on the host"
        raise TestbedError(f"cannot set {key}={value}{where}: {detail[-1] if detail else result.returncode}")


def remove_netns(name: str) -> bool:
    """Stop every process inside namespace `name`, then delete it. False if it was not there,
    or if it is a reference to the host's own namespace (nothing is stopped or removed)."""
    if name not in netns.listnetns() or proc.is_host_netns(name):
        return False
    proc.stop_pids(proc.pids_in_netns(name), grace=3.0)
    try:
        netns.remove(name)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise TestbedError(f"cannot remove namespace {name}: {exc}") from None
        return False
    return True


def down(journal: Journal) -> list[str]:
    """Remove every netbench namespace (nodes first, then the switch)."""
    removed = []
    for name in sorted(list_netbench_netns(), key=lambda n: n == topo.SWITCH_NETNS):
        if remove_netns(name):
            removed.append(name)
    left = set(list_netbench_netns())
    for entry in journal.pending():
        # everything inside a removed namespace (its qdiscs, rules, processes) went with it
        where = entry.data.get("name") if entry.kind == "netns" else entry.data.get("netns")
        if isinstance(where, str) and topo.is_netbench_netns(where) and where not in left:
            journal.done(entry)
    return removed
