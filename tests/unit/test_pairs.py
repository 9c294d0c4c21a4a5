"""Topology files (model/pairs_file.py) and what model/pairs.py does with them: both forms,
default, asymmetric pairs, the symmetric fill, scale, the matrix round trip, every kind of
bad input (one line naming the file and the key), and the shipped presets."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from netbench.errors import ProfileError, UsageError
from netbench.model.pairs import PairLink, PairTopology, check_nodes, scaled, to_matrix_mapping
from netbench.model.pairs_file import load_pair_topology, pair_topology_from_mapping
from netbench.model.profile import Profile

PRESETS = Path(__file__).resolve().parents[2] / "profiles" / "topologies"
SRC = "topo.yaml"


def two_regions(**extra):
    data = {"name": "two-regions", "groups": {"us": ["n1", "n2"], "eu": ["n3", "n4"]},
            "links": {"us": {"delay": "2ms"}, "eu": {"delay": "3ms"},
                      "us-eu": {"delay": "25ms", "rate": "1gbit", "loss": "0.1%"}}}
    data.update(extra)
    return data


def delays(pairs: PairTopology) -> dict[tuple[str, str], int]:
    return {(item.src, item.dst): item.profile.delay_us for item in pairs.links}


def refused(data, *parts: str) -> str:
    """The one-line message loading `data` gives; each of `parts` is in it, and a hint."""
    with pytest.raises(UsageError) as info:
        pair_topology_from_mapping(data, SRC)
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith(f"{SRC}: "), message
    for part in parts:
        assert part in message, message
    assert info.value.hint
    return message


# ---------------------------------------------------------------- groups and links

def test_groups_links_inside_and_between_groups_in_both_directions():
    pairs = pair_topology_from_mapping(two_regions(), SRC)
    assert pairs.name == "two-regions" and pairs.source == SRC and pairs.scale == 1.0
    assert pairs.nodes == ("n1", "n2", "n3", "n4")
    assert pairs.groups == (("us", ("n1", "n2")), ("eu", ("n3", "n4")))
    assert delays(pairs) == {
        ("n1", "n2"): 2000, ("n2", "n1"): 2000, ("n3", "n4"): 3000, ("n4", "n3"): 3000,
        **{(a, b): 25000 for a in ("n1", "n2") for b in ("n3", "n4")},
        **{(b, a): 25000 for a in ("n1", "n2") for b in ("n3", "n4")}}
    far = pairs.link("n4", "n1")
    assert far.rate_bps == 10**9 and far.loss == pytest.approx(0.001) and far.name == "us-eu"
    # links are ordered by (src, dst) position in nodes
    order = [(item.src, item.dst) for item in pairs.links]
    assert order == sorted(order)
    assert [item.dst for item in pairs.from_node("n3")] == ["n1", "n2", "n4"]


def test_a_reverse_link_given_makes_the_pair_asymmetric_whatever_the_order():
    for links in ({"us-eu": {"delay": "25ms"}, "eu-us": {"delay": "40ms"}},
                  {"eu-us": {"delay": "40ms"}, "us-eu": {"delay": "25ms"}}):
        pairs = pair_topology_from_mapping(two_regions(links=links), SRC)
        assert pairs.link("n1", "n3").delay_us == 25000
        assert pairs.link("n3", "n1").delay_us == 40000
        assert pairs.link("n1", "n2") is None  # not named, no default: not shaped


def test_default_fills_every_pair_not_named_and_a_null_link_stays_unshaped():
    data = two_regions(links={"us-eu": {"delay": "25ms"}, "eu": {}}, default={"delay": "1ms", "rate": "10gbit"})
    pairs = pair_topology_from_mapping(data, SRC)
    assert pairs.link("n1", "n2").delay_us == 1000 and pairs.link("n1", "n2").name == "default"
    assert pairs.link("n1", "n2").rate_bps == 10 * 10**9
    assert pairs.link("n2", "n4").delay_us == 25000
    assert pairs.link("n3", "n4") is None and pairs.link("n4", "n3") is None  # eu: {} is a null profile
    assert len(pairs.links) == 10


def test_every_profile_key_is_allowed_per_link():
    link = {"delay": "10ms", "jitter": "1ms", "distribution": "normal", "loss": {"model": "gilbert-elliott",
            "p": "1%", "r": "30%"}, "duplicate": "1%", "corrupt": "0.1%", "reorder": "2%", "reorder_gap": 3,
            "limit": 5000, "rate": "100mbit", "direction": "egress", "name": "wan", "description": "far"}
    pairs = pair_topology_from_mapping(two_regions(links={"us-eu": link}), SRC)
    profile = pairs.link("n3", "n2")
    assert (profile.jitter_us, profile.distribution, profile.loss_model, profile.reorder_gap) == \
        (1000, "normal", "gilbert-elliott", 3)
    assert profile.limit_packets == 5000 and profile.name == "wan"


# ---------------------------------------------------------------- matrix

def test_matrix_is_one_direction_per_entry_with_a_default():
    data = {"name": "m", "matrix": {"n1": {"n2": {"delay": "5ms"}, "n3": {"delay": "40ms"}},
                                    "n3": {"n1": {"delay": "42ms"}}},
            "default": {"delay": "1ms"}}
    pairs = pair_topology_from_mapping(data, SRC)
    assert pairs.nodes == ("n1", "n3", "n2") and pairs.groups == ()
    assert delays(pairs) == {("n1", "n3"): 40000, ("n1", "n2"): 5000, ("n3", "n1"): 42000,
                             ("n3", "n2"): 1000, ("n2", "n1"): 1000, ("n2", "n3"): 1000}
    assert pairs.link("n1", "n2").name == "n1-n2"


def test_matrix_nodes_list_orders_the_nodes_and_names_those_only_default_reaches():
    data = {"nodes": ["n1", "n2", "n3"], "matrix": {"n2": {"n1": {"delay": "5ms"}}}, "default": {"delay": "1ms"}}
    pairs = pair_topology_from_mapping(data, SRC)
    assert pairs.nodes == ("n1", "n2", "n3") and pairs.name == "topology"
    assert pairs.link("n3", "n1").delay_us == 1000 and pairs.link("n2", "n1").delay_us == 5000


# ---------------------------------------------------------------- scale, round trip, records

def test_scaled_multiplies_every_delay_and_jitter_and_records_the_factor():
    data = two_regions(links={"us": {"delay": "2ms", "jitter": "1ms"}, "us-eu": {"delay": "25ms", "rate": "1gbit"}})
    pairs = pair_topology_from_mapping(data, SRC)
    twice = scaled(pairs, 2)
    assert twice.scale == 2.0 and twice.nodes == pairs.nodes and twice.name == pairs.name
    assert twice.link("n1", "n2").delay_us == 4000 and twice.link("n1", "n2").jitter_us == 2000
    assert twice.link("n4", "n1").delay_us == 50000 and twice.link("n4", "n1").rate_bps == 10**9
    back = scaled(twice, 0.25)
    assert back.scale == 0.5 and back.link("n1", "n3").delay_us == 12500
    assert scaled(pairs, 1.5).link("n1", "n2").delay_us == 3000


@pytest.mark.parametrize("factor", [0, -1, float("nan"), float("inf"), True, "2"])
def test_a_scale_that_is_not_a_number_above_zero_is_refused(factor):
    pairs = pair_topology_from_mapping(two_regions(), SRC)
    with pytest.raises(UsageError, match="scale: must be a number above 0") as info:
        scaled(pairs, factor)
    assert "\n" not in str(info.value)


def test_a_scale_that_takes_a_delay_past_the_limit_names_the_file_and_pair():
    pairs = pair_topology_from_mapping(two_regions(), SRC)
    with pytest.raises(ProfileError, match=r"topo.yaml \(scale 1000\): n1->n3: delay: .* is absurd"):
        scaled(pairs, 1000)


@pytest.mark.parametrize("data", [
    two_regions(),
    two_regions(links={"us-eu": {"delay": "25ms"}, "eu-us": {"delay": "40ms", "jitter": "2ms"}},
                default={"delay": "1ms", "loss": {"model": "gilbert-elliott", "p": "1%", "r": "25%"}}),
    {"nodes": ["n1", "n2", "n3"], "matrix": {"n2": {"n1": {"delay": "5ms", "rate": "8kbit"}}}},
])
def test_the_matrix_form_reads_back_to_an_equal_topology(data, tmp_path):
    pairs = pair_topology_from_mapping(data, SRC)
    written = to_matrix_mapping(pairs)
    assert set(written) == {"name", "nodes", "matrix"}
    assert pair_topology_from_mapping(written, SRC) == pairs
    # through a YAML file too, as `show --output` writes it
    path = tmp_path / "out.yaml"
    path.write_text(yaml.safe_dump(written, sort_keys=False))
    assert load_pair_topology(path) == PairTopology(pairs.name, pairs.nodes, pairs.links, str(path))


def test_a_scaled_topology_writes_its_scaled_delays():
    pairs = scaled(pair_topology_from_mapping(two_regions(), SRC), 2)
    again = pair_topology_from_mapping(to_matrix_mapping(pairs), SRC)
    assert again.links == pairs.links and again.scale == 1.0


def test_to_json_holds_name_source_scale_and_every_pair():
    pairs = scaled(pair_topology_from_mapping(two_regions(), SRC), 2)
    record = pairs.to_json()
    assert record["name"] == "two-regions" and record["source"] == SRC and record["scale"] == 2.0
    assert record["groups"] == {"us": ["n1", "n2"], "eu": ["n3", "n4"]}
    assert len(record["links"]) == 12
    first = record["links"][0]
    assert (first["src"], first["dst"], first["profile"]["delay_us"]) == ("n1", "n2", 4000)
    import json
    assert json.loads(json.dumps(record)) == record


def test_groups_do_not_count_in_equality():
    link = PairLink("n1", "n2", Profile(delay_us=1000))
    assert PairTopology("t", ("n1", "n2"), (link,), groups=(("a", ("n1", "n2")),)) == \
        PairTopology("t", ("n1", "n2"), (link,))


# ---------------------------------------------------------------- check_nodes

def test_check_nodes_names_the_group_and_the_missing_node():
    pairs = pair_topology_from_mapping(two_regions(groups={"us": ["n1", "n2"], "eu": ["n3", "n9"]}), SRC)
    check_nodes(pairs, ["n1", "n2", "n3", "n9"], "the testbed")
    with pytest.raises(ProfileError) as info:
        check_nodes(pairs, ["n1", "n2", "n3", "n4"], "the testbed")
    assert str(info.value) == "topo.yaml: groups: eu: no node n9 in the testbed (n1, n2, n3, n4)"
    assert info.value.hint


def test_check_nodes_in_a_matrix_names_the_row_and_counts_the_rest():
    data = {"matrix": {"n7": {"n1": {"delay": "5ms"}}, "n1": {"n8": {"delay": "5ms"}}}}
    pairs = pair_topology_from_mapping(data, SRC)
    with pytest.raises(ProfileError) as info:
        check_nodes(pairs, ["n1", "n2"], "the inventory hosts.yaml")
    message = str(info.value)
    assert message == "topo.yaml: matrix: n7: no node n7 in the inventory hosts.yaml (n1, n2) (and 1 more: n8)"
    with pytest.raises(ProfileError, match=r"^topo.yaml: matrix: n1: n8: no node n8"):
        check_nodes(pairs, ["n1", "n7"], "the testbed")


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("data, parts", [
    ({"groups": {"us": ["n1", "n2"], "eu": ["n2", "n3"]}, "default": {"delay": "1ms"}},
     ("groups: eu: node n2 is also in group us",)),
    ({"groups": {"us": ["n1", "n1"]}, "default": {"delay": "1ms"}}, ("groups: us: node n1 is twice",)),
    (two_regions(links={"us-asia": {"delay": "1ms"}}), ("links: us-asia: no group asia (groups: us, eu)",)),
    (two_regions(links={"asia": {"delay": "1ms"}}), ("links: asia: no group asia",)),
    (two_regions(links={"us-eu-us": {"delay": "1ms"}}), ("links: us-eu-us: a link is a group (us) or two groups",)),
    (two_regions(links={"us-": {"delay": "1ms"}}), ("links: us-:",)),
    (two_regions(links={"us-us": {"delay": "1ms"}}), ("links: us-us: a link inside a group is written as us",)),
    ({"groups": {"us-east": ["n1", "n2"]}}, ("groups: us-east: group name us-east holds '-'",)),
    ({"matrix": {"n1": {"n1": {"delay": "1ms"}}}}, ("matrix: n1: n1: a node has no link to itself",)),
    ({"nodes": ["n1", "n2"], "matrix": {"n7": {"n1": {"delay": "1ms"}}}}, ("matrix: n7: no node n7 in nodes (n1, n2)",)),
    ({"nodes": ["n1", "n2"], "matrix": {"n1": {"n9": {"delay": "1ms"}}}}, ("matrix: n9: no node n9 in nodes",)),
    ({"nodes": ["n1", "n1"], "matrix": {"n1": {"n2": {"delay": "1ms"}}}}, ("nodes: node n1 is listed twice",)),
    (two_regions(matrix={"n1": {"n2": {"delay": "1ms"}}}), ("groups and matrix: give one of them, not both",)),
    ({"name": "x", "default": {"delay": "1ms"}}, ("no groups and no matrix",)),
    (two_regions(nodes=["n1"]), ("nodes: groups name the nodes already",)),
    ({"matrix": {"n1": {"n2": {"delay": "1ms"}}}, "links": {}}, ("links: links join groups",)),
    (two_regions(link={"us": {}}), ("link: unknown key",)),
    (two_regions(groups={}), ("groups: no groups",)),
    (two_regions(groups={"us": [], "eu": ["n3"]}), ("groups: us: the group is empty",)),
    (two_regions(groups={"us": "n1, n2", "eu": ["n3"]}), ("groups: us: must be a list of nodes",)),
    (two_regions(groups=["n1", "n2"]), ("groups: must be a mapping, got list",)),
    (two_regions(groups={"us": ["n1", 2]}), ("groups: us: 2 is not a node name",)),
    (two_regions(groups={"us": ["n1", "n 2"]}), ("groups: us: 'n 2' is not a node name",)),
    (two_regions(links=["us"]), ("links: must be a mapping, got list",)),
    (two_regions(links={"us": "2ms"}), ("links: us: a profile must be a mapping",)),
    (two_regions(links={"us": None}), ("links: us: the profile is empty",)),
    (two_regions(links={"us-eu": {"delay": "25xs"}}), ("links: us-eu: delay:",)),
    (two_regions(links={"us-eu": {"delya": "25ms"}}), ("links: us-eu: delya: unknown key",)),
    (two_regions(links={"us-eu": {"delay": "25ms", "peers": ["n3"]}}), ("links: us-eu: peers: a link already names",)),
    (two_regions(links={"us-eu": {"delay": "25ms", "direction": "both"}}),
     ("links: us-eu: direction: a link is one-way out of its source node, not both",)),
    ({"matrix": {"n1": {"n2": {"delay": "1ms", "direction": "ingress"}}}}, ("matrix: n1: n2: direction:",)),
    ({"matrix": {"n1": ["n2"]}}, ("matrix: n1: must be a mapping, got list",)),
    ({"matrix": {}}, ("matrix: no rows",)),
    ({"matrix": {"n1": {"n2": {"delay": "1ms"}}}, "default": {"jitter": "5ms"}}, ("default: jitter",)),
    (two_regions(links={"us": {}}, default=None), ("default: the profile is empty",)),
    (two_regions(links={"us": {"delay": "0ms"}}), ("no pair is shaped",)),
    (two_regions(name=""), ("name: must be a non-empty string",)),
    (two_regions(description=3), ("description: must be a string",)),
    (["n1"], ("a topology must be a mapping of keys to values, not a list",)),
    (None, ("not empty",)),
])
def test_bad_input_is_one_line_naming_the_file_and_key(data, parts):
    refused(data, *parts)


def test_an_unknown_key_hints_at_the_closest():
    with pytest.raises(ProfileError) as info:
        pair_topology_from_mapping(two_regions(link={"us": {}}), SRC)
    assert info.value.hint == "did you mean 'links'?"


def test_too_many_nodes_is_refused():
    data = {"groups": {"all": [f"n{i}" for i in range(1, 258)]}, "links": {"all": {"delay": "1ms"}}}
    refused(data, "groups: 257 nodes, over the 256 supported")


def test_a_file_error_names_the_path_and_line(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("groups:\n  us: [n1, n2]\n  us: [n3]\n")
    with pytest.raises(ProfileError, match=r"t.yaml: line 3: key 'us' appears twice"):
        load_pair_topology(path)
    with pytest.raises(ProfileError, match="no such topology file"):
        load_pair_topology(tmp_path / "missing.yaml")
    path.write_text("groups:\n  us: [n1, n2]\nlinks:\n  us: {delay: 2ms}\n")
    assert load_pair_topology(path).name == "t"  # the file's stem, as profiles


# ---------------------------------------------------------------- presets

SHIPPED = sorted(PRESETS.glob("*.yaml"))


def test_presets_are_shipped():
    assert {path.name for path in SHIPPED} >= {"two-regions.yaml", "world.yaml"}
    assert (PRESETS / "README.md").is_file()


@pytest.mark.parametrize("path", SHIPPED, ids=[path.name for path in SHIPPED])
def test_every_preset_loads_checks_against_its_nodes_and_round_trips(path):
    pairs = load_pair_topology(path)
    assert pairs.name == path.stem and pairs.links
    check_nodes(pairs, [f"n{i}" for i in range(1, len(pairs.nodes) + 1)], "the testbed")
    assert pair_topology_from_mapping(to_matrix_mapping(pairs), str(path)) == pairs


def test_two_regions_preset_is_the_issue_example():
    pairs = load_pair_topology(PRESETS / "two-regions.yaml")
    assert pairs == pair_topology_from_mapping(two_regions(), str(PRESETS / "two-regions.yaml"))


def test_world_preset_is_eight_regions_one_node_each_at_half_the_measured_delay():
    pairs = load_pair_topology(PRESETS / "world.yaml")
    assert pairs.nodes == tuple(f"n{i}" for i in range(1, 9))
    assert [group for group, _ in pairs.groups] == ["oregon", "virginia", "ohio", "tokyo", "seoul", "london",
                                                    "frankfurt", "ireland"]
    assert all(len(members) == 1 for _, members in pairs.groups)
    assert len(pairs.links) == 8 * 7  # every ordered pair, symmetric
    for item in pairs.links:
        assert item.profile == pairs.link(item.dst, item.src)
        assert item.profile.loss == 0 and item.profile.rate_bps
    # Oregon-Virginia 67 ms and 0.79 Gbit/s, Virginia-Ohio 11 ms and 1.12 Gbit/s in the source table
    assert pairs.link("n1", "n2").delay_us == 33500 and pairs.link("n1", "n2").rate_bps == 790 * 10**6
    assert pairs.link("n3", "n2").delay_us == 5500 and pairs.link("n3", "n2").rate_bps == 1120 * 10**6
    with pytest.raises(ProfileError, match=r"world.yaml: groups: ireland: no node n8 in the testbed"):
        check_nodes(pairs, [f"n{i}" for i in range(1, 8)], "the testbed")
