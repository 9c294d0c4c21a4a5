"""Per-pair topologies on the netem backend against a real kernel (`make test-kernel`): every
pair's htb class, netem leaf and hash-table filter read back through `tc -j` (a client
netbench did not write) and through netbench's own decoder, changed in place, and a near and
a far pair pinged. Only the expected floor of a round trip (two one-way delays) and a generous
ceiling are asserted: timing under software emulation is noisy.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from netbench import units
from netbench.emulation import backends, changes as ch
from netbench.emulation.engines import Engines
from netbench.emulation.executor import read_emulation, real_executor, recorded_distributions
from netbench.emulation.iptables import Iptables
from netbench.emulation.netlink.qdisc import NetlinkQdiscs
from netbench.model.pairs import PairLink, PairTopology
from netbench.model.profile import profile_from_mapping

from tests.kernel.conftest import bed_of

pytestmark = [pytest.mark.root, pytest.mark.netem]


def two_regions(names, near, far, far_extra=None):
    """The first half of `names` one region, the rest another: `near` one-way inside each,
    `far` between them."""
    half = len(names) // 2
    near_p = profile_from_mapping(near, "test")
    far_p = profile_from_mapping({**far, **(far_extra or {})}, "test")
    links = tuple(PairLink(src, dst, near_p if (i < half) == (j < half) else far_p)
                  for i, src in enumerate(names) for j, dst in enumerate(names) if i != j)
    return PairTopology("two-regions", tuple(names), links)


def tc_json(netns, *args):
    out = subprocess.run(["ip", "netns", "exec", netns, "tc", "-j", *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout or "[]")


def tc_classes(node):
    """{classid: (leaf handle, rate in bit/s)} from `tc class show` (iproute2 6.1 prints classes
    as text even with -j): "class htb 4e42:1 root leaf 4e43: prio 0 rate 100Mbit ceil ..."."""
    out = subprocess.run(["ip", "netns", "exec", node.netns, "tc", "class", "show", "dev", node.ifname],
                         capture_output=True, text=True, check=True).stdout
    return {m.group(1): (m.group(2), units.parse_rate_bps(m.group(3)))
            for m in re.finditer(r"^class htb (\S+) root leaf (\S+) prio \d+ rate (\S+) ", out, re.M)}


def tc_pairs(node):
    """What `tc` shows of a node's per-destination tree: {destination address: (classid, netem
    delay in s, class rate in bit/s)}, and the hash table's and link filter's options (`tc -j`)."""
    classes = tc_classes(node)
    leaves = {q["parent"]: q for q in tc_json(node.netns, "qdisc", "show", "dev", node.ifname) if q["kind"] == "netem"}
    filters = [f.get("options", {}) for f in tc_json(node.netns, "filter", "show", "dev", node.ifname, "parent", "4e42:")]
    tables = [o for o in filters if "ht_divisor" in o]
    links = [o for o in filters if "link" in o]
    out = {}
    for o in filters:
        if "flowid" not in o:
            continue
        assert o["key_ht"] == "4e4" and o["match"]["mask"] == "ffffffff" and o["match"]["off"] == 16, o
        value = int(o["match"]["value"], 16)
        address = ".".join(str(value >> s & 0xFF) for s in (24, 16, 8, 0))
        assert int(o["bkt"], 16) == value & 0xFF, o  # in the bucket of the address's last byte
        classid = o["flowid"]
        assert address not in out, f"two filters for {address}"
        leaf, rate = classes[classid]
        assert leaves[classid]["handle"] == leaf, (classid, leaf)
        out[address] = (classid, leaves[classid]["options"]["delay"]["delay"], rate)
    return out, tables, links


def check_tree(topo, pairs, node):
    """Every destination `pairs` shapes from `node` has exactly one filter into its own class,
    whose netem has that pair's delay and whose htb rate is the pair's (or unlimited); no other."""
    by_name = {n.name: n for n in topo.nodes}
    seen, tables, links = tc_pairs(node)
    assert [t["ht_divisor"] for t in tables if t["fh"] == "4e4:"] == [256]
    assert len(links) == 1 and links[0]["link"] == "4e4:" and links[0]["hash_mask"] == "ff" \
        and links[0]["hash_off"] == 16, links
    want = {by_name[link.dst].address: link.profile for link in pairs.from_node(node.name)}
    assert set(seen) == set(want), (node.name, sorted(set(seen) ^ set(want)))
    assert len({classid for classid, _, _ in seen.values()}) == len(want)  # one class each
    for address, (classid, delay_s, rate) in seen.items():
        profile = want[address]
        assert delay_s == pytest.approx(profile.delay_us / 1e6), (node.name, address)
        assert rate == (profile.rate_bps or ch.HTB_UNLIMITED_BPS), (node.name, address, rate)


def ping(src, dst, count=5):
    out = subprocess.run(["ip", "netns", "exec", src.netns, "ping", "-n", "-q", "-c", str(count), "-i", "0.2",
                          "-W", "5", dst.address], capture_output=True, text=True, timeout=60)
    found = re.search(r"= ([0-9.]+)/([0-9.]+)/([0-9.]+)", out.stdout)
    assert found, out.stdout + out.stderr
    return float(found.group(1)), float(found.group(2))  # min, avg in ms


def apply(topo, journal, pairs, held=False):
    ex = real_executor(journal)
    ex.apply(backends.plan_pairs_apply(pairs, topo, "netem", held=ex.held() if held else None))


def read_rows(topo, journal):
    return read_emulation(topo, NetlinkQdiscs(), Iptables(), Engines(journal.dir), recorded_distributions(journal))


def test_four_nodes_two_regions_classes_filters_delays_and_changes_in_place(netem_kernel, tmp_path):
    with bed_of(4, tmp_path / "state") as (topo, journal):
        names = [n.name for n in topo.nodes]
        pairs = two_regions(names, {"delay": "2ms"}, {"delay": "25ms"}, {"rate": "100mbit"})
        apply(topo, journal, pairs)
        for node in topo.nodes:
            check_tree(topo, pairs, node)
        # netbench's own read-back: a per-destination list, in the plan's order
        rows = read_rows(topo, journal)
        n1 = rows[0]["qdisc"]
        assert rows[0]["profile"] is None and n1["netem"] is None
        assert [(p["peer"], p["netem"].delay_us, p["rate_bps"]) for p in n1["pairs"]] == [
            (f"{topo.nodes[1].address}/32", 2_000, None), (f"{topo.nodes[2].address}/32", 25_000, 100_000_000),
            (f"{topo.nodes[3].address}/32", 25_000, 100_000_000)]
        # each pair's netem limit is sized from its own rate and delay
        assert n1["pairs"][0]["netem"].limit == ch.netem_limit_packets(2_000, 0, None)
        assert n1["pairs"][1]["netem"].limit == ch.netem_limit_packets(25_000, 0, 100_000_000)
        n1_, n2, n3 = topo.nodes[0], topo.nodes[1], topo.nodes[2]
        near_min, _ = ping(n1_, n2)
        far_min, _ = ping(n1_, n3)
        assert 4.0 <= near_min < 40.0, near_min  # 2 x 2 ms one-way
        assert 50.0 <= far_min < 250.0, far_min  # 2 x 25 ms one-way

        # in place: a different topology; classes, leaves and filters no longer wanted go
        smaller = PairTopology("changed", tuple(names), (
            PairLink("n1", "n3", profile_from_mapping({"delay": "7ms"}, "t")),
            PairLink("n3", "n1", profile_from_mapping({"delay": "7ms"}, "t"))))
        before = tc_json(n1_.netns, "qdisc", "show", "dev", n1_.ifname)
        apply(topo, journal, smaller, held=True)
        check_tree(topo, smaller, n1_)
        check_tree(topo, smaller, n3)
        assert list(tc_classes(n1_)) == ["4e42:1"]
        after = tc_json(n1_.netns, "qdisc", "show", "dev", n1_.ifname)
        assert [q["handle"] for q in after if q["kind"] == "netem"] == ["4e43:"]  # kept, changed in place
        assert [q["handle"] for q in before if q["kind"] == "htb"] == [q["handle"] for q in after if q["kind"] == "htb"]
        for node in (topo.nodes[1], topo.nodes[3]):  # nothing shaped from them any more
            assert not [q for q in tc_json(node.netns, "qdisc", "show", "dev", node.ifname)
                        if q.get("handle") == "4e42:"]
        far_min, _ = ping(n1_, n3)
        assert 14.0 <= far_min < 250.0, far_min  # 7 ms each way

        # back to the full topology in place, then a one-profile peers tree over it (its chain
        # replaces the hash table; classes the filters pointed at are removable)
        apply(topo, journal, pairs, held=True)
        check_tree(topo, pairs, n1_)
        ex = real_executor(journal)
        ex.apply(backends.plan_apply(profile_from_mapping({"delay": "3ms", "peers": ["n2"]}, "t"), topo, "netem",
                                     held=ex.held()))
        assert list(tc_classes(n1_)) == ["4e42:1"]
        assert not [f for f in tc_json(n1_.netns, "filter", "show", "dev", n1_.ifname, "parent", "4e42:")
                    if f.get("options", {}).get("fh", "").startswith("4e4:")]
        assert read_rows(topo, journal)[0]["qdisc"]["peers"] == (f"{n2.address}/32",)


def test_sixty_four_nodes_every_pair_read_back_through_tc(netem_kernel, tmp_path):
    timings = {}
    started = time.monotonic()
    with bed_of(64, tmp_path / "state") as (topo, journal):
        timings["up_s"] = time.monotonic() - started
        names = [n.name for n in topo.nodes]
        pairs = two_regions(names, {"delay": "2ms"}, {"delay": "25ms"})
        assert len(pairs.links) == 64 * 63
        t0 = time.monotonic()
        apply(topo, journal, pairs)
        timings["apply_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        for node in topo.nodes:
            check_tree(topo, pairs, node)
        timings["tc_readback_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        for node in (topo.nodes[0], topo.nodes[31], topo.nodes[63]):  # netbench's decoder, a few nodes
            tree = NetlinkQdiscs().read(node.netns, node.ifname)
            want = {f"{topo.node(link.dst).address}/32": link.profile.delay_us for link in pairs.from_node(node.name)}
            assert {p["peer"]: p["netem"].delay_us for p in tree["pairs"]} == want and len(tree["pairs"]) == 63
        timings["netbench_readback_s"] = time.monotonic() - t0
        near_min, _ = ping(topo.nodes[0], topo.nodes[1])
        far_min, _ = ping(topo.nodes[0], topo.nodes[63])
        assert 4.0 <= near_min < 40.0, near_min
        assert 50.0 <= far_min < 250.0, far_min
        far_min, _ = ping(topo.nodes[40], topo.nodes[5])  # from the other region too
        assert 50.0 <= far_min < 250.0, far_min
        t0 = time.monotonic()
    timings["down_s"] = time.monotonic() - t0
    print(f"64-node per-pair timings: {json.dumps({k: round(v, 1) for k, v in timings.items()})}", file=sys.stderr)
