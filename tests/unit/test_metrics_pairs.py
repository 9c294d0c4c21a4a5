"""Pure tier: the per-pair series of a per-pair topology (the shipped two-region preset applied
through the fakes of both backends, then read as a scrape reads it), and the network
dashboard's Per-pair links row."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from tests.fakes.netlink import as_dumped as dumped

from netbench.emulation import backends
from netbench.emulation.executor import Executor, read_emulation, recorded_distributions
from netbench.emulation.readback import pairs_from_rows
from netbench.metrics import catalogue, dashboards, lint
from netbench.metrics.network import NetworkReader, PairStats, decode_pairs
from netbench.metrics.state import MetricsState
from netbench.model.pairs_file import load_pair_topology
from netbench.model.topology import plan_topology
from netbench.state.journal import Journal
from tests.fakes.metrics_network import link_stats, userspace_reader
from tests.fakes.netlink import make_fakes
from tests.unit.test_metrics import samples, scrape
from tests.unit.test_metrics_engines import PAIR_PANELS, panels_without_series

ROOT = Path(__file__).resolve().parents[2]
TOPO = plan_topology(4, ipaddress.ip_network("10.213.0.0/24"))
PAIRS = load_pair_topology(ROOT / "profiles/topologies/two-regions.yaml")
PAIR_SERIES = ("netbench_pair_configured_delay_seconds", "netbench_pair_configured_rate_bytes_per_second",
               "netbench_pair_packets_total", "netbench_pair_drops_total")
US = ("n1", "n2")


def by_pair(values: dict) -> dict:
    return {(dict(labels)["src"], dict(labels)["dst"]): value for labels, value in values.items()}


def mechanisms(values: dict) -> set:
    return {dict(labels)["mechanism"] for labels in values}


def applied(tmp_path, backend: str):
    """The two-region preset applied through the fakes of `backend`; (qdiscs, iptables, engines, journal)."""
    qdiscs, iptables, engines, _ = make_fakes()
    journal = Journal(tmp_path / backend)
    Executor(journal, qdiscs, iptables, engines).apply(backends.plan_pairs_apply(PAIRS, TOPO, backend))
    return qdiscs, iptables, engines, journal


def netem_reader(qdiscs) -> NetworkReader:
    """A reader over what the fake kernel holds: each destination's netem leaf has sent 10 x
    (its class number) packets and dropped its class number."""
    def read_links(netns: str) -> list[dict]:
        tree = qdiscs.read(netns, "eth0")
        pairs = None
        if tree and tree.get("pairs"):
            pairs = [{**row, "packets": 10 * int(row["classid"].split(":")[1], 16),
                      "drops": int(row["classid"].split(":")[1], 16), "bytes": 0, "backlog": 0}
                     for row in tree["pairs"]]
        return [{"interface": "eth0", "stats": link_stats(100),
                 "qdisc": {"drops": 0, "overlimits": 0, "backlog": 0, "qlen": 0, "packets": 0}, "pairs": pairs}]

    return NetworkReader(Path("/nonexistent"), read_links=read_links, read_engine=lambda *a: None, cache_s=0,
                         topology=TOPO)


def engine_reader(engines) -> NetworkReader:
    """A reader over the fake engines' tables: each destination released 7 packets, lost 2 and
    went over its queue limit once."""
    def read_engine(state_dir, switch_netns, position):
        stats = engines.read(switch_netns, position + 1)  # the engines run in the switch's namespace
        if stats is None:
            return None
        counters = {"packets": 10, "accepted": 7, "dropped": 2, "overlimits": 1, "queue_depth": 0, "max_queue_depth": 3}
        return {**stats, "pairs": [{**row, **counters} for row in stats.get("pairs", ())]}

    return NetworkReader(Path("/nonexistent"), read_links=lambda netns: [{"interface": "eth0",
                                                                          "stats": link_stats(100), "qdisc": None}],
                         read_engine=read_engine, cache_s=0, topology=TOPO)


def expected_delays() -> dict:
    return {(link.src, link.dst): link.profile.delay_us / 1e6 for link in PAIRS.links}


def test_a_netem_per_pair_tree_gives_every_ordered_pair_its_configured_delay_rate_and_counters(tmp_path):
    qdiscs, iptables, engines, journal = applied(tmp_path, "netem")
    families, text = scrape(MetricsState(), netem_reader(qdiscs))
    delays = by_pair(samples(families, "netbench_pair_configured_delay_seconds"))
    assert len(delays) == 4 * 3
    assert delays == pytest.approx(expected_delays())
    assert delays[("n1", "n2")] == pytest.approx(0.002) and delays[("n3", "n4")] == pytest.approx(0.003)
    assert delays[("n1", "n3")] == delays[("n3", "n1")] == pytest.approx(0.025)
    rates = by_pair(samples(families, "netbench_pair_configured_rate_bytes_per_second"))
    assert rates[("n1", "n3")] == rates[("n4", "n2")] == 1_000_000_000 / 8
    assert rates[("n1", "n2")] == rates[("n4", "n3")] == 0  # unlimited
    packets = samples(families, "netbench_pair_packets_total")
    assert mechanisms(packets) == {"netem"} and len(packets) == 12
    # n1's classes in plan order: n2, n3, n4 -> 4e42:1, :2, :3
    assert by_pair(packets)[("n1", "n2")] == 10 and by_pair(packets)[("n1", "n4")] == 30
    assert by_pair(samples(families, "netbench_pair_drops_total"))[("n1", "n3")] == 2
    # the series agree with what `netbench show` reads back from the same kernel state
    held = pairs_from_rows(read_emulation(TOPO, qdiscs, iptables, engines, recorded_distributions(journal)), TOPO)
    assert delays == pytest.approx({(link.src, link.dst): link.profile.delay_us / 1e6 for link in held.links})
    assert 'netbench_pair_configured_delay_seconds{dst="n3",src="n1"} 0.025' in text
    assert 'netbench_pair_packets_total{dst="n2",mechanism="netem",src="n1"} 10.0' in text


def test_a_userspace_engine_table_gives_every_ordered_pair_its_configured_delay_rate_and_counters(tmp_path):
    _, _, engines, _ = applied(tmp_path, "userspace")
    families, text = scrape(MetricsState(), engine_reader(engines))
    delays = by_pair(samples(families, "netbench_pair_configured_delay_seconds"))
    assert delays == pytest.approx(expected_delays())
    rates = by_pair(samples(families, "netbench_pair_configured_rate_bytes_per_second"))
    assert rates[("n2", "n4")] == 1_000_000_000 / 8 and rates[("n2", "n1")] == 0
    packets, drops = (samples(families, name) for name in ("netbench_pair_packets_total", "netbench_pair_drops_total"))
    assert mechanisms(packets) == mechanisms(drops) == {"engine"}
    assert set(by_pair(packets).values()) == {7}  # released, not arrived
    assert set(by_pair(drops).values()) == {3}  # loss verdicts and queue overlimits
    for name in ("netbench_qdisc_packets_total", "netbench_qdisc_drops_total"):
        assert samples(families, name) == {}, name  # no tbf: the table rate-limits per destination
    assert 'netbench_pair_drops_total{dst="n1",mechanism="engine",src="n4"} 3.0' in text
    assert 'netbench_pair_configured_rate_bytes_per_second{dst="n3",src="n2"} 1.25e+08' in text


@pytest.mark.parametrize("delay, rate", [(True, False), (False, True)], ids=["engine", "tbf"])
def test_a_node_with_one_profile_for_every_link_has_no_per_pair_series(delay, rate):
    families, _ = scrape(MetricsState(), userspace_reader(delay=delay, rate=rate))
    for name in PAIR_SERIES:
        assert samples(families, name) == {}, name


def test_decode_pairs_names_destinations_and_keeps_one_outside_the_testbed_by_address():
    from netbench.emulation.netlink.netem import NetemParams

    links = [{"interface": "eth0", "stats": {}, "qdisc": None,
              "pairs": [{"peer": "10.213.0.2/32", "netem": NetemParams(delay_us=2_000), "rate_bps": None,
                         "classid": "4e42:1", "packets": 5, "drops": 1},
                        {"peer": "192.0.2.9/32", "netem": NetemParams(delay_us=40_000), "rate_bps": 8_000_000,
                         "classid": "4e42:2"}]}]
    assert decode_pairs("n1", links, None, {"10.213.0.2": "n2"}) == [
        PairStats("n1", "n2", "netem", 0.002, 0, 5, 1), PairStats("n1", "192.0.2.9", "netem", 0.04, 1_000_000, 0, 0)]
    engine = {"pairs": [{"dst": "10.213.0.2", "delay_us": 25_000, "rate_bps": None, "accepted": 3, "dropped": 1}]}
    assert decode_pairs("n1", [], engine, {"10.213.0.2": "n2"}) == [PairStats("n1", "n2", "engine", 0.025, 0, 3, 1)]
    assert decode_pairs("n1", [{"interface": "eth0", "stats": {}, "qdisc": {}}], {"params": {}}, {}) == []


def test_the_catalogue_lists_the_pair_series_with_bounded_labels():
    for name in PAIR_SERIES:
        metric = catalogue.BY_NAME[name]
        assert metric.group == "pairs" and metric.labels[:2] == ("src", "dst"), name
    assert catalogue.BY_NAME["netbench_pair_packets_total"].labels == ("src", "dst", "mechanism")
    assert catalogue.PAIR_MECHANISMS == ("netem", "engine")


# ---------------------------------------------------------------- the dashboard row


def pair_row(dashboard: dict) -> list[dict]:
    panels = dashboard["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "Per-pair links")
    return panels[start + 1:]


def test_the_network_dashboard_has_a_per_pair_row_with_src_and_dst_variables():
    board = dashboards.network()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    for name in ("src", "dst"):
        selector, label = lint.label_values(variables[name]["query"]["query"])
        assert label == name and [m for m, _ in lint.metric_names(selector)] == ["netbench_pair_configured_delay_seconds"]
    assert 'src=~"$src"' in variables["dst"]["query"]["query"]  # dst follows the chosen sources
    row = pair_row(board)
    assert [p["title"] for p in row] == PAIR_PANELS
    queried = set()
    for panel in row:
        for t in panel["targets"]:
            assert 'src=~"$src"' in t["expr"] and 'dst=~"$dst"' in t["expr"], t["expr"]
            queried |= {name for name, _ in lint.metric_names(t["expr"])}
    assert queried == set(PAIR_SERIES)
    units = {p["title"]: p["fieldConfig"]["defaults"]["unit"] for p in row}
    assert units == {"Pair packets and drops": "pps", "Pair delay (configured, one-way)": "s",
                     "Pair rate limit (configured)": "bps"}
    rows = [p for p in board["panels"] if p["type"] == "row"]
    assert rows[0]["gridPos"] == {"x": 0, "y": rows[0]["gridPos"]["y"], "w": 24, "h": 1}
    assert all(p["gridPos"]["y"] > rows[0]["gridPos"]["y"] for p in row)
    assert lint.lint([board]) == []


@pytest.mark.parametrize("backend", ["netem", "userspace"])
def test_every_network_panel_has_a_series_under_a_per_pair_topology(tmp_path, backend):
    qdiscs, _, engines, _ = applied(tmp_path, backend)
    families, _ = scrape(MetricsState(), netem_reader(qdiscs) if backend == "netem" else engine_reader(engines))
    exposed = {s.name for family in families.values() for s in family.samples}
    assert [t for t in panels_without_series(dashboards.network(), exposed) if t in PAIR_PANELS] == []


def test_lint_refuses_a_row_with_queries():
    board = dashboards.network()
    row = next(p for p in board["panels"] if p["type"] == "row")
    row["targets"] = [dashboards.target("netbench_pair_drops_total")]
    assert any("a row with queries" in problem for problem in lint.lint([board]))


# ---------------------------------------------------------------- the real reader's dumps


class FakeLink(dict):
    def get_attr(self, name):
        return {"IFLA_IFNAME": self["name"], "IFLA_STATS64": {"tx_packets": 9}}.get(name)


class FakeNetns:
    """What read_node_links dumps from a node holding a per-destination tree: an htb root, one
    netem leaf under class 4e42:1, and the u32 filter sending 10.213.0.3 there."""

    def __init__(self, root_kind: str) -> None:
        from pyroute2.netlink.rtnl.tcmsg import tcmsg

        from netbench.emulation.netlink import netem, pairtree

        root = tcmsg()
        root["index"], root["handle"], root["parent"] = 2, 0x4E420000, 0xFFFFFFFF
        root["attrs"] = [["TCA_KIND", root_kind]]
        leaf = netem.netem_tcmsg()
        leaf["index"], leaf["handle"], leaf["parent"] = 2, 0x4E430000, 0x4E420001
        leaf["attrs"] = [["TCA_KIND", "netem"], ["TCA_OPTIONS", netem.options(netem.NetemParams(delay_us=25_000))]]
        self.qdiscs = [dumped(root), dumped(leaf)]
        flt = pairtree.dst_message(2, "10.213.0.3/32", 0x4E420001)
        flt["handle"] = 0x4E403800
        self.filters = [dumped(flt)]
        self.asked: list[str] = []

    def get_links(self):
        return [FakeLink(name="lo", index=1), FakeLink(name="eth0", index=2)]

    def get_qdiscs(self, index):
        return self.qdiscs

    def get_classes(self, index):
        self.asked.append("classes")
        return []

    def get_filters(self, index, parent):
        self.asked.append("filters")
        return self.filters

    def close(self):
        pass


@pytest.mark.parametrize("root_kind", ["htb", "tbf"])
def test_the_reader_decodes_a_dumped_per_destination_tree_and_dumps_nothing_more_for_other_roots(
        monkeypatch, root_kind):
    from netbench.emulation.netlink import rtnl
    from netbench.metrics.network import read_node_links

    ns = FakeNetns(root_kind)
    monkeypatch.setattr(rtnl, "iproute_in", lambda netns: ns)
    rows = read_node_links("netbench-n1")
    assert [row["interface"] for row in rows] == ["eth0"]
    if root_kind == "tbf":
        assert rows[0]["pairs"] is None and ns.asked == []
        return
    (pair,) = rows[0]["pairs"]
    assert (pair["peer"], pair["classid"], pair["netem"].delay_us, pair["rate_bps"]) == (
        "10.213.0.3/32", "4e42:1", 25_000, None)
    stats = decode_pairs("n1", rows, None, {node.address: node.name for node in TOPO.nodes})
    assert stats == [PairStats("n1", "n3", "netem", 0.025, 0, 0, 0)]


def test_a_destination_whose_netem_leaf_is_missing_reads_back_as_its_rate_alone():
    # a change cut short can leave an htb class (its rate) without the netem leaf under it
    n1, n2, n3 = TOPO.nodes[:3]
    rows = [{"node": "n1", "qdisc": {"pairs": [{"peer": f"{n2.address}/32", "netem": None, "rate_bps": 12_500_000},
                                               {"peer": f"{n3.address}/32", "netem": None, "rate_bps": None}]}}]
    held = pairs_from_rows(rows, TOPO)
    assert held.link("n1", "n2").rate_bps == 12_500_000 and held.link("n1", "n2").delay_us == 0
    assert held.link("n1", "n3") is None  # nothing shapes it any more
