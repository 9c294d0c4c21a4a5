"""The netem backend's per-destination plan (plan_pairs, ShapePairs) and the u32 hash-table
messages it sends (netlink/pairtree.py), encoded as the kernel would receive them."""

from __future__ import annotations

import ipaddress
import socket
import struct

import pytest
from pyroute2.netlink.rtnl import RTM_DELTFILTER, RTM_NEWTFILTER
from tests.fakes.netlink import as_dumped as parsed, make_fakes

from netbench.emulation import backends, changes as ch
from netbench.emulation.executor import Executor, read_emulation, recorded_distributions
from netbench.emulation.held import Held
from netbench.emulation.netlink import pairtree
from netbench.errors import UsageError
from netbench.model.pairs import PairLink, PairTopology
from netbench.model.profile import profile_from_mapping
from netbench.model.topology import plan_topology
from netbench.state.journal import Journal

TOPO = plan_topology(4, ipaddress.ip_network("10.213.0.0/24"))
NEAR = profile_from_mapping({"delay": "2ms"}, "test")
FAR = profile_from_mapping({"delay": "25ms", "rate": "100mbit", "loss": "0.1%"}, "test")


def address(name):
    return f"{TOPO.node(name).address}/32"


def two_regions(names=("n1", "n2", "n3", "n4")):
    links = tuple(PairLink(s, d, NEAR if (s in ("n1", "n2")) == (d in ("n1", "n2")) else FAR)
                  for s in names for d in names if s != d)
    return PairTopology("two-regions", tuple(names), links)


def shapes(plan):
    return {c.node: c for c in plan if isinstance(c, ch.ShapePairs)}


# ---------------------------------------------------------------- the plan


def test_each_node_gets_a_class_per_destination_with_its_own_netem_rate_and_limit():
    plan = backends.plan_pairs_apply(two_regions(), TOPO, "netem")
    assert [(type(c).__name__, c.node) for c in plan[5:]] == [
        (kind, node) for node in ("n1", "n2", "n3", "n4") for kind in ("ShapePairs", "ClearIngress")]
    n1 = shapes(plan)["n1"]
    assert (n1.netns, n1.dev) == ("netbench-n1", "eth0")
    assert [c.peer for c in n1.classes] == [address("n2"), address("n3"), address("n4")]
    near, far = n1.classes[0], n1.classes[1]
    assert (near.netem.delay_us, near.rate_bps, near.netem.rate_bps) == (2_000, None, None)
    assert (far.netem.delay_us, far.netem.loss, far.rate_bps, far.netem.rate_bps) == (25_000, 0.001, 100_000_000, None)
    assert near.netem.limit == ch.netem_limit_packets(2_000, 0, None)
    assert far.netem.limit == ch.netem_limit_packets(25_000, 0, 100_000_000) != near.netem.limit


def test_a_node_without_destinations_is_cleared_and_unknown_or_own_names_are_skipped():
    pairs = PairTopology("t", ("n1", "n2", "n9"), (
        PairLink("n1", "n2", NEAR), PairLink("n1", "n9", FAR), PairLink("n1", "n1", FAR), PairLink("n9", "n1", FAR)))
    plan = backends.BACKENDS["netem"].plan_pairs(pairs, TOPO, TOPO.nodes)
    assert [c.peer for c in shapes(plan)["n1"].classes] == [address("n2")]
    assert [(type(c).__name__, c.node) for c in plan if c.node != "n1"] == [
        (kind, node) for node in ("n2", "n3", "n4") for kind in ("ClearQdisc", "ClearIngress")]


def test_in_place_nothing_is_cleared_that_is_not_held():
    plan = backends.BACKENDS["netem"].plan_pairs(PairTopology("t", ("n1", "n2"), (PairLink("n1", "n2", NEAR),)),
                                                 TOPO, TOPO.nodes, held=Held(roots={("netbench-n3", "eth0"): "htb"}))
    assert [(type(c).__name__, c.node) for c in plan] == [("ShapePairs", "n1"), ("ClearQdisc", "n3")]


def test_duplicate_beside_other_destinations_is_refused_before_anything():
    dup = profile_from_mapping({"delay": "2ms", "duplicate": "1%"}, "test")
    pairs = PairTopology("t", ("n1", "n2", "n3"), (PairLink("n1", "n2", dup), PairLink("n1", "n3", NEAR)))
    with pytest.raises(UsageError, match="n1: duplicate on a pair"):
        backends.plan_pairs_apply(pairs, TOPO, "netem")
    alone = PairTopology("t", ("n1", "n2"), (PairLink("n1", "n2", dup),))
    assert shapes(backends.plan_pairs_apply(alone, TOPO, "netem"))["n1"].classes[0].netem.duplicate == 0.01


def test_describe_gives_the_tc_commands_with_the_hash_table():
    n1 = shapes(backends.plan_pairs_apply(two_regions(("n1", "n2", "n3")), TOPO, "netem"))["n1"]
    lines = n1.describe().splitlines()
    assert lines[0] == "n1: tc qdisc replace dev eth0 root handle 4e42: htb default 0"
    assert lines[1] == "n1: tc filter add dev eth0 parent 4e42: protocol ip prio 1 handle 4e4: u32 divisor 256 (if missing)"
    assert lines[2].startswith("n1: tc class replace dev eth0 parent 4e42: classid 4e42:1 htb rate ")
    assert lines[3].startswith("n1: tc qdisc replace dev eth0 parent 4e42:1 handle 4e43: netem limit ")
    assert " delay 2ms" in lines[3]
    last_byte = int(TOPO.node("n2").address.split(".")[-1])
    assert lines[4] == (f"n1: tc filter replace dev eth0 parent 4e42: protocol ip prio 1 u32 ht 4e4:{last_byte:x}: "
                        f"match ip dst {address('n2')} flowid 4e42:1")
    assert lines[2].endswith("htb rate 100gbit ceil 100gbit burst 12500000b")  # unlimited: the largest rate
    assert lines[5] == "n1: tc class replace dev eth0 parent 4e42: classid 4e42:2 htb rate 100mbit ceil 100mbit burst 12500b"
    assert "handle 4e44: netem" in lines[6] and "delay 25ms" in lines[6] and "loss random 0.1%" in lines[6]
    assert lines[-1] == ("n1: tc filter replace dev eth0 parent 4e42: protocol ip prio 1 u32 ht 800:: "
                         "match u32 0 0 hashkey mask 0x000000ff at 16 link 4e4:")
    assert len(lines) == 3 + 3 * 2


def test_too_many_destinations_are_refused():
    many = tuple(ch.PairClass(f"10.0.{i // 256}.{i % 256}/32", ch.netem_params(NEAR, False))
                 for i in range(ch.MAX_PAIR_CLASSES + 1))
    from netbench.emulation.backends.netem import _check_classes
    with pytest.raises(UsageError, match="n1: 1025 shaped destinations"):
        _check_classes("n1", "eth0", many)


# ---------------------------------------------------------------- the u32 messages


def options(msg):
    raw = next(a[1] for a in parsed(msg)["attrs"] if a[0] == "TCA_OPTIONS")
    opts = pairtree.u32_options(raw.data, offset=raw.offset)
    opts.decode()
    return opts


def test_the_table_link_and_destination_messages_carry_the_hashing_attributes():
    info = (1 << 16) | socket.htons(0x0800)
    table = pairtree.table_message(7)
    assert (table["header"]["type"], table["handle"], table["parent"], table["info"]) == (
        RTM_NEWTFILTER, 0x4E400000, 0x4E420000, info)
    assert options(table).get_attr("TCA_U32_DIVISOR") == 256

    link = options(pairtree.link_message(7))
    assert (link.get_attr("TCA_U32_HASH"), link.get_attr("TCA_U32_LINK")) == (0x80000000, 0x4E400000)
    sel = pairtree.unpack_sel(bytes(link.get_attr("TCA_U32_SEL")))
    assert (sel["hmask"], sel["hoff"], sel["keys"]) == (0xFF, 16, [(0, 0, 0)])
    raw = bytes(link.get_attr("TCA_U32_SEL"))
    assert raw[12:16] == b"\x00\x00\x00\xff"  # hmask is big-endian on the wire, as tc sends htonl(mask)

    dst = options(pairtree.dst_message(7, "10.213.0.37/32", 0x4E420005))
    assert dst.get_attr("TCA_U32_HASH") == 0x4E400000 | (37 << 12)
    assert dst.get_attr("TCA_U32_CLASSID") == 0x4E420005
    sel = pairtree.unpack_sel(bytes(dst.get_attr("TCA_U32_SEL")))
    assert sel["flags"] == pairtree.TC_U32_TERMINAL and sel["keys"] == [(0xFFFFFFFF, 0x0AD50025, 16)]
    gone = pairtree.delete_message(7, 0x4E425800)
    assert (gone["header"]["type"], parsed(gone)["handle"]) == (RTM_DELTFILTER, 0x4E425800)


def test_a_dumped_filter_decodes_to_its_destination_and_class():
    msg = pairtree.dst_message(7, "10.213.0.37/32", 0x4E420005)
    msg["handle"] = 0x4E425800
    node = pairtree.decode_u32(parsed(msg))
    assert node == pairtree.U32Node(0x4E425800, classid=0x4E420005, peer="10.213.0.37/32")
    assert (node.table, node.is_table) == (0x4E4, False)
    assert pairtree.decode_u32(parsed(pairtree.table_message(7))).divisor == 256
    assert pairtree.decode_u32(parsed(pairtree.link_message(7))).link == 0x4E400000


def kinds_of(steps):
    out = []
    for msg in steps:
        if msg["header"]["type"] == RTM_DELTFILTER:
            out.append(("del", msg["handle"]))
            continue
        opts = {a[0]: a[1] for a in msg["attrs"][1][1]["attrs"]}
        if "TCA_U32_DIVISOR" in opts:
            out.append(("table",))
        elif "TCA_U32_LINK" in opts:
            out.append(("link",))
        else:
            out.append(("dst", opts["TCA_U32_HASH"] >> 12 & 0xFF, opts["TCA_U32_CLASSID"], msg["handle"]))
    return out


def change_for(*peers):
    return ch.ShapePairs("n1", "netbench-n1", "eth0",
                         tuple(ch.PairClass(p, ch.netem_params(NEAR, False)) for p in peers))


def held_for(change):
    """What the kernel holds after `change` was sent to an empty device."""
    nodes = [pairtree.U32Node(0), pairtree.U32Node(0x80000000, divisor=1), pairtree.U32Node(0x4E400000, divisor=256),
             pairtree.U32Node(0x80000800, link=0x4E400000)]
    for i, pair in enumerate(change.classes):
        bucket = ch.pair_bucket(pair.peer)
        nodes.append(pairtree.U32Node(0x4E400000 | bucket << 12 | 0x800, classid=0x4E420001 + i, peer=pair.peer))
    return nodes


def test_filter_steps_from_nothing_make_the_table_a_filter_per_destination_then_the_link():
    change = change_for("10.213.0.2/32", "10.213.0.3/32", "10.213.1.2/32")
    assert kinds_of(pairtree.filter_steps(7, [], change)) == [
        ("table",), ("dst", 2, 0x4E420001, 0), ("dst", 3, 0x4E420002, 0), ("dst", 2, 0x4E420003, 0), ("link",)]
    assert pairtree.filter_steps(7, held_for(change), change) == []  # nothing to do twice


def test_filter_steps_in_place_repoint_keep_and_remove():
    before = change_for("10.213.0.2/32", "10.213.0.3/32", "10.213.0.4/32")
    after = change_for("10.213.0.4/32", "10.213.0.5/32")
    held = held_for(before) + [pairtree.U32Node(0x80000801, classid=0x4E420001, peer="10.9.9.9/32")]  # a peers chain
    assert kinds_of(pairtree.filter_steps(7, held, after)) == [
        ("dst", 4, 0x4E420001, 0x4E404800),  # its class changed in place (same filter handle)
        ("dst", 5, 0x4E420002, 0),  # new
        ("del", 0x4E402800), ("del", 0x4E403800), ("del", 0x80000801)]  # last: nothing points at old classes


# ---------------------------------------------------------------- executor and read-back (fakes)


def test_the_executor_shapes_pairs_journals_an_htb_root_and_reads_back_a_list(tmp_path):
    journal = Journal(tmp_path)
    qdiscs, iptables, engines, _ = make_fakes()
    ex = Executor(journal, qdiscs, iptables, engines)
    ex.apply(backends.plan_pairs_apply(two_regions(), TOPO, "netem"))
    assert qdiscs.methods().count("shape_pairs") == 4
    assert ex.held().roots[("netbench-n1", "eth0")] == "htb"
    rows = read_emulation(TOPO, qdiscs, iptables, engines, recorded_distributions(journal))
    assert rows[0]["backend"] == "netem" and rows[0]["profile"] is None
    assert [(p["peer"], p["netem"].delay_us, p["rate_bps"]) for p in rows[0]["qdisc"]["pairs"]] == [
        (address("n2"), 2_000, None), (address("n3"), 25_000, 100_000_000), (address("n4"), 25_000, 100_000_000)]
    # in place: nothing cleared before the trees are changed
    again = backends.plan_pairs_apply(two_regions(), TOPO, "netem", held=ex.held())
    assert [type(c).__name__ for c in again] == ["ShapePairs"] * 4


def test_a_foreign_root_is_refused_before_any_pair_is_shaped(tmp_path):
    qdiscs, iptables, engines, _ = make_fakes()
    qdiscs.foreign[("netbench-n2", "eth0")] = ("fq_codel", 0x10000)
    ex = Executor(Journal(tmp_path), qdiscs, iptables, engines)
    with pytest.raises(Exception, match="n2: eth0 has a root qdisc fq_codel"):
        ex.apply(backends.plan_pairs_apply(two_regions(), TOPO, "netem"))
    assert "shape_pairs" not in qdiscs.methods()


def test_sel_packing_matches_the_kernel_struct_layout():
    raw = pairtree.pack_sel([(0xFFFFFFFF, 0x0A000001, 16)], hmask=0xFF, hoff=16)
    assert len(raw) == 16 + 16
    assert struct.unpack_from("=BBB", raw) == (1, 0, 1) and struct.unpack_from("=h", raw, 10) == (16,)
    assert raw[16:24] == bytes.fromhex("ffffffff0a000001") and struct.unpack_from("=i", raw, 24) == (16,)


def test_netem_leaves_are_changed_where_they_exist_and_added_elsewhere():
    from pyroute2.netlink import NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE

    class Leaf(dict):
        def get_attr(self, name):
            return self["kind"] if name == "TCA_KIND" else None

    change = change_for("10.213.0.2/32", "10.213.0.3/32")
    leaves = [Leaf(handle=0x4E430000, parent=0x4E420001, kind="netem"), Leaf(handle=0, parent=0x4E420002, kind="pfifo")]
    first, second = pairtree.netem_messages(7, leaves, change)
    assert (first["handle"], first["parent"], second["handle"], second["parent"]) == (
        0x4E430000, 0x4E420001, 0x4E440000, 0x4E420002)
    assert first["header"]["flags"] & (NLM_F_REPLACE | NLM_F_CREATE) == NLM_F_REPLACE
    assert second["header"]["flags"] & (NLM_F_CREATE | NLM_F_EXCL) == NLM_F_CREATE | NLM_F_EXCL


def test_class_messages_carry_each_pairs_rate_and_deletes_name_the_class():
    from pyroute2.netlink.rtnl import RTM_DELTCLASS, RTM_NEWTCLASS

    change = ch.ShapePairs("n1", "netbench-n1", "eth0", (ch.pair_class(NEAR, "10.213.0.2/32"),
                                                         ch.pair_class(FAR, "10.213.0.3/32")))
    near, far = (parsed(m) for m in pairtree.class_messages(7, change))
    assert (near["header"]["type"], near["handle"], near["parent"]) == (RTM_NEWTCLASS, 0x4E420001, 0x4E420000)
    rate = {m["handle"]: m.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_PARMS")["rate"] for m in (near, far)}
    assert rate == {0x4E420001: min(ch.HTB_UNLIMITED_BPS // 8, 2**32 - 1), 0x4E420002: 100_000_000 // 8}
    gone = parsed(pairtree.class_delete_message(7, 0x4E420003))
    assert (gone["header"]["type"], gone["handle"], gone["parent"]) == (RTM_DELTCLASS, 0x4E420003, 0x4E420000)
