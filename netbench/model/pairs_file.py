"""Topology files: groups and links, or a full matrix, read into a PairTopology (pure).

Two forms, one per file:

    name: two-regions                  matrix form:
    groups:                            name: measured
      us: [n1, n2]                     matrix:
      eu: [n3, n4]                       n1: {n2: {delay: 5ms}, n3: {delay: 40ms}}
    links:                               n3: {n1: {delay: 42ms}}
      us: {delay: 2ms}                 nodes: [n1, n2, n3]   # optional: every node, in order
      us-eu: {delay: 25ms}

In `links`, "us" is every ordered pair of distinct nodes inside group us, and "us-eu" is
us -> eu and, unless "eu-us" is given too, eu -> us. A matrix entry is one direction
(asymmetric pairs are written twice). `default:` shapes every pair the file does not name;
a pair named with a null profile ({} or delay: 0ms) is left unshaped. Every profile key is
allowed per link except `peers`, and `direction` other than egress: a link is the one-way
path out of its source node towards its destination. Group names hold no '-', so "a-b" is
always a pair of groups. Errors are one line naming the file and the key.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Mapping

from netbench.errors import ProfileError, shown, shown_key
from netbench.model.pairs import PairLink, PairTopology
from netbench.model.profile import Profile, profile_from_mapping
from netbench.yamlfile import read_yaml

TOPOLOGY_KEYS = ("name", "description", "groups", "links", "matrix", "nodes", "default", "compute")
EXAMPLES = {"group": "us", "node": "n1", "link": "us-eu"}
MAX_NODES = 256  # 65,280 ordered pairs; the largest proven case is 64
HINT = "see profiles/topologies/README.md; e.g. groups: {us: [n1, n2], eu: [n3, n4]}, links: {us-eu: {delay: 25ms}}"


def _fail(source: str, key: str, message: str, hint: str | None = HINT) -> ProfileError:
    return ProfileError(f"{source}: {key}: {message}" if key else f"{source}: {message}", hint=hint)


def _name(source: str, key: str, raw: Any, what: str, dash: bool = True) -> str:
    """A group or node name: a non-empty printable string without spaces ('-' only if `dash`)."""
    if not isinstance(raw, str) or not raw or not raw.isprintable() or any(ch.isspace() for ch in raw):
        raise _fail(source, key, f"{shown(raw)} is not a {what} name",
                    f"a {what} name is a word such as {EXAMPLES[what]}")
    if not dash and "-" in raw:
        raise _fail(source, key, f"group name {raw} holds '-'",
                    "'-' joins two groups in links (us-eu); name the group e.g. us_east")
    return raw


def _mapping(source: str, key: str, raw: Any, example: str) -> Mapping:
    if not isinstance(raw, Mapping):
        raise _fail(source, key, f"must be a mapping, got {type(raw).__name__}", f"e.g. {example}")
    return raw


def _link_profile(source: str, key: str, raw: Any, default_name: str) -> Profile:
    """One link's profile; `peers` and a direction other than egress are refused."""
    where = f"{source}: {key}"
    if isinstance(raw, Mapping) and "peers" in raw:
        raise _fail(where, "peers", "a link already names its destination",
                    "remove peers: a link shapes only the traffic of its own pair")
    profile = profile_from_mapping(raw, where, default_name=default_name)
    if profile.direction != "egress":
        raise _fail(where, "direction", f"a link is one-way out of its source node, not {profile.direction}",
                    "remove direction; give the other direction its own link (eu-us)")
    return profile


def _groups(source: str, raw: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    groups = _mapping(source, "groups", raw, "groups: {us: [n1, n2], eu: [n3, n4]}")
    if not groups:
        raise _fail(source, "groups", "no groups", "e.g. groups: {us: [n1, n2], eu: [n3, n4]}")
    home: dict[str, str] = {}
    out = []
    for group_raw, members_raw in groups.items():
        group = _name(source, f"groups: {shown_key(group_raw)}", group_raw, "group", dash=False)
        key = f"groups: {group}"
        if isinstance(members_raw, str) or not isinstance(members_raw, (list, tuple)):
            raise _fail(source, key, f"must be a list of nodes, got {shown(members_raw)}", "e.g. us: [n1, n2]")
        if not members_raw:
            raise _fail(source, key, "the group is empty", "name its nodes, e.g. us: [n1, n2], or remove it")
        members = []
        for member_raw in members_raw:
            node = _name(source, key, member_raw, "node")
            if node in home:
                other = "twice in this group" if home[node] == group else f"also in group {home[node]}"
                raise _fail(source, key, f"node {node} is {other}", "a node belongs to one group")
            home[node] = group
            members.append(node)
        out.append((group, tuple(members)))
    return tuple(out)


def _group_links(source: str, raw: Any, groups: tuple[tuple[str, tuple[str, ...]], ...]) -> dict:
    """(src, dst) -> profile for every pair `links:` names; explicit directions win over the
    reverse fill of "g1-g2"."""
    links = _mapping(source, "links", raw, "links: {us: {delay: 2ms}, us-eu: {delay: 25ms}}")
    members = dict(groups)
    explicit: dict[tuple[str, str], Profile] = {}
    for key_raw, profile_raw in links.items():
        text = _name(source, f"links: {shown_key(key_raw)}", key_raw, "link")
        key = f"links: {text}"
        ends = text.split("-")
        if len(ends) > 2 or not all(ends):
            raise _fail(source, key, "a link is a group (us) or two groups (us-eu)",
                        "group names hold no '-'; write one link per pair of groups")
        for end in ends:
            if end not in members:
                raise _fail(source, key, f"no group {end} (groups: {', '.join(members)})",
                            "name a group from groups:, or add it there")
        if len(ends) == 2 and ends[0] == ends[1]:
            raise _fail(source, key, f"a link inside a group is written as {ends[0]}", f"write {ends[0]}: {{...}}")
        explicit[(ends[0], ends[-1])] = _link_profile(f"{source}: links", text, profile_raw, text)
    out: dict[tuple[str, str], Profile] = {}
    for (first, second), profile in explicit.items():
        directions = [(first, second)]
        if first != second and (second, first) not in explicit:
            directions.append((second, first))
        for src_group, dst_group in directions:
            for src in members[src_group]:
                for dst in members[dst_group]:
                    if src != dst:
                        out[(src, dst)] = profile
    return out


def _matrix(source: str, raw: Any) -> tuple[list[str], dict]:
    """The matrix's nodes (rows, then columns, in order of first appearance) and its pairs."""
    matrix = _mapping(source, "matrix", raw, "matrix: {n1: {n2: {delay: 5ms}}}")
    if not matrix:
        raise _fail(source, "matrix", "no rows", "e.g. matrix: {n1: {n2: {delay: 5ms}}}")
    nodes: list[str] = []
    out: dict[tuple[str, str], Profile] = {}
    for src_raw, row_raw in matrix.items():
        src = _name(source, f"matrix: {shown_key(src_raw)}", src_raw, "node")
        row = _mapping(source, f"matrix: {src}", row_raw, f"{src}: {{n2: {{delay: 5ms}}}}")
        if src not in nodes:
            nodes.append(src)
        for dst_raw, profile_raw in row.items():
            dst = _name(source, f"matrix: {src}: {shown_key(dst_raw)}", dst_raw, "node")
            if dst == src:
                raise _fail(source, f"matrix: {src}: {dst}", "a node has no link to itself",
                            "give only pairs of different nodes")
            out[(src, dst)] = _link_profile(f"{source}: matrix", f"{src}: {dst}", profile_raw, f"{src}-{dst}")
    for src, dst in out:
        if dst not in nodes:
            nodes.append(dst)
    return nodes, out


def _listed_nodes(source: str, raw: Any, named: list[str]) -> list[str]:
    """`nodes:` (matrix form): every node in order; each row and column must be one of them."""
    if isinstance(raw, str) or not isinstance(raw, (list, tuple)) or not raw:
        raise _fail(source, "nodes", f"must be a list of node names, got {shown(raw)}", "e.g. nodes: [n1, n2, n3]")
    nodes: list[str] = []
    for item in raw:
        node = _name(source, "nodes", item, "node")
        if node in nodes:
            raise _fail(source, "nodes", f"node {node} is listed twice", "list each node once")
        nodes.append(node)
    for node in named:
        if node not in nodes:
            raise _fail(source, f"matrix: {node}", f"no node {node} in nodes ({', '.join(nodes)})",
                        "add it to nodes:, or remove its row and column")
    return nodes


def pair_topology_from_mapping(data: Any, source: str, default_name: str = "topology") -> PairTopology:
    """Build and validate a PairTopology from a parsed topology file (the module docstring
    says what one holds); errors are ProfileErrors naming `source` and the key."""
    if not isinstance(data, Mapping):
        what = "empty" if data is None else f"a {type(data).__name__}"
        raise _fail(source, "", f"a topology must be a mapping of keys to values, not {what}")
    for key in data:
        if key not in TOPOLOGY_KEYS:
            close = difflib.get_close_matches(str(key), TOPOLOGY_KEYS, n=1)
            raise _fail(source, shown_key(key), "unknown key",
                        f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(TOPOLOGY_KEYS)}")
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name.strip():
        raise _fail(source, "name", "must be a non-empty string", "e.g. name: two-regions")
    if not isinstance(data.get("description", ""), str):
        raise _fail(source, "description", "must be a string")
    if "groups" in data and "matrix" in data:
        raise _fail(source, "groups and matrix", "give one of them, not both",
                    "groups with links, or a full matrix of node -> node -> profile")
    if "groups" not in data and "matrix" not in data:
        raise _fail(source, "", "no groups and no matrix: nothing names a node", HINT)
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    if "groups" in data:
        if "nodes" in data:
            raise _fail(source, "nodes", "groups name the nodes already", "remove nodes:, or use matrix:")
        groups = _groups(source, data["groups"])
        nodes = [node for _, members in groups for node in members]
        named = _group_links(source, data["links"], groups) if "links" in data else {}
    else:
        if "links" in data:
            raise _fail(source, "links", "links join groups, and a matrix has none",
                        "write the pairs in the matrix, or use groups:")
        nodes, named = _matrix(source, data["matrix"])
        if "nodes" in data:
            nodes = _listed_nodes(source, data["nodes"], nodes)
    if len(nodes) > MAX_NODES:
        raise _fail(source, "groups" if groups else "matrix", f"{len(nodes)} nodes, over the {MAX_NODES} supported",
                    f"use at most {MAX_NODES} nodes")
    default = _link_profile(source, "default", data["default"], "default") if "default" in data else None
    links = []
    for src in nodes:
        for dst in nodes:
            if src == dst:
                continue
            profile = named.get((src, dst), default)
            if profile is not None and not profile.is_null:
                links.append(PairLink(src, dst, profile))
    if not links:
        raise _fail(source, "", "no pair is shaped",
                    "give links (or matrix entries) with a delay, rate or loss, or a default")
    capacity = None
    if "compute" in data:  # {n2: {cpus: 0.5, step_delay: 40ms}}: nodes of the file only
        from netbench.model.compute import from_mapping

        capacity = from_mapping(data["compute"], f"{source}: compute")
        for node in capacity.nodes():
            if node not in nodes:
                raise _fail(source, f"compute.{node}", "is not a node of the topology",
                            f"its nodes are {', '.join(nodes)}")
    return PairTopology(name=name.strip(), nodes=tuple(nodes), links=tuple(links), source=source, groups=groups,
                        compute=capacity)


def load_pair_topology(path: str | Path) -> PairTopology:
    """Load and validate one topology file; the name defaults to the file's stem."""
    path = Path(path)
    data = read_yaml(path, "topology", ProfileError, "the shipped presets are in profiles/topologies/")
    return pair_topology_from_mapping(data, str(path), default_name=path.stem)
