"""NetlinkQdiscs' sockets belong to threads: pyroute2 refuses a socket on any thread but its
maker's ("calling #use_socket from another thread"), so a sweep's schedule, changing the link
from a thread of its own, must never be handed the sweep's held sockets. No root: the sockets
are stand-ins that refuse use from another thread as pyroute2's do."""

from __future__ import annotations

import threading

import pytest

from netbench.emulation.netlink import qdisc as qdisc_module
from netbench.emulation.netlink.qdisc import NetlinkQdiscs


class ThreadBoundSocket:
    made: list["ThreadBoundSocket"] = []

    def __init__(self, netns: str) -> None:
        self.netns, self.thread, self.closed = netns, threading.get_ident(), False
        ThreadBoundSocket.made.append(self)

    def link_lookup(self, ifname: str) -> list[int]:
        if threading.get_ident() != self.thread:
            raise RuntimeError("calling #use_socket from another thread may require additional resource cleanup")
        return []  # no such interface: root_qdisc() answers None

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def sockets(monkeypatch):
    ThreadBoundSocket.made = []
    monkeypatch.setattr(qdisc_module.rtnl, "iproute_in", ThreadBoundSocket)
    return ThreadBoundSocket.made


def test_a_session_on_another_thread_uses_sockets_of_its_own_and_closes_them(sockets):
    qdiscs = NetlinkQdiscs()
    qdiscs.hold()  # a sweep's executor, on this thread
    with qdiscs.session():
        assert qdiscs.root_qdisc("ns1", "eth0") is None
    errors: list[BaseException] = []

    def change() -> None:
        try:
            with qdiscs.session():
                assert qdiscs.root_qdisc("ns1", "eth0") is None
                assert qdiscs.root_qdisc("ns1", "eth1") is None  # one socket per namespace in a session
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    thread = threading.Thread(target=change)
    thread.start()
    thread.join()
    assert errors == []
    held, theirs = sockets
    assert held.thread == threading.get_ident() and not held.closed  # held across sessions
    assert theirs.thread != held.thread and theirs.closed  # the thread's own, closed at its session's end
    with qdiscs.session():  # the held socket still serves this thread
        assert qdiscs.root_qdisc("ns1", "eth0") is None
    assert len(sockets) == 2
    qdiscs.release()
    assert held.closed
