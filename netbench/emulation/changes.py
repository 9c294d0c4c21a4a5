"""Profile -> the exact changes for each node (pure; printed by --dry-run): the change types and
the building blocks the backends (emulation/backends/) plan with.

Two backends produce different plans for the same profile (backends/netem.py, backends/userspace.py):
- netem: a netem qdisc at the root of each node's egress interface (every netem control,
  and a queue limit sized to the bandwidth-delay product unless the profile sets one).
  An htb parent carries the rate when it exceeds netem's 32-bit field, and classifies
  traffic when only some peers are shaped (one htb class + netem per peer; the rest
  leaves unshaped). A per-pair topology (model/pairs.py) gives each destination its own htb
  class + netem (ShapePairs), classified by u32 filters in a hash table on the destination's
  last byte, so 63 destinations cost one lookup, not a chain of 63 matches. Ingress shaping redirects what arrives to an ifb device and shapes its
  egress the same way. A live profile change is a netem `change`: the queue is kept.
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

import ipaddress

from netbench import units
from netbench.emulation.delay_queue import DestParams
from netbench.emulation.netlink.netem import NETEM_RATE32_MAX_BPS, NetemParams
from netbench.errors import UsageError
from netbench.model.profile import MAX_LIMIT_PACKETS, MAX_RATE_BPS, Profile
from netbench.model.topology import Node, Topology

QDISC_HANDLE = "4e42:"  # "NB": a handle netbench owns; it never deletes a root it does not own
HANDLE_MAJOR = 0x4E42
CHILD_MAJOR = 0x4E43  # netem children under the htb parent: 4e43:, 4e44:, ...
PAIRS_HTID = 0x4E4  # the u32 hash table (12-bit id) of a per-destination tree: "4e4:"
PAIRS_BUCKETS = 256  # keyed on the last byte of the IPv4 destination
U32_ROOT_HTID = 0x800  # the u32 root table every filter chain starts from
# one htb class + netem (handle CHILD_MAJOR + i) per destination: the netem majors stay below
# 0xFFFF (the ingress handle) with room to spare, and a bucket holds far fewer than u32's 4095
MAX_PAIR_CLASSES = 1024
IFB_PREFIX = "nbifb-"
HTB_UNLIMITED_BPS = MAX_RATE_BPS  # an htb class needs a rate; "unlimited" is the largest profile rate
HTB_QUANTUM_MAX = 200_000  # the kernel warns above this
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
class ShapeDevice(Change):
    """The netbench tree on `dev`: one netem at the root, or an htb root with one class and
    netem per peer (or one class for all traffic) when a rate needs 64 bits or peers are named.

    `peers` are CIDRs matched on the destination (egress) or source (ingress, `match="src"`).
    """

    dev: str
    netem: NetemParams
    htb_rate_bps: int | None = None
    peers: tuple[str, ...] = ()
    match: str = "dst"

    @property
    def uses_htb(self) -> bool:
        return self.htb_rate_bps is not None or bool(self.peers)

    def class_count(self) -> int:
        return max(1, len(self.peers))

    def describe(self) -> str:
        netem_text = describe_netem(self.netem)
        where = f"{self.node}: tc"
        if not self.uses_htb:
            return f"{where} qdisc replace dev {self.dev} root handle {QDISC_HANDLE} {netem_text}"
        rate = units.format_rate_bps(self.htb_rate_bps or HTB_UNLIMITED_BPS)
        lines = [f"{where} qdisc replace dev {self.dev} root handle {QDISC_HANDLE} htb default "
                 f"{0 if self.peers else 1:x}"]
        for i in range(self.class_count()):
            classid = f"{HANDLE_MAJOR:x}:{i + 1:x}"
            lines.append(f"{where} class replace dev {self.dev} parent {QDISC_HANDLE} classid {classid} htb rate {rate} "
                         f"ceil {rate} burst {htb_burst_bytes(self.htb_rate_bps or HTB_UNLIMITED_BPS)}b")
            lines.append(f"{where} qdisc replace dev {self.dev} parent {classid} handle {CHILD_MAJOR + i:x}: {netem_text}")
            if self.peers:
                lines.append(f"{where} filter replace dev {self.dev} parent {QDISC_HANDLE} protocol ip prio 1 u32 "
                             f"match ip {self.match} {self.peers[i]} flowid {classid}")
        return "\n".join(lines)


@dataclass(frozen=True)
class PairClass:
    """One destination of a per-destination tree: `peer` its address as a /32 CIDR, the netem
    leaf of its class, and the class's htb rate (None: unlimited)."""

    peer: str
    netem: NetemParams
    rate_bps: int | None = None


@dataclass(frozen=True)
class ShapePairs(Change):
    """Per-destination shaping of `dev`'s egress: an htb root (default 0: traffic to no listed
    destination leaves unshaped), class 4e42:<i+1> with a netem leaf <CHILD_MAJOR + i>: per
    entry of `classes`, and u32 filters on the destination address in a 256-bucket hash table
    keyed on its last byte (one lookup per packet, however many destinations)."""

    dev: str
    classes: tuple[PairClass, ...]

    def describe(self) -> str:
        where = f"{self.node}: tc"
        table = f"{PAIRS_HTID:x}:"
        lines = [f"{where} qdisc replace dev {self.dev} root handle {QDISC_HANDLE} htb default 0",
                 f"{where} filter add dev {self.dev} parent {QDISC_HANDLE} protocol ip prio 1 handle {table} "
                 f"u32 divisor {PAIRS_BUCKETS} (if missing)"]
        for i, pair in enumerate(self.classes):
            classid = f"{HANDLE_MAJOR:x}:{i + 1:x}"
            rate_bps = pair.rate_bps or HTB_UNLIMITED_BPS
            rate = units.format_rate_bps(rate_bps)
            lines.append(f"{where} class replace dev {self.dev} parent {QDISC_HANDLE} classid {classid} htb rate "
                         f"{rate} ceil {rate} burst {htb_burst_bytes(rate_bps)}b")
            lines.append(f"{where} qdisc replace dev {self.dev} parent {classid} handle {CHILD_MAJOR + i:x}: "
                         f"{describe_netem(pair.netem)}")
            lines.append(f"{where} filter replace dev {self.dev} parent {QDISC_HANDLE} protocol ip prio 1 u32 ht "
                         f"{table}{pair_bucket(pair.peer):x}: match ip dst {pair.peer} flowid {classid}")
        lines.append(f"{where} filter replace dev {self.dev} parent {QDISC_HANDLE} protocol ip prio 1 u32 ht "
                     f"{U32_ROOT_HTID:x}:: match u32 0 0 hashkey mask 0x000000ff at 16 link {table}")
        return "\n".join(lines)


def pair_bucket(peer: str) -> int:
    """The hash bucket of a /32 destination: its address's last byte."""
    return int(ipaddress.IPv4Network(peer, strict=False).network_address) & (PAIRS_BUCKETS - 1)


def pair_class(profile: Profile, peer: str) -> PairClass:
    """The class for the one-way path to `peer`: the rate goes to the htb class, the netem
    leaf's queue limit is sized from this pair's own rate and delay (netem_limit_packets)."""
    return PairClass(peer, netem_params(profile, with_rate=False), profile.rate_bps)


@dataclass(frozen=True)
class SetIngress(Change):
    """Redirect what arrives on `dev` to the ifb device `ifb` (created if missing), whose
    egress a ShapeDevice then shapes."""

    dev: str
    ifb: str

    def describe(self) -> str:
        return (f"{self.node}: ip link add {self.ifb} type ifb; ip link set {self.ifb} up; "
                f"tc qdisc replace dev {self.dev} ingress; tc filter replace dev {self.dev} parent ffff: "
                f"protocol all u32 match u32 0 0 action mirred egress redirect dev {self.ifb}")


@dataclass(frozen=True)
class ClearIngress(Change):
    dev: str
    ifb: str

    def describe(self) -> str:
        return (f"{self.node}: tc qdisc del dev {self.dev} ingress; ip link del {self.ifb} "
                "(if netbench made them)")


def describe_netem(n: NetemParams) -> str:
    """netem's options in tc's words (for --dry-run; netbench sends them over netlink)."""
    text = f"netem limit {n.limit} delay {units.format_duration_us(n.delay_us)}"
    if n.jitter_us:
        text += f" {units.format_duration_us(n.jitter_us)}"
        if n.delay_corr:
            text += f" {units.format_ratio(n.delay_corr)}"
        text += f" distribution {n.distribution}"
    if n.ge is not None:
        p, r, bad, good = (units.format_ratio(x) for x in n.ge)
        text += f" loss gemodel {p} {r} {bad} {good}"
    elif n.loss:
        text += f" loss random {units.format_ratio(n.loss)}"
        if n.loss_corr:
            text += f" {units.format_ratio(n.loss_corr)}"
    for name, value, corr in (("duplicate", n.duplicate, n.duplicate_corr), ("corrupt", n.corrupt, n.corrupt_corr),
                              ("reorder", n.reorder, n.reorder_corr)):
        if value:
            text += f" {name} {units.format_ratio(value)}" + (f" {units.format_ratio(corr)}" if corr else "")
    if n.reorder:
        text += f" gap {n.gap or 1}"
    if n.rate_bps:
        text += f" rate {units.format_rate_bps(n.rate_bps)}"
    return text


@dataclass(frozen=True)
class StartEngine(Change):
    """A delay engine holding queue `queue_num`: delay/jitter in us, loss ratio.

    `pairs`: a per-destination table (delay_queue.DestParams: dst address, delay, jitter, loss,
    rate); delay/jitter/loss are then the default of destinations not in it (all zero: they
    pass unshaped)."""

    queue_num: int
    delay_us: int
    jitter_us: int
    loss: float
    seed: int
    pairs: tuple[DestParams, ...] = ()

    def describe(self) -> str:
        return (f"{self.node}: in {self.netns}: start delay engine on NFQUEUE {self.queue_num}: "
                f"{self._settings()}")

    def _settings(self) -> str:
        one = (f"delay {units.format_duration_us(self.delay_us)} jitter {units.format_duration_us(self.jitter_us)} "
               f"loss {units.format_ratio(self.loss)}")
        if not self.pairs:
            return f"{one} seed {self.seed}"
        rows = [f"per destination, seed {self.seed}; other destinations: "
                f"{one if self.delay_us or self.jitter_us or self.loss else 'unshaped'}"]
        for pair in self.pairs:
            rate = units.format_rate_bps(pair.rate_bps) if pair.rate_bps else "unlimited"
            rows.append(f"  to {pair.dst}: delay {units.format_duration_us(pair.delay_us)} jitter "
                        f"{units.format_duration_us(pair.jitter_us)} loss {units.format_ratio(pair.loss)} rate {rate}")
        return "\n".join(rows)


@dataclass(frozen=True)
class ReconfigureEngine(StartEngine):
    """Give the running engine on `queue_num` new parameters through its control channel: no
    restart, held packets keep their release time (one is started if none runs)."""

    def describe(self) -> str:
        return (f"{self.node}: in {self.netns}: reconfigure delay engine on NFQUEUE {self.queue_num} in place: "
                f"{self._settings()}")


@dataclass(frozen=True)
class AddNfqueueRule(Change):
    """Queue what node `node` sends (it enters the bridge by `port`) to `queue_num`."""

    port: str
    queue_num: int

    def iptables_args(self) -> list[str]:
        return ["-m", "physdev", "--physdev-in", self.port, "-j", "NFQUEUE", "--queue-num", str(self.queue_num)]

    def describe(self) -> str:
        return f"{self.node}: in {self.netns}: iptables -t mangle -A {IPT_CHAIN} {' '.join(self.iptables_args())}"


@dataclass(frozen=True)
class DeleteNfqueueRule(AddNfqueueRule):
    """Stop queueing what `node` sends (before its engine stops: a queue nobody binds drops)."""

    def describe(self) -> str:
        return f"{self.node}: in {self.netns}: iptables -t mangle -D {IPT_CHAIN} {' '.join(self.iptables_args())}"


def tbf_burst_bytes(rate_bps: int) -> int:
    """1 ms of the rate, at least four full frames (tbf segments larger GSO packets)."""
    return max(rate_bps // 8 // 1000, 4 * MTU_FRAME_BYTES)


def tbf_limit_bytes(rate_bps: int) -> int:
    return int(rate_bps / 8 * TBF_QUEUE_S) + tbf_burst_bytes(rate_bps)


NETEM_RATE_QUEUE_MIN_PACKETS = 100  # a rate's queue holds at least this many (small packets: ACKs)


def netem_limit_packets(delay_us: int, jitter_us: int, rate_bps: int | None) -> int:
    """netem's queue limit in full-size packets (never above the largest a profile may set).

    netem's limit counts every packet it holds: those in the delay line and those waiting for
    the rate. With no rate: at least 1.5x the bandwidth-delay product at 10 Gbit/s (the fastest
    a veth sustains here) and never below netem's default 1000 (which caps a 100 ms link near
    120 Mbit/s). With a rate: 1.5x the delay line at that rate plus the queue the userspace
    backend's tbf gets (TBF_QUEUE_S of the rate, its burst; at least
    NETEM_RATE_QUEUE_MIN_PACKETS), so both backends queue a loaded link alike. A floor of 1000
    there made a slow link's queue deep: 600 ms at 20 Mbit/s, 120 ms at 100 Mbit/s, where
    the engine's tbf holds 50 ms.
    """
    line = math.ceil(1.5 * (rate_bps or 10_000_000_000) / 8 * (delay_us + jitter_us) / 1e6 / MTU_FRAME_BYTES)
    if not rate_bps:
        return min(MAX_LIMIT_PACKETS, max(1000, line))
    queue = max(NETEM_RATE_QUEUE_MIN_PACKETS, math.ceil(tbf_limit_bytes(rate_bps) / MTU_FRAME_BYTES))
    return min(MAX_LIMIT_PACKETS, line + queue)


def htb_burst_bytes(rate_bps: int) -> int:
    """Burst from the rate (1 ms of it, at least four frames), not a fixed 15 KB: at
    10 Gbit/s and above a small burst caps the class below its rate."""
    return tbf_burst_bytes(rate_bps)


def htb_quantum(rate_bps: int) -> int:
    return max(MTU_FRAME_BYTES, min(HTB_QUANTUM_MAX, rate_bps // 8 // 10))


def ifb_name(ifname: str) -> str:
    return (IFB_PREFIX + ifname)[:15]


def netem_params(profile: Profile, with_rate: bool) -> NetemParams:
    """The netem qdisc for `profile`; the rate goes to an htb parent when `with_rate` is False."""
    limit = profile.limit_packets or netem_limit_packets(profile.delay_us, profile.jitter_us, profile.rate_bps)
    ge = ((profile.ge_p, profile.ge_r, profile.ge_bad_loss, profile.ge_good_loss) if profile.uses_ge else None)
    return NetemParams(limit=limit, delay_us=profile.delay_us, jitter_us=profile.jitter_us,
                       delay_corr=profile.jitter_correlation, distribution=profile.distribution,
                       loss=0.0 if profile.uses_ge else profile.loss, loss_corr=profile.loss_correlation, ge=ge,
                       duplicate=profile.duplicate, duplicate_corr=profile.duplicate_correlation,
                       corrupt=profile.corrupt, corrupt_corr=profile.corrupt_correlation,
                       reorder=profile.reorder, reorder_corr=profile.reorder_correlation,
                       gap=profile.reorder_gap, rate_bps=profile.rate_bps if with_rate else None)


def resolve_peers(profile: Profile, topology: Topology, node: Node) -> tuple[str, ...]:
    """Peers as CIDRs: node names become their testbed address /32; a node is not its own peer."""
    by_name = {n.name: n for n in topology.nodes}
    out: list[str] = []
    for peer in profile.peers:
        if peer in by_name:
            if peer != node.name:
                out.append(f"{by_name[peer].address}/32")
            continue
        if peer.startswith("n") and peer[1:].isdigit():
            raise UsageError(f"peers: no node {peer} in the testbed ({', '.join(by_name)})",
                             hint="name a node that is up ('netbench testbed show') or give a CIDR")
        out.append(str(ipaddress.IPv4Network(peer, strict=False)))
    return tuple(dict.fromkeys(out))


def shape_device(profile: Profile, node: Node, dev: str, peers: tuple[str, ...], match: str) -> ShapeDevice:
    if profile.duplicate and len(peers) > 1:
        # Linux refuses a duplicating netem beside any other netem on a device (since 6.16,
        # and in stable kernels from mid-2025): one netem per peer would be half applied
        raise UsageError(f"{node.name}: duplicate with {len(peers)} peers needs one netem per peer on "
                             f"{dev}, and the kernel refuses a duplicating netem beside other netems",
                             hint="shape one peer (or one CIDR that covers them) when using duplicate")
    rate = profile.rate_bps
    use_htb = bool(peers) or (rate is not None and rate > NETEM_RATE32_MAX_BPS)
    return ShapeDevice(node.name, node.netns, dev, netem_params(profile, with_rate=not use_htb),
                       htb_rate_bps=rate if use_htb else None, peers=peers, match=match)


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
        changes.append(ClearIngress(node.name, node.netns, node.ifname, ifb_name(node.ifname)))
    return changes
