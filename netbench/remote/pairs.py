"""A per-pair topology (model/pairs.py) over an inventory's hosts: each host gets its row (pure).

Each inventory host is one node of the topology, by name. A host shapes its data-plane
interface's egress per destination, toward every other host's tf_address (the address the
jobs use), as its row of the topology says: one changes.ShapePairs (an htb class and netem
leaf per destination), planned by the netem backend's plan_pairs as for a local node. Only
netem shapes per destination on a host (a host without it shapes rate only), so a host whose
backend is not netem is refused, naming it.

Read back: `hosts_pairs` turns each host's `netbench node show` answer into the PairTopology
the hosts hold, their destinations named by the inventory's tf_addresses.
"""

from __future__ import annotations

from typing import Any

from netbench.emulation import changes as ch
from netbench.emulation.backends import get_backend
from netbench.errors import BackendUnavailable, UsageError
from netbench.model.pairs import PairTopology, check_nodes
from netbench.model.topology import Topology
from netbench.remote.inventory import Host, Inventory


def check_inventory_nodes(pairs: PairTopology, inventory: Inventory) -> None:
    """Every node `pairs` names is an inventory host, and every host the topology shapes
    traffic from or to has a tf_address; one-line errors naming the file and key."""
    check_nodes(pairs, [h.name for h in inventory.hosts], f"the inventory {inventory.path}")
    used = {name for item in pairs.links for name in (item.src, item.dst)}
    for host in inventory.hosts:
        if host.name in used and not host.tf_address:
            raise UsageError(f"{inventory.path}: hosts.{host.name}.tf_address: missing; the topology "
                             f"{pairs.source or pairs.name} shapes traffic to and from {host.name}, by that address",
                             hint="set tf_address to the host's address on the data-plane interface")


def plan_pairs_for_host(pairs: PairTopology, host: Host, backend: str, topology: Topology) -> list[ch.Change]:
    """The changes that shape `host`'s egress per destination as its row of `pairs` says
    (`topology`: remote.hosts_topology, destinations at their tf_address /32). `backend` is
    the host's; what it means on a host must shape per destination (netem), else a one-line
    BackendUnavailable naming the host."""
    chosen = get_backend(backend, on_host=True)
    if chosen.plan_pairs is None:
        raise BackendUnavailable(f"host {host.name}: a topology needs the netem backend there (it has "
                                 f"{backend}, which on a host shapes rate only, not per destination)",
                                 hint="load sch_netem on the host (modprobe sch_netem), then 'netbench doctor "
                                      "--inventory ...'")
    node = next(n for n in topology.nodes if n.name == host.name)
    return chosen.plan_pairs(pairs, topology, (node,), 0)


def hosts_pairs(shown: dict[str, dict[str, Any]], topology: Topology, name: str = "active") -> PairTopology | None:
    """The PairTopology the hosts hold, from each host's `node show` answer (host -> answer;
    `topology`: remote.hosts_topology), or None when no host shapes per destination. Rows
    are named by inventory host (a host reports its own hostname), destinations by the
    inventory's tf_addresses."""
    from netbench.emulation.readback import pairs_from_rows
    from netbench.emulation.wire import netem_from_json

    rows = []
    for host, answer in shown.items():
        for row in answer.get("nodes", []):
            tree = row.get("qdisc") or {}
            if tree.get("pairs"):  # each destination's netem leaf, sent as a JSON object (null: none)
                pairs = [{**entry, "netem": None if entry.get("netem") is None else
                          netem_from_json(entry["netem"], f"host {host}: qdisc.pairs[{i}].netem")}
                         for i, entry in enumerate(tree["pairs"])]
                row = {**row, "qdisc": {**tree, "pairs": pairs}}
            rows.append({**row, "node": host})
    return pairs_from_rows(rows, topology, name=name)
