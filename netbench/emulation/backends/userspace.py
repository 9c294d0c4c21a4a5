"""The userspace backend, for kernels without netem: rate through a tbf qdisc on each
node's egress; delay, jitter and loss by a delay engine per node behind an NFQUEUE rule
in the switch namespace. It cannot emulate the netem-only keys and refuses them.

Per pair (a PairTopology, `plan_pairs`): each node's engine gets a per-destination table
(its destinations' addresses, each with delay, jitter, loss and rate; the engine keeps one
queue per destination and paces each at its rate), destinations not in it pass unshaped,
and no tbf is used: the rate is each pair's, in the engine."""

from __future__ import annotations

from typing import Any, Sequence

from netbench.emulation import changes as ch
from netbench.emulation.backends.base import Backend
from netbench.emulation.delay_queue import DestParams
from netbench.emulation.held import Held
from netbench.errors import BackendUnavailable, UsageError
from netbench.model.pairs import PairTopology
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
    engine = bool(profile.delay_us or profile.jitter_us or profile.loss)
    return _in_place(topology, nodes, seed, held, lambda node: (
        profile.rate_bps, (profile.delay_us, profile.jitter_us, profile.loss, ()) if engine else None))


def _in_place(topology: Topology, nodes: Sequence[Node], seed: int, held: Held, wanted) -> list[ch.Change]:
    """plan_in_place for what `wanted(node)` says each node needs: (tbf rate or None, the
    engine's (delay_us, jitter_us, loss, pairs) or None)."""
    switch = topology.switch_netns
    first: list[ch.Change] = []
    engines: list[ch.Change] = []
    rules: list[ch.Change] = []
    stops: list[ch.Change] = []
    for node in nodes:
        position = topology.nodes.index(node)
        queue = ch.queue_num(position)
        ifb = ch.ifb_name(node.ifname)
        rate_bps, engine = wanted(node)
        if (node.netns, node.ifname) in held.ingress:
            first.append(ch.ClearIngress(node.name, node.netns, node.ifname, ifb))
        if rate_bps:
            first.append(ch.SetTbf(node.name, node.netns, node.ifname, rate_bps,
                                   ch.tbf_burst_bytes(rate_bps), ch.tbf_limit_bytes(rate_bps)))
        elif (node.netns, node.ifname) in held.roots:
            first.append(ch.ClearQdisc(node.name, node.netns, node.ifname))
        running = (switch, queue) in held.engines
        has_rule = held.has_rule(switch, node.port)
        if engine is not None:
            delay_us, jitter_us, loss, pairs = engine
            kind = ch.ReconfigureEngine if running else ch.StartEngine
            engines.append(kind(node.name, switch, queue, delay_us, jitter_us, loss, seed + position, pairs))
            if not has_rule:
                rules.append(ch.AddNfqueueRule(node.name, switch, node.port, queue))
        else:
            if has_rule:
                rules.append(ch.DeleteNfqueueRule(node.name, switch, node.port, queue))
            if running:
                stops.append(ch.StopEngine(node.name, switch, queue))
    return first + engines + rules + stops


def refuse_pairs(pairs: PairTopology, topology: Topology) -> None:
    """Refuse, before anything is planned, a link this backend cannot emulate (a netem-only
    key: BackendUnavailable) or one between nodes the testbed does not have (UsageError),
    naming the pair."""
    names = [node.name for node in topology.nodes]
    for link in pairs.links:
        where = f"topology {pairs.name}" + (f" ({pairs.source})" if pairs.source else "")
        for end in (link.src, link.dst):
            if end not in names:
                raise UsageError(f"{where}: link {link.src} -> {link.dst}: no node {end} in the testbed "
                                 f"({', '.join(names)})", hint="map the topology's nodes to nodes that are up "
                                 "('netbench testbed show')")
        unsupported = link.profile.netem_only_fields()
        if unsupported:
            raise BackendUnavailable(f"{where}: link {link.src} -> {link.dst}: the userspace backend cannot emulate "
                                     f"{', '.join(unsupported)}", hint="these need a kernel with netem ('netbench "
                                     "doctor' says what this host has); remove them to use the userspace backend")


def pair_table(pairs: PairTopology, topology: Topology, node: Node) -> tuple[DestParams, ...]:
    """`node`'s engine table: one entry per destination `pairs` shapes from it, addressed by
    the destination node's testbed address, in destination order."""
    by_name = {n.name: n for n in topology.nodes}
    table = []
    for link in pairs.from_node(node.name):
        p = link.profile
        if link.dst == node.name or not (p.delay_us or p.jitter_us or p.loss or p.rate_bps):
            continue
        table.append(DestParams(by_name[link.dst].address, p.delay_us, p.jitter_us, p.loss, p.rate_bps))
    return tuple(table)


def plan_pairs(pairs: PairTopology, topology: Topology, nodes: Sequence[Node], seed: int = 0,
               held: Held | None = None) -> list[ch.Change]:
    """Shape each of `nodes`' egress per destination as `pairs` says: its engine gets its table
    (pair_table; other destinations pass unshaped), no tbf. A node with no shaped destination
    gets no engine and no rule. Without `held`: clears and re-creates; with it: in place as
    plan_in_place (a running engine gets its new table through its control channel, held
    packets keep their release time). Each node's engine gets seed + its position."""
    refuse_pairs(pairs, topology)
    tables = {node.name: pair_table(pairs, topology, node) for node in nodes}

    def wanted(node: Node) -> tuple[None, tuple | None]:
        table = tables[node.name]
        return None, ((0, 0, 0.0, table) if table else None)

    if held is not None:
        return _in_place(topology, nodes, seed, held, wanted)
    switch = topology.switch_netns
    changes: list[ch.Change] = [ch.ClearIngress(node.name, node.netns, node.ifname, ch.ifb_name(node.ifname))
                                for node in nodes]
    for node in nodes:
        position = topology.nodes.index(node)
        changes.append(ch.ClearQdisc(node.name, node.netns, node.ifname))
        if tables[node.name]:
            queue = ch.queue_num(position)
            changes.append(ch.StartEngine(node.name, switch, queue, 0, 0, 0.0, seed + position, tables[node.name]))
            changes.append(ch.AddNfqueueRule(node.name, switch, node.port, queue))
    return changes


def holds(egress: Any, ingress: Any, rules: list[str]) -> bool:
    return bool(rules) or bool(egress and egress.get("kind") == "tbf")


BACKEND = Backend(
    name="userspace", plan=plan, refuse=refuse, holds=holds, probe=None, needs=NEEDS, on_hosts="rateonly",
    fallback_note="using NFQUEUE + delay engines", plan_pairs=plan_pairs)
