"""What netbench installed at each link's root is one record per link, for every thread that
changes it (emulation/netlink/sockets.py `Roots`), and a record is only ever what the kernel
acked (netlink/batch.py). No root: the namespaces' sockets are stand-ins (tests/fakes)."""

from __future__ import annotations

import errno
import struct
import threading

import pytest
from tests.fakes.netlink import FakeKernelSocket

from netbench.emulation.changes import tbf_burst_bytes, tbf_limit_bytes
from netbench.emulation.netlink import batch
from netbench.emulation.netlink import qdisc as qdisc_module
from netbench.emulation.netlink.batch import Installed, TbfLink
from netbench.emulation.netlink.qdisc import NetlinkQdiscs

HANDLE = 0x4E420000
RTM_DELQDISC, RTM_NEWQDISC = 37, 36
MBIT = 1_000_000


def link(netns: str, rate_bps: int) -> TbfLink:
    return TbfLink(netns, "eth0", rate_bps, tbf_burst_bytes(rate_bps), tbf_limit_bytes(rate_bps))


def kinds(sent: list[bytes]) -> list[int]:
    """The message types of the requests sent (RTM_DELQDISC 37, RTM_NEWQDISC 36)."""
    return [struct.unpack_from("=H", data, 4)[0] for data in sent]


class NoSocket:
    def __init__(self, netns: str) -> None:
        raise AssertionError(f"no socket may be opened (in {netns}): the root is known")


@pytest.fixture
def kernel(monkeypatch):
    """One FakeKernelSocket per namespace, made where batch opens one."""
    made: dict[str, FakeKernelSocket] = {}

    def open_socket(netns: str) -> FakeKernelSocket:
        made[netns] = FakeKernelSocket()
        return made[netns]

    monkeypatch.setattr(batch.rtnl, "open_socket", open_socket)
    monkeypatch.setattr(qdisc_module.rtnl, "iproute_in", NoSocket)
    yield made
    for sock in made.values():
        sock.close()


def errors_in_thread(work, name: str = "schedule") -> list[BaseException]:
    """Run `work` in a thread of its own (as a schedule's or a short-lived one's) and return what
    it raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()
    return errors


def in_thread(work) -> None:
    errors = errors_in_thread(work)
    assert errors == [], errors


def test_after_a_schedule_thread_ramped_a_link_the_next_point_deletes_the_larger_burst_first(kernel):
    """10 mbit on the sweep's thread, a schedule's thread ramps it to 1 gbit, then the next
    point (100 mbit) on the sweep's thread: the kernel holds 1 gbit's burst, which shrinks,
    so the tbf is deleted before it is replaced. Before, the sweep's thread decided from its
    own record (10 mbit's burst, smaller) and shrank the burst in place: the link stalls."""
    qdiscs = NetlinkQdiscs()
    qdiscs.hold()  # the sweep's executor, on this thread
    try:
        qdiscs._roots.put(("n1", "eth0"), Installed(3, tbf_burst_bytes(10 * MBIT)))  # as replace_tbf records

        def ramp() -> None:
            with qdiscs.holding():  # EmbeddedTestbed.schedule_thread
                for rate in (100 * MBIT, 1000 * MBIT):
                    qdiscs.replace_tbf_many([link("n1", rate)])

        in_thread(ramp)
        assert qdiscs._roots.get(("n1", "eth0")) == Installed(3, tbf_burst_bytes(1000 * MBIT))
        (sock,) = kernel.values()  # the schedule thread's socket, closed at its release
        assert kinds(sock.sent) == [RTM_NEWQDISC, RTM_NEWQDISC]  # growing bursts: replaced in place
        qdiscs.replace_tbf_many([link("n1", 100 * MBIT)])  # the next point, on this thread
        mine = kernel["n1"]
        assert mine is not sock and kinds(mine.sent) == [RTM_DELQDISC, RTM_NEWQDISC]
        assert qdiscs._roots.get(("n1", "eth0")) == Installed(3, tbf_burst_bytes(100 * MBIT))
    finally:
        qdiscs.release()
    assert qdiscs._roots.links == {}  # no thread holds its sockets: nothing is assumed any more


def test_a_change_by_a_thread_that_holds_nothing_is_recorded_for_the_threads_that_do(kernel, monkeypatch):
    """A session on another thread (no hold) changes a link through replace_tbf: the record
    the holding threads decide from is what that thread's change left, not older."""
    done: list[tuple] = []

    def replace_tbf(self, netns, ifname, rate_bps, burst_bytes, limit_bytes):  # the read-back path
        self._roots.forget((netns, ifname))
        done.append((netns, rate_bps))
        self._roots.put((netns, ifname), Installed(3, burst_bytes))

    monkeypatch.setattr(NetlinkQdiscs, "replace_tbf", replace_tbf)
    qdiscs = NetlinkQdiscs()
    with qdiscs.holding():
        qdiscs._roots.put(("n1", "eth0"), Installed(3, tbf_burst_bytes(10 * MBIT)))
        in_thread(lambda: qdiscs.replace_tbf_many([link("n1", 1000 * MBIT)]))  # holds nothing: read back
        assert done == [("n1", 1000 * MBIT)]
        qdiscs.replace_tbf_many([link("n1", 100 * MBIT)])
        assert kinds(kernel["n1"].sent) == [RTM_DELQDISC, RTM_NEWQDISC]


def test_threads_changing_links_at_once_keep_one_record_each_link_as_the_kernel_acked(kernel):
    qdiscs = NetlinkQdiscs()
    links = [f"n{i}" for i in range(8)]
    with qdiscs.holding():
        for netns in links:
            qdiscs._roots.put((netns, "eth0"), Installed(3, tbf_burst_bytes(10 * MBIT)))

        def changes(rates: list[int]) -> None:
            with qdiscs.holding():
                for rate in rates:
                    qdiscs.replace_tbf_many([link(netns, rate) for netns in links])

        threads = [threading.Thread(target=changes, args=([r * MBIT for r in (20, 500, 30, 900)],)),
                   threading.Thread(target=changes, args=([r * MBIT for r in (40, 700, 50, 800)],))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(not t.is_alive() for t in threads)
        final = qdiscs._roots.get(("n0", "eth0"))
        assert final is not None and final.burst_bytes in (tbf_burst_bytes(900 * MBIT), tbf_burst_bytes(800 * MBIT))
        # every link's record is the last change the kernel acked on it, one thread's or the other's
        assert {qdiscs._roots.get((netns, "eth0")) for netns in links} == {final}


# --- a read error in the middle of a batch (fault: ENOBUFS escaped before the record) ---------

def test_an_unread_answer_leaves_no_record_and_the_links_answered_keep_theirs():
    """n1's socket overran (its second answer dropped, then ENOBUFS); n2's answered. The batch
    ends without raising; n1 is Unread and forgotten (read back before its next change, as the
    kernel may well have applied it); n2 holds its new burst."""
    sockets = {"n1": FakeKernelSocket(room=1), "n2": FakeKernelSocket()}
    installed = {("n1", "eth0"): Installed(3, tbf_burst_bytes(1000 * MBIT)),
                 ("n2", "eth0"): Installed(4, tbf_burst_bytes(1000 * MBIT))}
    try:
        failed = batch.change(sockets, installed, [link("n1", 100 * MBIT), link("n2", 100 * MBIT)], HANDLE)
    finally:
        for sock in sockets.values():
            sock.close()
    assert len(sockets["n1"].sent) == 2  # delete (answered) and replace (its answer dropped)
    assert list(failed) == [("n1", "eth0")] and isinstance(failed[("n1", "eth0")], batch.Unread)
    assert failed[("n1", "eth0")].code == errno.ENOBUFS
    assert installed == {("n2", "eth0"): Installed(4, tbf_burst_bytes(100 * MBIT))}


def test_an_error_raised_while_a_batch_waits_leaves_none_of_its_links_recorded(monkeypatch):
    def interrupted(sockets, requests):
        raise KeyboardInterrupt

    monkeypatch.setattr(batch, "send_and_collect", interrupted)
    sockets = {"n1": FakeKernelSocket()}
    installed = {("n1", "eth0"): Installed(3, tbf_burst_bytes(10 * MBIT)),
                 ("n9", "eth0"): Installed(5, tbf_burst_bytes(10 * MBIT))}
    try:
        with pytest.raises(KeyboardInterrupt):
            batch.change(sockets, installed, [link("n1", 1000 * MBIT)], HANDLE)
        assert installed == {("n9", "eth0"): Installed(5, tbf_burst_bytes(10 * MBIT))}  # n1: read back next
        installed[("n1", "eth0")] = Installed(3, kind="netem")
        from netbench.emulation.changes import ShapeDevice
        from netbench.emulation.netlink.netem import NetemParams

        with pytest.raises(KeyboardInterrupt):
            batch.change_netem(sockets, installed, [ShapeDevice("n1", "n1", "eth0", NetemParams(delay_us=5))], HANDLE)
        assert ("n1", "eth0") not in installed
    finally:
        sockets["n1"].close()


def test_a_link_whose_answer_was_not_read_is_read_back_and_changed_again(kernel, monkeypatch):
    redone: list[str] = []
    monkeypatch.setattr(batch.rtnl, "open_socket", lambda netns: kernel.setdefault(
        netns, FakeKernelSocket(room=1 if netns == "n1" else None)))
    monkeypatch.setattr(NetlinkQdiscs, "replace_tbf", lambda self, netns, *args: redone.append(netns))
    qdiscs = NetlinkQdiscs()
    with qdiscs.holding():
        for netns in ("n1", "n2"):
            qdiscs._roots.put((netns, "eth0"), Installed(3, tbf_burst_bytes(1000 * MBIT)))
        qdiscs.replace_tbf_many([link("n1", 100 * MBIT), link("n2", 100 * MBIT)])  # nothing raised
        assert redone == ["n1"]


def test_a_link_whose_recorded_root_is_gone_is_read_back_and_changed_not_refused(kernel, monkeypatch):
    """Something else removed netbench's root (tc qdisc del, another tool): the batch's delete
    is refused ("Invalid handle", EINVAL) as the record no longer holds; the link is read back
    and changed one at a time instead of failing the point. A refusal of another kind stands."""
    redone: list[str] = []
    monkeypatch.setattr(batch.rtnl, "open_socket", lambda netns: kernel.setdefault(
        netns, FakeKernelSocket(refuse={3: errno.EINVAL} if netns == "n1" else {4: errno.ENODEV})))
    monkeypatch.setattr(NetlinkQdiscs, "replace_tbf", lambda self, netns, *args: redone.append(netns))
    qdiscs = NetlinkQdiscs()
    with qdiscs.holding():
        qdiscs._roots.put(("n1", "eth0"), Installed(3, tbf_burst_bytes(1000 * MBIT)))
        qdiscs._roots.put(("n2", "eth0"), Installed(4, tbf_burst_bytes(1000 * MBIT)))
        with pytest.raises(qdisc_module.EmulationError, match=r"1 of 2 links refused their tbf change: n2"):
            qdiscs.replace_tbf_many([link("n1", 100 * MBIT), link("n2", 100 * MBIT)])
        assert redone == ["n1"]
