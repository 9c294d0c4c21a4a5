"""The testbed as a plain graph, planned before anything is created (pure).

N nodes, each a network namespace with one interface (`eth0`) whose veth peer sits in a
switch namespace holding a bridge. Nothing is created in the host's own namespace, and the
subnet is chosen so it overlaps none of the host's routes.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Iterable

PREFIX = "netbench-"
SWITCH_NETNS = PREFIX + "sw"
BRIDGE = "nbbr0"
NODE_IFNAME = "eth0"
MAX_NODES = 64
# short-lived namespaces (doctor's probes, the backend probe) carry their maker's pid and
# start time, so a reset removes one only once that process is gone
SCRATCH_PREFIX = "nbscratch-"
_NODE_NETNS = re.compile(re.escape(PREFIX) + r"n([1-9][0-9]*)")
_SCRATCH_NETNS = re.compile(re.escape(SCRATCH_PREFIX) + r"[a-z]+-([0-9]+)-([0-9]+)")

# Candidate /24s, tried in order; 10.213/16 then 172.30/16 are rarely used by real networks.
_CANDIDATE_SUPERNETS = ("10.213.0.0/16", "172.30.0.0/16", "192.168.213.0/24")


@dataclass(frozen=True)
class Node:
    """One testbed node: its name (n1..nN), namespace, interface and address."""

    name: str
    netns: str
    ifname: str
    address: str
    prefixlen: int
    port: str  # the veth peer's name in the switch namespace

    def to_json(self) -> dict:
        return {"name": self.name, "netns": self.netns, "ifname": self.ifname,
                "address": self.address, "prefixlen": self.prefixlen}


@dataclass(frozen=True)
class Topology:
    nodes: tuple[Node, ...]
    subnet: str
    switch_netns: str = SWITCH_NETNS
    bridge: str = BRIDGE

    def node(self, name: str) -> Node | None:
        for node in self.nodes:
            if name in (node.name, node.netns):
                return node
        return None

    def to_json(self) -> dict:
        return {"subnet": self.subnet, "switch": self.switch_netns, "bridge": self.bridge,
                "nodes": [node.to_json() for node in self.nodes]}


def node_name(index: int) -> str:
    """Nodes are named n1, n2, ... as Mininet names hosts h1, h2."""
    return f"n{index + 1}"


def choose_subnet(host_networks: Iterable[str]) -> ipaddress.IPv4Network:
    """The first candidate /24 that overlaps none of `host_networks` (CIDR strings)."""
    taken = []
    for net in host_networks:
        try:
            taken.append(ipaddress.ip_network(net, strict=False))
        except ValueError:
            continue
    taken = [net for net in taken if net.version == 4 and net.prefixlen > 0]  # ignore default routes
    for supernet in _CANDIDATE_SUPERNETS:
        for candidate in ipaddress.ip_network(supernet).subnets(new_prefix=24):
            if not any(candidate.overlaps(net) for net in taken):
                return candidate
    raise ValueError("no free private /24 found for the testbed")


def plan_topology(nodes: int, subnet: ipaddress.IPv4Network) -> Topology:
    """Name and address `nodes` nodes on `subnet` (.1 is n1, .2 is n2, ...)."""
    if not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"nodes must be between 1 and {MAX_NODES}, got {nodes}")
    hosts = list(subnet.hosts())
    planned = []
    for index in range(nodes):
        name = node_name(index)
        planned.append(Node(name=name, netns=PREFIX + name, ifname=NODE_IFNAME,
                            address=str(hosts[index]), prefixlen=subnet.prefixlen, port=f"nb-{name}"))
    return Topology(nodes=tuple(planned), subnet=str(subnet))


def is_netbench_netns(name: str) -> bool:
    """True for exactly the names plan_topology gives (the switch, n1..n64), never for
    another `netbench-*` name someone else made."""
    if name == SWITCH_NETNS:
        return True
    match = _NODE_NETNS.fullmatch(name)
    return match is not None and int(match.group(1)) <= MAX_NODES


def scratch_netns(purpose: str, pid: int, start: int | None) -> str:
    """The name of a scratch namespace made by process `pid` (started at `start`, clock ticks)."""
    return f"{SCRATCH_PREFIX}{purpose}-{pid}-{start or 0}"


def scratch_owner(name: str) -> tuple[int, int] | None:
    """(pid, start time) of the process that made scratch namespace `name`, else None."""
    match = _SCRATCH_NETNS.fullmatch(name)
    return (int(match.group(1)), int(match.group(2))) if match else None
