"""The netem backend: every profile key through kernel qdiscs (netem, htb for rates and
peers, an ifb for ingress), changed in place so a live link keeps its queue."""

from __future__ import annotations

from typing import Any, Sequence

from netbench.emulation import changes as ch
from netbench.emulation.backends.base import Backend
from netbench.emulation.held import Held
from netbench.emulation.in_place import in_place
from netbench.emulation.probe import probe_netem
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


def refuse(profile: Profile, where: str = "") -> None:
    """netem emulates every profile key."""


def holds(egress: Any, ingress: Any, rules: list[str]) -> bool:
    return any(tree and tree.get("kind") in ("netem", "htb") for tree in (egress, ingress))


BACKEND = Backend(
    name="netem", plan=plan, refuse=refuse, holds=holds, probe=probe_netem, needs=("netem",), on_hosts="netem",
    unavailable_hint="install your distribution's kernel modules (sch_netem) or use --backend userspace")
