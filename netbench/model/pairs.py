"""Per-pair topologies: a one-way profile for every ordered pair of nodes (pure).

A topology file names groups of nodes and the links inside and between them, or gives a
full matrix (node -> node -> profile); both become one PairTopology: for every ordered
pair (src, dst) that is shaped, the profile of the one-way path from src to dst. A pair
that is not named and has no `default:` is not shaped. The backends shape each source
node's egress per destination (netem: an htb class and netem leaf per destination,
userspace: the delay engine's per-destination queues).

Reading a file is model/pairs_file.py (`load_pair_topology`, `pair_topology_from_mapping`);
here: `scaled` (every delay and jitter times a factor), `to_matrix_mapping` (the matrix form
a file is written in), `check_nodes` (every node in a testbed or inventory) and
`PairTopology.to_json` (for results records).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from netbench.errors import ProfileError, UsageError, shown
from netbench.model.profile import Profile, validate

MAX_LISTED = 8  # nodes named in a message before "..."


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
    were multiplied by (already applied to `links`, recorded for results).
    groups: the file's groups ((group, its nodes), in the file's order; () for a matrix),
    kept for messages and reports; not part of equality (the matrix form has none)."""

    name: str
    nodes: tuple[str, ...]
    links: tuple[PairLink, ...]
    source: str = ""
    scale: float = 1.0
    groups: tuple[tuple[str, tuple[str, ...]], ...] = field(default=(), compare=False)
    # the file's `compute:` (model.compute.Compute: each node's CPU limit and step delay), which a
    # run of the topology takes as its own; not part of the network (None: every node unlimited)
    compute: Any = field(default=None, compare=False)

    def link(self, src: str, dst: str) -> Profile | None:
        """The profile from `src` to `dst`, or None when that pair is not shaped."""
        for item in self.links:
            if item.src == src and item.dst == dst:
                return item.profile
        return None

    def from_node(self, src: str) -> tuple[PairLink, ...]:
        """The shaped links leaving `src`, in destination order."""
        return tuple(item for item in self.links if item.src == src)

    def group_of(self, node: str) -> str | None:
        """The group `node` is in, or None (a matrix, or a node in no group)."""
        for group, members in self.groups:
            if node in members:
                return group
        return None

    def to_json(self) -> dict[str, Any]:
        """For manifests and run records (JSON-native: equal after a JSON round trip):
        canonical numbers (Profile.to_record), every shaped pair as {src, dst, profile}."""
        out: dict[str, Any] = {"name": self.name, "source": self.source, "scale": self.scale,
                               "nodes": list(self.nodes)}
        if self.groups:
            out["groups"] = {group: list(members) for group, members in self.groups}
        out["links"] = [{"src": item.src, "dst": item.dst, "profile": _record(item.profile)} for item in self.links]
        return out


def _record(profile: Profile) -> dict[str, Any]:
    """Profile.to_record as JSON reads it back (peers a list)."""
    record = profile.to_record()
    record["peers"] = list(record["peers"])
    return record


def scaled(pairs: PairTopology, factor: float) -> PairTopology:
    """`pairs` with every link's delay and jitter multiplied by `factor` (rounded to whole
    microseconds; rates and loss unchanged); records scale = factor * pairs.scale. A
    factor that is not a number above 0, or that takes a delay over the profile limits,
    is a one-line error."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) \
            or factor <= 0:
        raise UsageError(f"scale: must be a number above 0, got {shown(factor)}",
                         hint="2 doubles every delay, 0.5 halves it")
    where = pairs.source or pairs.name
    links = []
    for item in pairs.links:
        profile = replace(item.profile, delay_us=round(item.profile.delay_us * factor),
                          jitter_us=round(item.profile.jitter_us * factor))
        validate(profile, f"{where} (scale {factor:g}): {item.src}->{item.dst}")
        links.append(replace(item, profile=profile))
    return replace(pairs, links=tuple(links), scale=factor * pairs.scale)


def to_matrix_mapping(pairs: PairTopology) -> dict[str, Any]:
    """The matrix form of `pairs` ({name, nodes, matrix: src -> dst -> profile}, profiles in
    the units people write), which pair_topology_from_mapping reads back to an equal
    PairTopology with scale 1: the written delays are the scaled ones."""
    matrix: dict[str, dict[str, Any]] = {}
    for item in pairs.links:
        matrix.setdefault(item.src, {})[item.dst] = item.profile.to_yaml_dict()
    return {"name": pairs.name, "nodes": list(pairs.nodes), "matrix": matrix}


def _listed(names: Sequence[str]) -> str:
    shown_names = ", ".join(names[:MAX_LISTED])
    return shown_names + (f", ... ({len(names)} in all)" if len(names) > MAX_LISTED else "")


def _key_of(pairs: PairTopology, node: str) -> str:
    """Where the topology's file names `node`: "groups: eu", "matrix: n7", "matrix: n1: n7"."""
    group = pairs.group_of(node)
    if group is not None:
        return f"groups: {group}"
    if pairs.groups:
        return "groups"
    for item in pairs.links:
        if item.src == node:
            return f"matrix: {node}"
    for item in pairs.links:
        if item.dst == node:
            return f"matrix: {item.src}: {node}"
    return "nodes"


def check_nodes(pairs: PairTopology, available: Sequence[str], where: str) -> None:
    """A one-line ProfileError naming the file and key when a node `pairs` names is not in
    `available` (a testbed's node names or an inventory's host names); `where` says what
    `available` is ("the testbed", "the inventory hosts.yaml")."""
    have = set(available)
    missing = [node for node in pairs.nodes if node not in have]
    if not missing:
        return
    node = missing[0]
    more = f" (and {len(missing) - 1} more: {_listed(missing[1:])})" if len(missing) > 1 else ""
    listed = f" ({_listed(list(available))})" if available else " (it has none)"
    raise ProfileError(f"{pairs.source or pairs.name}: {_key_of(pairs, node)}: no node {node} in {where}"
                       f"{listed}{more}",
                       hint="name the nodes as the testbed or inventory does, or give it more nodes")
