"""The netem backend: every profile key through kernel qdiscs (netem, htb for rates and
peers, an ifb for ingress), changed in place so a live link keeps its queue; a per-pair
topology as one htb class + netem per destination (plan_pairs, changes.ShapePairs)."""

from __future__ import annotations

from typing import Any, Sequence

from netbench.emulation import changes as ch
from netbench.emulation.backends.base import Backend
from netbench.emulation.held import Held
from netbench.emulation.in_place import in_place
from netbench.emulation.probe import probe_netem
from netbench.errors import UsageError
from netbench.model.pairs import PairTopology
from netbench.model.profile import Profile
from netbench.model.topology import Node, Topology


def plan_node(profile: Profile, topology: Topology, node: Node) -> list[ch.Change]:
    """No clearing first: replacing in place lets a live link keep its queue."""
    ifb = ch.ifb_name(node.ifname)
    if profile.is_null:
        return [ch.ClearQdisc(node.name, node.netns, node.ifname), ch.ClearIngress(node.name, node.netns, node.ifname, ifb)]
    peers = ch.resolve_peers(profile, topology, node)
    if profile.peers and not peers:
        return [ch.ClearQdisc(node.name, node.netns, node.ifname), ch.ClearIngress(node.name, node.netns, node.ifname, ifb)]
    changes: list[ch.Change] = []
    if profile.direction in ("egress", "both"):
        changes.append(ch.shape_device(profile, node, node.ifname, peers, "dst"))
    else:
        changes.append(ch.ClearQdisc(node.name, node.netns, node.ifname))
    if profile.direction in ("ingress", "both"):
        changes.append(ch.SetIngress(node.name, node.netns, node.ifname, ifb))
        changes.append(ch.shape_device(profile, node, ifb, peers, "src"))
    else:
        changes.append(ch.ClearIngress(node.name, node.netns, node.ifname, ifb))
    return changes


def plan(profile: Profile, topology: Topology, nodes: Sequence[Node], seed: int = 0,
         held: Held | None = None) -> list[ch.Change]:
    """With `held`, nothing that is not held is cleared (everything else is changed in place
    already: netem `change`, htb classes replaced, filters re-made): in_place, as on a host."""
    changes: list[ch.Change] = []
    for node in nodes:
        changes += plan_node(profile, topology, node)
    return changes if held is None else in_place(changes, held)


def plan_pairs(pairs: PairTopology, topology: Topology, nodes: Sequence[Node], seed: int = 0,
               held: Held | None = None) -> list[ch.Change]:
    """Each node's egress shaped per destination as `pairs` says: one ShapePairs with a class
    per shaped destination (its address /32 in `topology`), in `pairs`' destination order; a
    node with none is cleared. Only egress: any ingress redirect netbench held goes. Names
    not in `topology` are skipped (the caller checks names first). In place with `held`."""
    by_name = {node.name: node for node in topology.nodes}
    changes: list[ch.Change] = []
    for node in nodes:
        classes = tuple(ch.pair_class(link.profile, f"{by_name[link.dst].address}/32")
                        for link in pairs.from_node(node.name)
                        if link.dst in by_name and link.dst != node.name and not link.profile.is_null)
        _check_classes(node.name, node.ifname, classes)
        if classes:
            changes.append(ch.ShapePairs(node.name, node.netns, node.ifname, classes))
        else:
            changes.append(ch.ClearQdisc(node.name, node.netns, node.ifname))
        changes.append(ch.ClearIngress(node.name, node.netns, node.ifname, ch.ifb_name(node.ifname)))
    return changes if held is None else in_place(changes, held)


def _check_classes(node: str, dev: str, classes: tuple[ch.PairClass, ...]) -> None:
    if len(classes) > ch.MAX_PAIR_CLASSES:
        raise UsageError(f"{node}: {len(classes)} shaped destinations; netbench shapes at most "
                         f"{ch.MAX_PAIR_CLASSES} per node", hint="shape fewer nodes or use a default: for the rest")
    if len(classes) > 1 and any(c.netem.duplicate for c in classes):
        # as shape_device: the kernel refuses a duplicating netem beside any other netem on a device
        raise UsageError(f"{node}: duplicate on a pair needs a netem per destination on {dev}, and the kernel "
                         "refuses a duplicating netem beside other netems",
                         hint="drop duplicate from the topology's links, or shape a single destination")


def refuse(profile: Profile, where: str = "") -> None:
    """netem emulates every profile key."""


def holds(egress: Any, ingress: Any, rules: list[str]) -> bool:
    return any(tree and tree.get("kind") in ("netem", "htb") for tree in (egress, ingress))


BACKEND = Backend(
    name="netem", plan=plan, plan_pairs=plan_pairs, refuse=refuse, holds=holds, probe=probe_netem, needs=("netem",), on_hosts="netem",
    unavailable_hint="install your distribution's kernel modules (sch_netem) or use --backend userspace")
