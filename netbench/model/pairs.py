"""Per-pair topologies: a one-way profile for every ordered pair of nodes (pure).

A topology file names groups of nodes and the links inside and between them, or gives a
full matrix (node -> node -> profile); both become one PairTopology: for every ordered
pair (src, dst) that is shaped, the profile of the one-way path from src to dst. A pair
that is not named and has no `default:` is not shaped. The backends shape each source
node's egress per destination (netem: an htb class and netem leaf per destination,
userspace: the delay engine's per-destination queues).
"""

from __future__ import annotations

from dataclasses import dataclass

from netbench.model.profile import Profile


@dataclass(frozen=True)
class PairLink:
    """The one-way path from node `src` to node `dst` (names as the testbed or inventory
    knows them); `profile` is never a null profile (unshaped pairs are left out)."""

    src: str
    dst: str
    profile: Profile


@dataclass(frozen=True)
class PairTopology:
    """name: the topology's name; nodes: every node the file names, in the file's order;
    links: every shaped ordered pair, ordered by (src, dst) position in `nodes`;
    source: the file it came from ("" when built in code); scale: the factor its delays
    were multiplied by (already applied to `links`, recorded for results)."""

    name: str
    nodes: tuple[str, ...]
    links: tuple[PairLink, ...]
    source: str = ""
    scale: float = 1.0

    def link(self, src: str, dst: str) -> Profile | None:
        """The profile from `src` to `dst`, or None when that pair is not shaped."""
        for item in self.links:
            if item.src == src and item.dst == dst:
                return item.profile
        return None

    def from_node(self, src: str) -> tuple[PairLink, ...]:
        """The shaped links leaving `src`, in destination order."""
        return tuple(item for item in self.links if item.src == src)
