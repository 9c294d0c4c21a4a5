"""A torch job's gradient all-reduce: the flat ring or the hierarchical shape (imports torch).

``ring``: DistributedDataParallel's own all-reduce of each bucket over every rank (gloo's
ring: node-major, so each node's last rank sends to the next node's first).

``hierarchical`` (several ranks per node, model/ranks.py): each bucket is summed onto the
node's first rank (its leader) over the node's loopback, all-reduced between the leaders
over the shaped links, then broadcast back inside the node; the inter-node bytes are those
of an all-reduce among N nodes instead of N x R ranks (model.ranks.internode_bytes). It runs
as a DDP communication hook, so DDP's buckets and its overlap with backward stay as they are;
the three collectives of one bucket run one after another.

Every rank creates every group, in the same order (torch.distributed.new_group's rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

RING, HIERARCHICAL = "ring", "hierarchical"


@dataclass(frozen=True)
class Groups:
    """This rank's node group, its node's leader (a global rank) and the leaders' group."""

    node: Any
    leader: int
    leaders: Any
    is_leader: bool


def node_groups(world: int, local_world: int) -> list[list[int]]:
    """The ranks of each node, node-major (pure)."""
    if local_world < 1 or world % local_world:
        raise ValueError(f"collective hierarchical: {world} ranks do not fill nodes of {local_world}")
    return [list(range(n, n + local_world)) for n in range(0, world, local_world)]


def build_groups(dist: Any, rank: int, world: int, local_world: int) -> Groups:
    """Create every node's group and the leaders' group (on every rank, same order)."""
    nodes = node_groups(world, local_world)
    made = [dist.new_group(ranks) for ranks in nodes]
    leaders = dist.new_group([ranks[0] for ranks in nodes])
    mine = rank // local_world
    return Groups(node=made[mine], leader=nodes[mine][0], leaders=leaders, is_leader=rank == nodes[mine][0])


def hierarchical_all_reduce(dist: Any, tensor: Any, groups: Groups) -> None:
    """Sum `tensor` over every rank in place: reduce to the node's leader, all-reduce between
    the leaders, broadcast inside the node."""
    dist.reduce(tensor, dst=groups.leader, group=groups.node)
    if groups.is_leader:
        dist.all_reduce(tensor, group=groups.leaders)
    dist.broadcast(tensor, src=groups.leader, group=groups.node)


def all_reduce_fn(dist: Any, collective: str, groups: Groups | None) -> Callable[[Any], None]:
    """The in-place sum over every rank that `collective` names."""
    if collective == HIERARCHICAL and groups is not None:
        return lambda tensor: hierarchical_all_reduce(dist, tensor, groups)
    return lambda tensor: dist.all_reduce(tensor)


def hierarchical_hook(torch: Any, dist: Any, groups: Groups, world: int) -> Callable[[Any, Any], Any]:
    """A DDP communication hook: each bucket's gradients averaged through the hierarchy."""

    # no annotations: DDP compares a hook's annotations with its own types (strings here would fail)
    def hook(_state, bucket):  # type: ignore[no-untyped-def]
        buffer = bucket.buffer()
        hierarchical_all_reduce(dist, buffer, groups)
        buffer.div_(world)
        future = torch.futures.Future()
        future.set_result(buffer)
        return future

    return hook
