"""Interface, qdisc and delay-engine counters of the testbed's nodes, read at scrape time.

The controller lives in the host's namespace and reads each node's namespace over netlink
(pyroute2), and the delay engines' stats files from the state dir, so a scrape never crosses
a shaped link. A short cache bounds the cost when scrapes come close together.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from netbench.emulation import changes as ch
from netbench.metrics.catalogue import ENGINE_LATE_OVER
from netbench.model.topology import Topology

ROOT_PARENT = 0xFFFFFFFF
NETBENCH_HANDLE = ch.HANDLE_MAJOR << 16
CACHE_S = 0.5


@dataclass(frozen=True)
class InterfaceStats:
    node: str
    interface: str
    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int
    rx_dropped: int
    tx_dropped: int


@dataclass(frozen=True)
class QdiscStats:
    node: str
    interface: str
    drops: int
    overlimits: int
    backlog_bytes: int
    backlog_packets: int
    sent_packets: int = 0


@dataclass(frozen=True)
class EngineStats:
    """A node's delay engine (userspace backend) and the kernel NFQUEUE that feeds it.

    `drops` has one count per reason of catalogue.ENGINE_DROP_REASONS that is known: `loss`
    (the engine's loss verdicts) always, `queue_full` and `socket_full` (the kernel's queue
    at its maxlen, the engine's netlink socket buffer full) only while the engine could read
    the kernel's row. `kernel_queue` (packets waiting in the kernel for the engine) is None then.
    """

    node: str
    up: bool
    queue_depth: int
    received: int
    released: int
    drops: tuple[tuple[str, int], ...] = ()
    kernel_queue: int | None = None
    late: tuple[tuple[str, int], ...] = ()  # (over, releases more than that late): ENGINE_LATE_OVER
    lateness_s: float = 0.0  # the sum of every release's lateness


@dataclass(frozen=True)
class PairStats:
    """One ordered pair a node shapes per destination: what is configured (one-way delay,
    rate in bytes/s, 0: unlimited) and what its shaper passed and dropped.

    `mechanism`: "netem" (the pair's netem leaf under the node's htb root: its sent packets,
    its drops for loss and its queue limit) or "engine" (the node's delay engine's queue for
    that destination: released packets, drops for loss and for its queue limit).
    """

    src: str
    dst: str
    mechanism: str
    delay_s: float
    rate_bytes_per_s: float
    packets: int
    drops: int


@dataclass(frozen=True)
class NetworkSample:
    interfaces: tuple[InterfaceStats, ...] = ()
    qdiscs: tuple[QdiscStats, ...] = ()
    engines: tuple[EngineStats, ...] = ()
    read_errors: int = 0  # cumulative
    pairs: tuple[PairStats, ...] = ()


def read_node_links(netns: str) -> list[dict[str, Any]]:
    """[{interface, stats: IFLA_STATS64 dict, qdisc: root netbench qdisc stats or None, pairs:
    the per-destination tree's rows (qdisc_read.decode_tree's "pairs") or None}] of one node."""
    from contextlib import closing

    from netbench.emulation.netlink import rtnl

    rows = []
    # a socket made in-process (pyroute2's NetNS forks a child per socket, ~7 ms: per node,
    # per scrape); it never creates a namespace, so a scrape cannot re-create a removed node
    with closing(rtnl.iproute_in(netns)) as ns:
        for link in ns.get_links():
            name = link.get_attr("IFLA_IFNAME")
            if name == "lo":
                continue
            stats = dict(link.get_attr("IFLA_STATS64") or link.get_attr("IFLA_STATS") or {})
            qdiscs = list(ns.get_qdiscs(index=link["index"]))
            root = next((msg for msg in qdiscs
                         if msg["parent"] == ROOT_PARENT and msg["handle"] == NETBENCH_HANDLE), None)
            rows.append({"interface": name, "stats": stats,
                         "qdisc": _qdisc_counters(root) if root is not None else None,
                         "pairs": _pair_rows(ns, link["index"], root, qdiscs)})
    return rows


def _pair_rows(ns: Any, index: int, root: Any, qdiscs: list[Any]) -> list[dict[str, Any]] | None:
    """The destinations of a per-destination tree (htb root, u32 table 4e4:), else None."""
    if root is None or root.get_attr("TCA_KIND") != "htb":
        return None
    from netbench.emulation.netlink import pairtree
    from netbench.emulation.netlink.qdisc_read import decode_qdisc

    classes = list(ns.get_classes(index=index))
    filters = list(ns.get_filters(index=index, parent=NETBENCH_HANDLE))
    return pairtree.decode_pairs(qdiscs, classes, filters, decode_qdisc, ch.HTB_UNLIMITED_BPS)


def _qdisc_counters(msg: Any) -> dict[str, int]:
    stats2 = msg.get_attr("TCA_STATS2")
    queue = stats2.get_attr("TCA_STATS_QUEUE") if stats2 else None
    if not queue:
        return {}
    basic = stats2.get_attr("TCA_STATS_BASIC")
    return {"drops": queue["drops"], "overlimits": queue["overlimits"], "backlog": queue["backlog"],
            "qlen": queue["qlen"], "packets": basic["packets"] if basic else 0}


def read_engine(state_dir: Path, switch_netns: str, position: int) -> dict[str, Any] | None:
    """The node's delay engine stats, or None.

    The engine rewrites its file about once a second, with the kernel's NFQUEUE row as it reads
    it from its own namespace (the switch's): /proc/net/netfilter/nfnetlink_queue read from
    the controller would show the host namespace's queues, not the switch's.
    """
    from netbench.emulation.engines import Engines

    return Engines(state_dir).read(switch_netns, ch.queue_num(position))


def decode(node: str, links: list[dict[str, Any]], engine: dict[str, Any] | None
           ) -> tuple[list[InterfaceStats], list[QdiscStats], EngineStats | None]:
    """One node's raw readings -> typed stats (pure)."""
    interfaces, qdiscs = [], []
    for link in links:
        s = link["stats"]
        interfaces.append(InterfaceStats(node, link["interface"], s.get("rx_bytes", 0), s.get("tx_bytes", 0),
                                         s.get("rx_packets", 0), s.get("tx_packets", 0),
                                         s.get("rx_dropped", 0), s.get("tx_dropped", 0)))
        q = link.get("qdisc")
        if q:
            qdiscs.append(QdiscStats(node, link["interface"], q.get("drops", 0), q.get("overlimits", 0),
                                     q.get("backlog", 0), q.get("qlen", 0), q.get("packets", 0)))
    return interfaces, qdiscs, decode_engine(node, engine) if engine is not None else None


def decode_engine(node: str, engine: dict[str, Any]) -> EngineStats:
    """One delay engine's stats (engine.DelayEngine.stats(), plus `alive`) -> EngineStats (pure)."""
    alive = bool(engine.get("alive"))
    drops = [("loss", int(engine.get("dropped", 0)))]
    kernel = engine.get("kernel") if isinstance(engine.get("kernel"), dict) else None
    if kernel is not None:
        drops += [("queue_full", int(kernel.get("queue_dropped", 0))),
                  ("socket_full", int(kernel.get("user_dropped", 0)))]
    lateness = engine.get("lateness_us") if isinstance(engine.get("lateness_us"), dict) else {}
    late = tuple((over, int(lateness[f"over_{over}"])) for over in ENGINE_LATE_OVER if f"over_{over}" in lateness)
    return EngineStats(node, alive, int(engine.get("queue_depth", 0)) if alive else 0,
                       int(engine.get("received", 0)), int(engine.get("accepted", 0)), tuple(drops),
                       int(kernel.get("queue_total", 0)) if kernel is not None and alive else None,
                       late, float(lateness.get("count", 0)) * float(lateness.get("mean", 0.0)) / 1e6)


def decode_pairs(node: str, links: list[dict[str, Any]], engine: dict[str, Any] | None,
                 names: Mapping[str, str]) -> list[PairStats]:
    """One node's per-destination rows -> PairStats (pure); `names` maps a testbed address to
    its node's name (a destination outside the testbed keeps its address). A node that does
    not shape per destination has none."""
    out = []
    for link in links:
        for row in link.get("pairs") or ():
            params = row.get("netem")
            address = str(row["peer"]).split("/")[0]
            out.append(PairStats(node, names.get(address, address), "netem",
                                 (params.delay_us if params is not None else 0) / 1e6,
                                 (row.get("rate_bps") or 0) / 8, int(row.get("packets", 0)),
                                 int(row.get("drops", 0))))
    for row in (engine or {}).get("pairs") or ():
        address = str(row["dst"])
        out.append(PairStats(node, names.get(address, address), "engine", int(row.get("delay_us", 0)) / 1e6,
                             (row.get("rate_bps") or 0) / 8, int(row.get("accepted", 0)),
                             int(row.get("dropped", 0)) + int(row.get("overlimits", 0))))
    return out


@dataclass
class NetworkReader:
    """Reads every node of the testbed; `topology` is set once the sweep has one."""

    state_dir: Path
    read_links: Callable[[str], list[dict[str, Any]]] = read_node_links
    read_engine: Callable[[Path, str, int], dict[str, Any] | None] = read_engine
    cache_s: float = CACHE_S
    topology: Topology | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _last: NetworkSample = field(default_factory=NetworkSample)
    _last_at: float = float("-inf")
    _errors: int = 0

    def sample(self) -> NetworkSample:
        with self._lock:  # concurrent scrapes share one reading
            now = time.monotonic()
            if now - self._last_at >= self.cache_s:
                self._last = self._read()
                self._last_at = now
            return self._last

    def _read(self) -> NetworkSample:
        topology = self.topology
        if topology is None:
            return NetworkSample(read_errors=self._errors)
        interfaces, qdiscs, engines, pairs = [], [], [], []
        names = {node.address: node.name for node in topology.nodes}
        for position, node in enumerate(topology.nodes):
            try:
                links = self.read_links(node.netns)
                engine = self.read_engine(self.state_dir, topology.switch_netns, position)
            except Exception:  # noqa: BLE001 - a namespace being created or removed; the next scrape retries
                self._errors += 1
                continue
            node_interfaces, node_qdiscs, engine_stats = decode(node.name, links, engine)
            interfaces += node_interfaces
            qdiscs += node_qdiscs
            if engine_stats is not None:
                engines.append(engine_stats)
            pairs += decode_pairs(node.name, links, engine, names)
        return NetworkSample(tuple(interfaces), tuple(qdiscs), tuple(engines), self._errors, tuple(pairs))
