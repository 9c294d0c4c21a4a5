"""The userspace backend, for kernels without netem: rate through a tbf qdisc on each
node's egress; delay, jitter and loss by a delay engine per node behind an NFQUEUE rule
in the switch namespace. It cannot emulate the netem-only keys and refuses them."""

from __future__ import annotations

from typing import Any, Sequence

from netbench.emulation import changes as ch
from netbench.emulation.backends.base import Backend
from netbench.emulation.held import Held
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


def plan(profile: Profile, topology: Topology, nodes: Sequence[Node], seed: int = 0,
         held: Held | None = None) -> list[ch.Change]:
    """Each node's engine gets its own seed (seed + node position) so losses are independent.
    Without `held`: clears and re-creates. With it: changes in place (see plan_in_place)."""
    refuse(profile)
    if held is not None:
        return plan_in_place(profile, topology, nodes, seed, held)
    changes: list[ch.Change] = [ch.ClearIngress(node.name, node.netns, node.ifname, ch.ifb_name(node.ifname))
                                for node in nodes]
    for node in nodes:
        position = topology.nodes.index(node)
        changes += plan_node(profile, node, position, topology.switch_netns, seed + position)
    return changes


def plan_in_place(profile: Profile, topology: Topology, nodes: Sequence[Node], seed: int,
                  held: Held) -> list[ch.Change]:
    """Change what is held and wanted in place, remove what is held and not wanted, create what
    is wanted and not held; nothing is cleared first, so a live link is never unshaped: the tbf
    is `replace`d (the kernel changes a tbf in place, its queue kept), a running engine gets
    its new parameters through its control channel and its NFQUEUE rule stays. Engines start
    before any rule names their queue; a rule goes before its engine stops."""
    switch = topology.switch_netns
    first: list[ch.Change] = []
    engines: list[ch.Change] = []
    rules: list[ch.Change] = []
    stops: list[ch.Change] = []
    for node in nodes:
        position = topology.nodes.index(node)
        queue = ch.queue_num(position)
        ifb = ch.ifb_name(node.ifname)
        if (node.netns, node.ifname) in held.ingress:
            first.append(ch.ClearIngress(node.name, node.netns, node.ifname, ifb))
        if profile.rate_bps:
            first.append(ch.SetTbf(node.name, node.netns, node.ifname, profile.rate_bps,
                                   ch.tbf_burst_bytes(profile.rate_bps), ch.tbf_limit_bytes(profile.rate_bps)))
        elif (node.netns, node.ifname) in held.roots:
            first.append(ch.ClearQdisc(node.name, node.netns, node.ifname))
        running = (switch, queue) in held.engines
        has_rule = held.has_rule(switch, node.port)
        if profile.delay_us or profile.jitter_us or profile.loss:
            kind = ch.ReconfigureEngine if running else ch.StartEngine
            engines.append(kind(node.name, switch, queue, profile.delay_us, profile.jitter_us, profile.loss,
                                seed + position))
            if not has_rule:
                rules.append(ch.AddNfqueueRule(node.name, switch, node.port, queue))
        else:
            if has_rule:
                rules.append(ch.DeleteNfqueueRule(node.name, switch, node.port, queue))
            if running:
                stops.append(ch.StopEngine(node.name, switch, queue))
    return first + engines + rules + stops


def holds(egress: Any, ingress: Any, rules: list[str]) -> bool:
    return bool(rules) or bool(egress and egress.get("kind") == "tbf")


BACKEND = Backend(
    name="userspace", plan=plan, refuse=refuse, holds=holds, probe=None, needs=NEEDS, on_hosts="rateonly",
    fallback_note="using NFQUEUE + delay engines")
