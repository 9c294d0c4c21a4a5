"""The userspace backend, for kernels without netem: rate through a tbf qdisc on each
node's egress; delay, jitter and loss by a delay engine per node behind an NFQUEUE rule
in the switch namespace. It cannot emulate the netem-only keys and refuses them."""

from __future__ import annotations

from typing import Any, Sequence

from netbench.emulation import changes as ch
from netbench.emulation.backends.base import Backend
from netbench.errors import BackendUnavailable
from netbench.model.profile import Profile
from netbench.model.topology import Node, Topology

# the doctor checks this backend needs (experiment/doctor.py)
NEEDS = ("tbf", "iptables", "NFQUEUE", "physdev", "bridge netfilter")


def plan_node(profile: Profile, node: Node, position: int, switch: str, seed: int) -> list[ch.Change]:
    changes: list[ch.Change] = [ch.ClearQdisc(node.name, node.netns, node.ifname)]
    if profile.rate_bps:
        changes.append(ch.SetTbf(node.name, node.netns, node.ifname, profile.rate_bps,
                                 ch.tbf_burst_bytes(profile.rate_bps), ch.tbf_limit_bytes(profile.rate_bps)))
    if profile.delay_us or profile.jitter_us or profile.loss:
        # the engine binds its queue before the rule exists: without --queue-bypass, packets
        # queued to an unbound queue would be dropped
        queue = ch.queue_num(position)
        changes.append(ch.StartEngine(node.name, switch, queue, profile.delay_us,
                                      profile.jitter_us, profile.loss, seed))
        changes.append(ch.AddNfqueueRule(node.name, switch, node.port, queue))
    return changes


def refuse(profile: Profile, where: str = "") -> None:
    unsupported = profile.netem_only_fields()
    if unsupported:
        raise BackendUnavailable(f"profile {profile.name}: the userspace backend cannot emulate "
                                 f"{', '.join(unsupported)}", hint="these need a kernel with netem ('netbench doctor' "
                                 "says what this host has); remove them to use the userspace backend")


def plan(profile: Profile, topology: Topology, nodes: Sequence[Node], seed: int = 0) -> list[ch.Change]:
    """Clears and re-creates; each node's engine gets its own seed (seed + node position)
    so losses are independent."""
    refuse(profile)
    changes: list[ch.Change] = [ch.ClearIngress(node.name, node.netns, node.ifname, ch.ifb_name(node.ifname))
                                for node in nodes]
    for node in nodes:
        position = topology.nodes.index(node)
        changes += plan_node(profile, node, position, topology.switch_netns, seed + position)
    return changes


def holds(egress: Any, ingress: Any, rules: list[str]) -> bool:
    return bool(rules) or bool(egress and egress.get("kind") == "tbf")


BACKEND = Backend(
    name="userspace", plan=plan, refuse=refuse, holds=holds, probe=None, needs=NEEDS, on_hosts="rateonly",
    fallback_note="using NFQUEUE + delay engines")
