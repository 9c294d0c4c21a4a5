"""A change's tbf on every link at once (emulation/netlink/batch.py) and what decides it:
the requests, their bytes, the acks; the executor's batches; the roots a thread installed;
the engines' client sockets. No root: sockets are stand-ins."""

from __future__ import annotations

import errno
import ipaddress
import struct
import threading

import pytest
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.tcmsg import tcmsg
from tests.fakes.netlink import FakeKernelSocket, ack, make_fakes

from netbench.emulation import backends
from netbench.emulation import engine_control as ec
from netbench.emulation.changes import tbf_burst_bytes, tbf_limit_bytes
from netbench.emulation.executor import Executor
from netbench.emulation.netlink import qdisc as qdisc_module
from netbench.emulation.netlink import rtnl, batch
from netbench.emulation.netlink.qdisc import NetlinkQdiscs
from netbench.emulation.netlink.qdisc_read import decode_qdisc
from netbench.emulation.netlink.batch import Installed, TbfLink
from netbench.errors import EmulationError
from netbench.model.profile import Profile
from netbench.model.topology import plan_topology
from netbench.state.journal import Journal

HANDLE = 0x4E420000


def link(netns: str, rate_bps: int) -> TbfLink:
    return TbfLink(netns, "eth0", rate_bps, tbf_burst_bytes(rate_bps), tbf_limit_bytes(rate_bps))


def test_a_shrinking_burst_deletes_first_a_growing_or_equal_one_is_replaced_in_place():
    held = Installed(index=3, burst_bytes=tbf_burst_bytes(500_000_000))
    assert batch.steps(link("n1", 100_000_000), held) == ("del", "replace")
    assert batch.steps(link("n1", 500_000_000), held) == ("replace",)
    assert batch.steps(link("n1", 1_000_000_000), held) == ("replace",)


def test_one_template_per_rate_carries_each_links_index_and_sequence_number():
    template = batch.tbf_template(HANDLE, 100_000_000, tbf_burst_bytes(100_000_000), tbf_limit_bytes(100_000_000))
    data = batch.with_index(template, 7, 4242)
    assert len(data) == len(template) and data != template
    msg = tcmsg(data)
    msg.decode()  # what the kernel reads: netbench's root tbf at the rate asked, on interface 7
    assert (msg["index"], msg["handle"], msg["parent"], msg["header"]["sequence_number"]) == (7, HANDLE,
                                                                                             0xFFFFFFFF, 4242)
    assert decode_qdisc(msg) == {"kind": "tbf", "rate_bps": 100_000_000, "limit_bytes": tbf_limit_bytes(100_000_000)}
    other = batch.with_index(template, 9, 4243)
    assert other[:8] == data[:8] and other[24:] == data[24:]  # only the sequence number and index differ
    delete = tcmsg(batch.with_index(batch.delete_template(HANDLE), 7, 1))
    delete.decode()
    assert (delete["index"], delete["handle"], delete.get_attr("TCA_KIND")) == (7, HANDLE, None)


def test_requests_in_link_order_each_sequence_number_owned_by_its_link():
    links = [link("n1", 100_000_000), link("n2", 200_000_000)]
    installed = {("n1", "eth0"): Installed(3, tbf_burst_bytes(500_000_000)),
                 ("n2", "eth0"): Installed(4, tbf_burst_bytes(100_000_000))}
    out, owner = batch.requests(links, installed, HANDLE)
    assert [netns for netns, _, _ in out] == ["n1", "n1", "n2"]  # n1's burst shrinks: its delete first
    seqs = [seq for _, seq, _ in out]
    assert len(set(seqs)) == 3 and seqs == sorted(seqs)
    assert [owner[seq] for seq in seqs] == [("n1", "eth0"), ("n1", "eth0"), ("n2", "eth0")]
    kinds = []
    for _, seq, data in out:
        msg = tcmsg(data)
        msg.decode()
        kinds.append((msg["header"]["type"], msg["index"], msg["header"]["sequence_number"] == seq))
    assert kinds == [(37, 3, True), (36, 3, True), (36, 4, True)]  # RTM_DELQDISC, RTM_NEWQDISC


def test_acks_are_read_per_sequence_number_with_the_kernels_refusal():
    acks = batch.parse_acks(ack(5) + ack(6, -errno.ENODEV) + rtnl._HDR.pack(16, 3, 0, 7, 0))
    assert [seq for seq, _ in acks] == [5, 6]  # NLMSG_DONE (3) is not an ack
    assert acks[0][1] is None and acks[1][1].code == errno.ENODEV


def test_every_request_goes_out_and_every_refusal_comes_back_by_link():
    sockets = {"n1": FakeKernelSocket(), "n2": FakeKernelSocket(refuse={4: errno.ENODEV})}
    installed = {("n1", "eth0"): Installed(3, tbf_burst_bytes(500_000_000)),
                 ("n2", "eth0"): Installed(4, tbf_burst_bytes(500_000_000))}
    try:
        failed = batch.change(sockets, installed, [link("n1", 100_000_000), link("n2", 100_000_000)], HANDLE)
    finally:
        for sock in sockets.values():
            sock.close()
    assert len(sockets["n1"].sent) == len(sockets["n2"].sent) == 2  # delete + replace on each
    assert list(failed) == [("n2", "eth0")] and failed[("n2", "eth0")].code == errno.ENODEV
    # the applied link holds its new burst; the refused one is read back before its next change
    assert installed == {("n1", "eth0"): Installed(3, tbf_burst_bytes(100_000_000))}


# --- NetlinkQdiscs: the roots a holding thread installed --------------------------------------

class NoSocket:
    def __init__(self, netns: str) -> None:
        raise AssertionError(f"no socket may be opened (in {netns}): the root is known")


def test_a_holding_thread_neither_reads_back_nor_checks_a_root_it_installed(monkeypatch):
    monkeypatch.setattr(qdisc_module.rtnl, "iproute_in", NoSocket)
    sent: list[tuple] = []

    def change(sockets, installed, links, handle):
        sent.append(tuple(links))
        return {("n2", "eth0"): OSError(errno.ENODEV, "No such device")} if len(sent) == 2 else {}

    monkeypatch.setattr(qdisc_module.batch, "change", change)
    qdiscs = NetlinkQdiscs()
    links = [link("n1", 100_000_000), link("n2", 100_000_000)]
    with qdiscs.holding():
        for key in [("n1", "eth0"), ("n2", "eth0")]:
            qdiscs._roots.links[key] = Installed(3, tbf_burst_bytes(500_000_000))
        assert qdiscs.root_qdisc("n1", "eth0") == ("tbf", HANDLE)  # the foreign-qdisc check, not read
        qdiscs.replace_tbf_many(links)
        with pytest.raises(EmulationError, match=r"1 of 2 links refused their tbf change: n2: tbf on eth0: "
                                                 r"No such device"):
            qdiscs.replace_tbf_many(links)
        assert sent == [tuple(links), tuple(links)]
        other: list[dict] = []
        thread = threading.Thread(target=lambda: other.append(dict(qdiscs._roots.links)))
        thread.start()
        thread.join()
        assert list(other[0]) == [("n1", "eth0"), ("n2", "eth0")]  # one record per link, for every thread
    assert qdiscs._roots.links == {} and not qdiscs._thread.held  # the last hold released: forgotten


# --- the executor sends a change's tbfs as one batch -----------------------------------------

def test_the_executor_sends_a_changes_tbfs_as_one_batch_and_journals_each_root_once(tmp_path):
    topo = plan_topology(3, ipaddress.ip_network("10.213.0.0/24"))
    qdiscs, iptables, engines, _ = make_fakes()
    ex = Executor(journal=Journal(tmp_path / "state"), qdiscs=qdiscs, iptables=iptables, engines=engines)
    for rate in (500_000_000, 100_000_000, 200_000_000):
        ex.apply(backends.plan_apply(Profile(name="r", delay_us=5_000, rate_bps=rate), topo, "userspace",
                                     held=ex.held()))
    assert qdiscs.batches == [3, 3, 3]
    assert [qdiscs.read(node.netns, node.ifname)["rate_bps"] for node in topo.nodes] == [200_000_000] * 3
    roots = [e for e in ex.journal.pending() if e.kind == "qdisc"]
    assert sorted(e.data["netns"] for e in roots) == sorted(node.netns for node in topo.nodes)


# --- the engines' client sockets -------------------------------------------------------------

def test_requests_are_dealt_over_as_few_client_sockets_as_keep_them_all_in_flight():
    assert ec.spread(0) == [[]]
    assert ec.spread(5) == [[0, 1, 2, 3, 4]]
    assert ec.spread(9) == [[0, 2, 4, 6, 8], [1, 3, 5, 7]]
    spread = ec.spread(64)
    assert len(spread) == 8 and all(len(part) == 8 for part in spread)
    assert sorted(i for part in spread for i in part) == list(range(64))
    assert len(ec.spread(100)) == ec.MAX_CLIENTS  # beyond 64: each socket sends its share in turns


# --- the netem backend: netem roots changed in one batch ---------------------------------------

def test_a_batched_netem_change_sends_the_bytes_the_one_at_a_time_path_sends(monkeypatch):
    from netbench.emulation.netlink.netem import NetemParams

    params = NetemParams(delay_us=25_000, jitter_us=1_000, loss=0.01, rate_bps=100_000_000)
    sent = []
    monkeypatch.setattr(qdisc_module.rtnl, "request", lambda netns, msg, seq=1: sent.append(msg))
    qdisc_module._send_netem("n1", "change", 7, HANDLE, 0xFFFFFFFF, params)
    (msg,) = sent
    msg["header"]["sequence_number"] = 77
    msg.encode()
    assert batch.with_index(batch.netem_template(HANDLE, params), 7, 77) == bytes(msg.data)


def test_netem_roots_this_thread_installed_are_changed_in_one_batch_and_a_vanished_one_made_again(monkeypatch):
    from netbench.emulation.changes import ShapeDevice
    from netbench.emulation.netlink.netem import NetemParams

    monkeypatch.setattr(qdisc_module.rtnl, "iproute_in", NoSocket)
    changes = [ShapeDevice(f"n{i}", f"ns{i}", "eth0", NetemParams(delay_us=25_000)) for i in (1, 2, 3)]
    batched, shaped = [], []
    answers = iter([{("ns2", "eth0"): NetlinkError(errno.ENOENT, "gone")},
                    {("ns3", "eth0"): NetlinkError(errno.EPERM, "Operation not permitted")}])

    def change_netem(sockets, installed, known, handle):
        batched.append([c.netns for c in known])
        failed = next(answers)
        for key in failed:
            del installed[key]
        return failed

    monkeypatch.setattr(qdisc_module.batch, "change_netem", change_netem)
    qdiscs = NetlinkQdiscs()
    monkeypatch.setattr(qdiscs, "shape", lambda change: shaped.append(change.netns))
    with qdiscs.holding():
        for netns in ("ns1", "ns2", "ns3"):
            qdiscs._roots.links[(netns, "eth0")] = Installed(3, kind="netem")
        qdiscs._roots.links[("ns1", "eth0")] = Installed(3, kind="tbf")  # another kind: shape()'s path
        assert qdiscs.root_qdisc("ns1", "eth0") == ("tbf", HANDLE) and qdiscs.root_qdisc("ns2", "eth0") == ("netem",
                                                                                                            HANDLE)
        qdiscs.shape_many(changes)
        assert batched == [["ns2", "ns3"]] and shaped == ["ns1", "ns2"]  # ENOENT: made again, whole
        qdiscs._roots.links[("ns2", "eth0")] = Installed(3, kind="netem")
        with pytest.raises(EmulationError, match=r"1 of 3 links refused their netem change: ns3: netem on eth0: "
                                                 r"Operation not permitted"):
            qdiscs.shape_many(changes)


def test_the_netem_backends_changes_go_as_one_batch_of_roots(tmp_path):
    topo = plan_topology(3, ipaddress.ip_network("10.213.0.0/24"))
    qdiscs, iptables, engines, _ = make_fakes()
    ex = Executor(journal=Journal(tmp_path / "state"), qdiscs=qdiscs, iptables=iptables, engines=engines)
    for delay in (5_000, 25_000):
        ex.apply(backends.plan_apply(Profile(name="d", delay_us=delay, rate_bps=100_000_000), topo, "netem",
                                     held=ex.held()))
    assert qdiscs.batches == [3, 3]
    roots = [e for e in ex.journal.pending() if e.kind == "qdisc"]
    assert sorted(e.data["qdisc_kind"] for e in roots) == ["netem"] * 3
