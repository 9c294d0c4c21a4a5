"""Fakes of what the metrics' NetworkReader reads: a node's links (netlink) and its delay
engine's stats file, shaped as the userspace backend leaves them for a profile."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from netbench.metrics.network import NetworkReader
from netbench.model.topology import plan_topology


def kernel_row(queue_num: int = 1, queue_total: int = 0, queue_dropped: int = 0, user_dropped: int = 0) -> dict:
    """A /proc/net/netfilter/nfnetlink_queue row as nfqueue.parse_proc_queue returns it."""
    return {"queue_num": queue_num, "peer_portid": 4242, "queue_total": queue_total, "copy_mode": 2,
            "copy_range": 65531, "queue_dropped": queue_dropped, "user_dropped": user_dropped, "id_sequence": 77}


def engine_stats(alive: bool = True, received: int = 0, accepted: int = 0, dropped: int = 0, queue_depth: int = 0,
                 kernel: dict | None = None, **extra: Any) -> dict:
    """What Engines.read returns: DelayEngine.stats()'s keys plus `alive`."""
    stats = {"pid": 4321, "queue_num": 1, "params": {"delay_us": 20_000, "jitter_us": 0, "loss": 0.0, "seed": 1},
             "maxlen": 10_000, "spin_us": 100, "received": received, "accepted": accepted, "dropped": dropped,
             "enobufs": 0, "stale_verdicts": 0, "gso_packets": 0, "queue_depth": queue_depth,
             "max_queue_depth": queue_depth, "lateness_us": {"count": accepted, "mean": 80.0, "max": 900.0,
                                                      "over_1ms": accepted // 10, "over_10ms": accepted // 50},
             "kernel": kernel if kernel is not None else kernel_row(), "started_at": 1000.0, "updated_at": 1010.0,
             "uptime_s": 10.0, "final": False, "reconfigurations": 0, "control": None, "alive": alive}
    stats.update(extra)
    return stats


def link_stats(base: int) -> dict:
    return {"rx_bytes": base * 1500, "tx_bytes": base * 1400, "rx_packets": base, "tx_packets": base,
            "rx_dropped": 0, "tx_dropped": 0}


def tbf_counters(sent: int) -> dict:
    """The root tbf's counters as read_node_links decodes them."""
    return {"drops": 1, "overlimits": 12, "backlog": 3000, "qlen": 2, "packets": sent}


def userspace_reader(delay: bool, rate: bool, nodes: int = 2) -> NetworkReader:
    """A reader over `nodes` nodes under the userspace backend: a root tbf when the profile has
    a rate, a delay engine (one per node, queue = position + 1) when it has delay."""
    topology = plan_topology(nodes, ipaddress.ip_network("10.213.0.0/24"))
    positions = {node.netns: position for position, node in enumerate(topology.nodes)}

    def read_links(netns: str) -> list[dict]:
        base = 100 * (positions[netns] + 1)
        return [{"interface": "eth0", "stats": link_stats(base), "qdisc": tbf_counters(base) if rate else None}]

    def read_engine(state_dir: Path, switch_netns: str, position: int) -> dict | None:
        if not delay:
            return None
        base = 100 * (position + 1)
        return engine_stats(received=base, accepted=base - 4, dropped=1, queue_depth=3,
                            kernel=kernel_row(position + 1, queue_total=position, queue_dropped=2, user_dropped=1))

    return NetworkReader(Path("/nonexistent"), read_links=read_links, read_engine=read_engine, cache_s=0,
                         topology=topology)
