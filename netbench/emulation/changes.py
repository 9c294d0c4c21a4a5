"""Profile -> the exact list of changes for each node (pure; printed by --dry-run).

Two backends produce different plans for the same profile:
- netem: one netem qdisc at the root of each node's egress interface (delay, jitter,
  loss, rate, and a queue limit sized to the bandwidth-delay product).
- userspace: rate through a tbf qdisc on each node's egress; delay, jitter and loss
  through iptables NFQUEUE rules in the switch namespace (one queue per node port,
  matched with physdev on the port the node's traffic enters the bridge by) and a
  netbench delay engine process per node. Queueing in the switch, not in the sender's
  own stack, matters: a packet held in the sender's POSTROUTING still counts against
  its TCP socket (TCP small queues), which collapses TCP to a few Mbit/s under delay;
  a forwarded packet has left its socket, as it has with netem.
Every plan first removes what netbench set before, so applying is idempotent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from netbench import units
from netbench.profile import Profile
from netbench.testbed.topology import Node, Topology

QDISC_HANDLE = "4e42:"  # "NB": a handle netbench owns; it never deletes a root it does not own
IPT_CHAIN = "NETBENCH"
MTU_FRAME_BYTES = 1514
TBF_QUEUE_S = 0.05  # tbf backlog in seconds of the rate: enough for TCP, not bufferbloat


@dataclass(frozen=True)
class Change:
    node: str
    netns: str

    def describe(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError


@dataclass(frozen=True)
class StopEngine(Change):
    """Stop the engine serving `queue_num` in namespace `netns` (the switch)."""

    queue_num: int

    def describe(self) -> str:
        return f"{self.node}: stop delay engine on NFQUEUE {self.queue_num} in {self.netns} (if running)"


@dataclass(frozen=True)
class ClearRules(Change):
    def describe(self) -> str:
        return f"{self.netns}: iptables -t mangle -F {IPT_CHAIN}; remove jump from FORWARD (if present)"


@dataclass(frozen=True)
class ClearQdisc(Change):
    ifname: str

    def describe(self) -> str:
        return f"{self.node}: tc qdisc del dev {self.ifname} root handle {QDISC_HANDLE} (if netbench-owned)"


@dataclass(frozen=True)
class SetTbf(Change):
    """tbf at the root: rate_bps bits/s, burst_bytes and limit_bytes bytes."""

    ifname: str
    rate_bps: int
    burst_bytes: int
    limit_bytes: int

    def describe(self) -> str:
        return (f"{self.node}: tc qdisc replace dev {self.ifname} root handle {QDISC_HANDLE} tbf "
                f"rate {units.format_rate_bps(self.rate_bps)} burst {self.burst_bytes}b "
                f"limit {self.limit_bytes}b")


@dataclass(frozen=True)
class SetNetem(Change):
    """netem at the root: delay/jitter in us, loss ratio, rate bits/s or None, limit packets."""

    ifname: str
    delay_us: int
    jitter_us: int
    loss: float
    rate_bps: int | None
    limit_packets: int

    def describe(self) -> str:
        text = (f"{self.node}: tc qdisc replace dev {self.ifname} root handle {QDISC_HANDLE} netem "
                f"limit {self.limit_packets} delay {units.format_duration_us(self.delay_us)}")
        if self.jitter_us:
            text += f" {units.format_duration_us(self.jitter_us)}"
        if self.loss:
            text += f" loss {units.format_ratio(self.loss)}"
        if self.rate_bps:
            text += f" rate {units.format_rate_bps(self.rate_bps)}"
        return text


@dataclass(frozen=True)
class StartEngine(Change):
    """A delay engine holding queue `queue_num`: delay/jitter in us, loss ratio."""

    queue_num: int
    delay_us: int
    jitter_us: int
    loss: float
    seed: int

    def describe(self) -> str:
        return (f"{self.node}: in {self.netns}: start delay engine on NFQUEUE {self.queue_num}: delay "
                f"{units.format_duration_us(self.delay_us)} jitter {units.format_duration_us(self.jitter_us)} "
                f"loss {units.format_ratio(self.loss)} seed {self.seed}")


@dataclass(frozen=True)
class AddNfqueueRule(Change):
    """Queue what node `node` sends (it enters the bridge by `port`) to `queue_num`."""

    port: str
    queue_num: int

    def iptables_args(self) -> list[str]:
        return ["-m", "physdev", "--physdev-in", self.port, "-j", "NFQUEUE", "--queue-num", str(self.queue_num)]

    def describe(self) -> str:
        return f"{self.node}: in {self.netns}: iptables -t mangle -A {IPT_CHAIN} {' '.join(self.iptables_args())}"


def tbf_burst_bytes(rate_bps: int) -> int:
    """1 ms of the rate, at least four full frames (tbf segments larger GSO packets)."""
    return max(rate_bps // 8 // 1000, 4 * MTU_FRAME_BYTES)


def tbf_limit_bytes(rate_bps: int) -> int:
    return int(rate_bps / 8 * TBF_QUEUE_S) + tbf_burst_bytes(rate_bps)


def netem_limit_packets(delay_us: int, jitter_us: int, rate_bps: int | None) -> int:
    """At least 1.5x the bandwidth-delay product in full-size packets, and never below 1000.

    netem's default of 1000 packets caps a 100 ms link near 120 Mbit/s; with no rate we
    size for 10 Gbit/s, the fastest a veth sustains here.
    """
    rate = rate_bps or 10_000_000_000
    bdp_packets = rate / 8 * (delay_us + jitter_us) / 1e6 / MTU_FRAME_BYTES
    return max(1000, math.ceil(1.5 * bdp_packets))


def queue_num(position: int) -> int:
    """The NFQUEUE number serving the node at `position` (0-based) in the topology."""
    return position + 1


def plan_clear(topology: Topology) -> list[Change]:
    """Remove whatever netbench set, for either backend (harmless where nothing is set):
    a userspace profile applied earlier must not stack on a netem one, or the reverse.
    """
    switch = topology.switch_netns
    changes: list[Change] = [ClearRules("switch", switch)]
    for position, node in enumerate(topology.nodes):
        changes.append(StopEngine(node.name, switch, queue_num(position)))
    for node in topology.nodes:
        changes.append(ClearQdisc(node.name, node.netns, node.ifname))
    return changes


def _plan_node(profile: Profile, node: Node, position: int, switch: str, backend: str, seed: int) -> list[Change]:
    if backend == "netem":
        if profile.is_null:
            return []
        return [SetNetem(node.name, node.netns, node.ifname, profile.delay_us, profile.jitter_us,
                         profile.loss, profile.rate_bps,
                         netem_limit_packets(profile.delay_us, profile.jitter_us, profile.rate_bps))]
    changes: list[Change] = []
    if profile.rate_bps:
        changes.append(SetTbf(node.name, node.netns, node.ifname, profile.rate_bps,
                              tbf_burst_bytes(profile.rate_bps), tbf_limit_bytes(profile.rate_bps)))
    if profile.delay_us or profile.jitter_us or profile.loss:
        # the engine binds its queue before the rule exists: without --queue-bypass, packets
        # queued to an unbound queue would be dropped
        queue = queue_num(position)
        changes.append(StartEngine(node.name, switch, queue, profile.delay_us,
                                   profile.jitter_us, profile.loss, seed))
        changes.append(AddNfqueueRule(node.name, switch, node.port, queue))
    return changes


def plan_apply(profile: Profile, topology: Topology, backend: str, seed: int = 0) -> list[Change]:
    """Everything to turn every node's egress into `profile`, after clearing the old state.

    Each node gets its own engine seed (seed + node position) so losses are independent.
    """
    if backend not in ("netem", "userspace"):
        raise ValueError(f"unknown backend {backend!r}")
    changes = plan_clear(topology)
    for position, node in enumerate(topology.nodes):
        changes += _plan_node(profile, node, position, topology.switch_netns, backend, seed + position)
    return changes
