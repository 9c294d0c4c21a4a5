"""Netlink sockets owned by threads, for the qdisc adapter (qdisc.py).

pyroute2 refuses a socket on any thread but the one that made it ("calling #use_socket from
another thread"), so sockets belong to threads: a thread that calls hold() keeps one socket
per namespace (and the roots it installed) until it calls release(); a session on another
thread opens sockets of its own and closes them at its end.
"""

from __future__ import annotations

import threading
from contextlib import closing, contextmanager, nullcontext
from typing import Any, ContextManager, Iterator

from netbench.emulation.netlink import rtnl
from netbench.emulation.netlink.batch import Installed
from netbench.errors import EmulationError


class _ThreadState(threading.local):
    """What one thread holds: its sockets (None outside a session and a hold), the peeked
    roots of its session, and, while it holds its sockets (hold()), its raw sockets for
    batched requests and the roots it installed (tbf_batch.Installed per (netns, device))."""

    def __init__(self) -> None:
        self.sockets: dict[str, Any] | None = None
        self.peeked: dict[tuple[str, str], tuple[int, Any]] = {}
        self.held = False
        self.raw: dict[str, Any] = {}  # namespace -> a bound NETLINK_ROUTE socket (rtnl.open_socket)
        self.installed: dict[tuple[str, str], Installed] = {}


class ThreadSockets:
    """The calling thread's netlink sockets, one per namespace (NetlinkQdiscs is one)."""

    def __init__(self) -> None:
        # pyroute2 refuses a socket on any thread but the one that made it, so sockets are
        # owned by threads: the held ones by the thread that called hold() (a sweep's main
        # thread, a schedule's own thread: each holds its own), a session's by its thread
        self._thread = _ThreadState()

    @property
    def _peeked(self) -> dict[tuple[str, str], tuple[int, Any]]:
        """(netns, device) -> (index, root qdisc) read by root_qdisc() in this thread's session
        and not yet changed: the foreign-qdisc check's dump serves the change that follows it."""
        return self._thread.peeked

    def _sockets(self) -> dict[str, Any] | None:
        """The calling thread's open sockets: its held ones, else its session's (None outside
        a session: each request opens and closes one)."""
        return self._thread.sockets

    @contextmanager
    def session(self) -> Iterator[None]:
        """One netlink socket per namespace for everything done inside (a whole apply), made
        and closed on the calling thread; on a thread that called hold(), its held sockets.
        What root_qdisc() read is used only within one session."""
        state = self._thread
        state.peeked = {}
        if state.sockets is not None:
            try:
                yield
            finally:
                state.peeked = {}
            return
        state.sockets = {}
        try:
            yield
        finally:
            sockets, state.sockets, state.peeked = state.sockets, None, {}
            for ipr in sockets.values():
                ipr.close()

    def hold(self) -> None:
        """Keep one socket per namespace open across sessions until release() (a sweep's or a
        schedule's many changes: opening them is most of a small change's cost), and remember
        the roots installed meanwhile (a tbf changed again is not read back first). The calling
        thread owns them; a session on another thread opens sockets of its own."""
        state = self._thread
        if not state.held:
            state.held = True
            if state.sockets is None:
                state.sockets = {}

    def release(self) -> None:
        """Close the calling thread's held sockets (the thread that called hold())."""
        state = self._thread
        if not state.held:
            return
        sockets, raw = state.sockets or {}, state.raw
        state.held, state.sockets, state.raw, state.installed, state.peeked = False, None, {}, {}, {}
        for ipr in sockets.values():
            ipr.close()
        for sock in raw.values():
            sock.close()

    @contextmanager
    def holding(self) -> Iterator[None]:
        """hold() on the calling thread for the block, then release() (a schedule's thread)."""
        if self._thread.held:
            yield
            return
        self.hold()
        try:
            yield
        finally:
            self.release()

    def _open(self, netns: str) -> ContextManager[Any]:
        """An IPRoute in `netns` (the calling thread's held or session one, or one closed after
        use); FileNotFoundError when the namespace does not exist. Never creates a namespace:
        pyroute2's NetNS would (O_CREAT), unjournaled, which no reset would ever remove."""
        sockets = self._sockets()
        if sockets is None:
            return closing(rtnl.iproute_in(netns))
        if netns not in sockets:
            sockets[netns] = rtnl.iproute_in(netns)
        return nullcontext(sockets[netns])

    def socket(self, netns: str) -> ContextManager[Any]:
        """An IPRoute in `netns` (held ones are shared: reading the testbed back and changing it
        then use one socket per namespace); FileNotFoundError when the namespace does not exist."""
        return self._open(netns)

    def _ns(self, netns: str) -> ContextManager[Any]:
        try:
            return self._open(netns)
        except FileNotFoundError:
            raise EmulationError(f"namespace {netns} does not exist",
                                 hint="is the testbed up? 'netbench testbed show'") from None

    def _forget(self, netns: str) -> None:
        """Drop what this thread read or installed in `netns` (its trees are about to change)."""
        for key in [key for key in self._peeked if key[0] == netns]:
            del self._peeked[key]
        installed = self._thread.installed
        for key in [key for key in installed if key[0] == netns]:
            del installed[key]

    def _index(self, ns: Any, netns: str, ifname: str) -> int:
        found = ns.link_lookup(ifname=ifname)
        if not found:
            raise EmulationError(f"{netns}: no interface {ifname}", hint="is the testbed up? 'netbench testbed show'")
        return found[0]

