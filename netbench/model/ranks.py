"""Several ranks per node: placement, ports, devices and the collectives' inter-node bytes (pure).

A job with ``ranks_per_node`` R puts R ranks on each node, numbered node-major: ranks
0..R-1 on the first node, R..2R-1 on the second, and so on; ``workers`` counts ranks, so a
job of W workers uses W / R nodes. Ranks of one node share its network namespace and
address: what they send each other goes over the node's own loopback (a packet to one of
the namespace's own addresses is routed through ``lo``), never through the node's link and
never through the qdiscs that shape it; what they send to other nodes crosses the shaped
link as before.

Ports: one launch draws a base port; local rank l owns the block base + 3l .. base + 3l + 2
(command_job's offsets: PyTorch's MASTER_PORT, TensorFlow's server, JAX's coordinator), so
ranks of one node never ask for the same port.

Devices: with ``gpus_per_node`` G, node n's ranks see that node's G devices in
``CUDA_VISIBLE_DEVICES`` (devices nG..nG+G-1 of this machine on the embedded testbed, where
every node shares it; 0..G-1 on a host of its own) and each rank uses device
LOCAL_RANK of them (torchrun's convention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, TypeVar

T = TypeVar("T")  # a node: its name, or a model.topology.Node

PORT_BLOCK = 3  # ports per local rank (command_job: MASTER_PORT, +1 TensorFlow, +2 JAX)
COLLECTIVES = ("ring", "hierarchical")
DEVICES = ("cpu", "cuda")
# a playbook's hint for a setting check_ranks or check_devices refuses
HINTS = {"ranks_per_node": "workers counts ranks: cross ranks_per_node with multiples of it",
         "collective": "cross collective hierarchical with framework torch and ranks_per_node of 2 or more"}
# strategies that run with several ranks per node: one all-reduce group of every rank
RANKED_STRATEGIES = ("allreduce", "allreduce-accum", "command")


@dataclass(frozen=True)
class RankPlace:
    """One rank's place: its global rank, its node's index, its local rank on that node."""

    rank: int
    node: int
    local_rank: int
    local_world: int

    @property
    def leader(self) -> bool:
        """The node's first rank (the one that crosses the network in a hierarchical collective)."""
        return self.local_rank == 0


def check_ranks(workers: int, ranks_per_node: int, strategy: str) -> None:
    """Raise ValueError naming the setting when `workers` ranks cannot be placed R to a node."""
    if ranks_per_node < 1:
        raise ValueError(f"ranks_per_node: must be at least 1, got {ranks_per_node}")
    if ranks_per_node == 1:
        return
    if strategy not in RANKED_STRATEGIES:
        raise ValueError(f"ranks_per_node: strategy {strategy} runs one process per node; "
                         f"several ranks per node run {', '.join(RANKED_STRATEGIES)}")
    if workers % ranks_per_node:
        raise ValueError(f"ranks_per_node: {workers} workers do not fill nodes of {ranks_per_node} ranks "
                         f"(workers counts ranks: give a multiple of {ranks_per_node})")


def check_setting(settings) -> None:
    """A playbook point's (model.run.Settings) ranks per node and collective: check_ranks, and
    check_devices on the CPU."""
    check_ranks(settings.workers, settings.ranks_per_node, settings.strategy)
    check_devices("cpu", 0, settings.ranks_per_node, settings.collective, settings.framework)


def nodes_for_ranks(workers: int, ranks_per_node: int) -> int:
    """Nodes that `workers` ranks fill at `ranks_per_node` a node."""
    return max(1, workers // max(1, ranks_per_node))


def rank_places(workers: int, ranks_per_node: int) -> tuple[RankPlace, ...]:
    """Every rank's place, node-major (rank r on node r // R, local rank r % R)."""
    per = max(1, ranks_per_node)
    return tuple(RankPlace(rank=r, node=r // per, local_rank=r % per, local_world=per) for r in range(workers))


def rank_node(rank: int, ranks_per_node: int) -> int:
    """The index of the node rank `rank` is on, among the workers' nodes (node-major: r // R)."""
    return rank // max(1, ranks_per_node)


def rank_nodes(nodes: Sequence[T], workers: int, ranks_per_node: int) -> tuple[T, ...]:
    """Each rank's node, in rank order: `nodes` are the workers' nodes in placement order (one
    entry a node; placement puts them first), `ranks_per_node` ranks on each. The one mapping
    from a rank to its node: the straggler's name, the live `node` label and the step model's
    per-rank terms all come from it. A rank past the nodes given is left out."""
    return tuple(nodes[rank_node(r, ranks_per_node)] for r in range(workers)
                 if rank_node(r, ranks_per_node) < len(nodes))


def rank_port(base: int, local_rank: int) -> int:
    """The first port of local rank `local_rank`'s block (base itself for local rank 0; 0 stays 0:
    a dry run's port, drawn for each launch)."""
    return base + PORT_BLOCK * local_rank if base else 0


def visible_devices(node: int, local_world: int, gpus_per_node: int, shared_machine: bool) -> str:
    """CUDA_VISIBLE_DEVICES for a rank of node `node` ("" without GPUs): the node's own devices,
    offset by the node's index where every node shares one machine's GPUs."""
    if gpus_per_node < 1:
        return ""
    first = node * gpus_per_node if shared_machine else 0
    return ",".join(str(first + i) for i in range(gpus_per_node))


def check_devices(device: str, gpus_per_node: int, ranks_per_node: int, collective: str, framework: str) -> None:
    """Raise ValueError naming the setting for a device, GPU count or collective that cannot run."""
    if device not in DEVICES:
        raise ValueError(f"device: unknown {device!r}; choose from {', '.join(DEVICES)}")
    if collective not in COLLECTIVES:
        raise ValueError(f"collective: unknown {collective!r}; choose from {', '.join(COLLECTIVES)}")
    if gpus_per_node < 0:
        raise ValueError(f"gpus_per_node: must be at least 0, got {gpus_per_node}")
    if device == "cuda" and framework != "torch":
        raise ValueError("device: cuda runs the torch workload (--framework torch)")
    if device == "cuda" and gpus_per_node and gpus_per_node < ranks_per_node:
        raise ValueError(f"gpus_per_node: {gpus_per_node} GPUs for {ranks_per_node} ranks per node; NCCL needs "
                         "a GPU of its own for every rank")
    if collective == "hierarchical" and framework != "torch":
        raise ValueError("collective: hierarchical runs the torch workload (--framework torch)")
    if collective == "hierarchical" and ranks_per_node < 2:
        raise ValueError("collective: hierarchical needs ranks_per_node of at least 2 (one rank a node is the ring)")


def ring_internode_bytes(nodes: int, ranks_per_node: int, size_bytes: float) -> float:
    """Bytes one node sends to other nodes in one ring all-reduce of `size_bytes` over every rank
    (node-major ring: rank r sends to r + 1; gloo's and NCCL's ring: reduce-scatter then
    all-gather, each rank sending 2 (W - 1) / W of the buffer to its successor). Of a node's R
    ranks only the last one's successor is on another node, so a node sends one rank's share;
    it receives as much."""
    world = nodes * ranks_per_node
    if nodes < 2 or world < 2:
        return 0.0
    return 2.0 * (world - 1) / world * size_bytes


def hierarchical_internode_bytes(nodes: int, ranks_per_node: int, size_bytes: float) -> float:
    """Bytes one node sends to other nodes in one hierarchical all-reduce: reduce inside the node
    (loopback), a ring all-reduce between the nodes' leaders (2 (N - 1) / N of the buffer each),
    broadcast inside the node (loopback). It receives as much."""
    del ranks_per_node  # the inside steps never leave the node
    if nodes < 2:
        return 0.0
    return 2.0 * (nodes - 1) / nodes * size_bytes


def internode_bytes(collective: str, nodes: int, ranks_per_node: int, size_bytes: float) -> float:
    """Bytes each node sends (and receives) over its shaped link in one all-reduce of `size_bytes`."""
    if collective == "hierarchical":
        return hierarchical_internode_bytes(nodes, ranks_per_node, size_bytes)
    return ring_internode_bytes(nodes, ranks_per_node, size_bytes)


def bytes_agree(measured: float, expected: float, tolerance: float = 0.10) -> bool:
    """Whether the bytes measured on a node's link are within `tolerance` of the collective's
    (measured includes TCP/IP headers and the rendezvous: a few per cent over the payload)."""
    if expected <= 0:
        return measured <= 0
    return abs(measured - expected) <= tolerance * expected


def describe_ranks(workers: int, ranks_per_node: int, collective: str, device: str, gpus_per_node: int) -> list[str]:
    """A dry run's lines on the ranks' placement and their collective ([] with one rank a node)."""
    if ranks_per_node <= 1 and device == "cpu" and not gpus_per_node:
        return []
    nodes = nodes_for_ranks(workers, ranks_per_node)
    lines = [f"ranks: {workers}, {ranks_per_node} per node on {nodes} nodes, numbered node-major; ranks of one "
             "node talk over its loopback (unshaped), other nodes over the shaped links"]
    if ranks_per_node > 1:
        share = internode_bytes(collective, nodes, ranks_per_node, 1.0)
        what = ("reduce inside each node, all-reduce between the nodes' first ranks, broadcast inside"
                if collective == "hierarchical" else "one ring over every rank")
        lines.append(f"collective: {collective} ({what}); each node sends {share:.3g} x the gradient bytes "
                     "per step over its link, and receives as much")
    if device == "cuda" or gpus_per_node:
        lines.append(f"devices: {device}" + (f", {gpus_per_node} GPUs per node (CUDA_VISIBLE_DEVICES)"
                                             if gpus_per_node else ""))
    return lines
