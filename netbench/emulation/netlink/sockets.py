"""Netlink sockets owned by threads, for the qdisc adapter (qdisc.py).

pyroute2 refuses a socket on any thread but the one that made it ("calling #use_socket from
another thread"), so sockets belong to threads: a thread that calls hold() keeps one socket
per namespace until it calls release(); a session on another thread opens sockets of its own
and closes them at its end.

What netbench installed at each link's root is not a thread's: one record per link (`Roots`),
shared by every thread that changes it (a sweep's main thread and its schedule's thread both
change the same links), kept while any thread holds its sockets.
"""

from __future__ import annotations

import functools
import threading
from contextlib import closing, contextmanager, nullcontext
from typing import Any, Callable, ContextManager, Iterator, TypeVar

from netbench.emulation.netlink import rtnl
from netbench.emulation.netlink.batch import Installed
from netbench.errors import EmulationError

_T = TypeVar("_T")


class _ThreadState(threading.local):
    """What one thread holds: its sockets (None outside a session and a hold), the peeked
    roots of its session, and, while it holds its sockets (hold()), its raw sockets for
    batched requests."""

    def __init__(self) -> None:
        self.sockets: dict[str, Any] | None = None
        self.peeked: dict[tuple[str, str], tuple[int, Any]] = {}
        self.held = False
        self.raw: dict[str, Any] = {}  # namespace -> a bound NETLINK_ROUTE socket (rtnl.open_socket)


class Roots:
    """The root each link holds as netbench last installed it and the kernel acked it:
    (netns, device) -> batch.Installed, one record per link for every thread.

    A change reads the record to decide its requests (a tbf whose burst shrinks is deleted
    first) and updates it with what the kernel acked: `lock` is held across both, so a
    thread never decides from a record another thread is changing. A record is forgotten
    before its link is changed and written again only once the kernel acked the change, so
    an error of any kind leaves no record the kernel may contradict (the link is read back
    before its next change). Records are kept while a thread holds its sockets (`holders`);
    the last release forgets them all."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.links: dict[tuple[str, str], Installed] = {}
        self.holders = 0

    def get(self, key: tuple[str, str]) -> Installed | None:
        with self.lock:
            return self.links.get(key)

    def put(self, key: tuple[str, str], installed: Installed) -> None:
        """Record what the kernel acked on `key` (nothing while no thread holds its sockets)."""
        with self.lock:
            if self.holders:
                self.links[key] = installed
            else:
                self.links.pop(key, None)

    def forget(self, key: tuple[str, str]) -> None:
        with self.lock:
            self.links.pop(key, None)

    def forget_netns(self, netns: str) -> None:
        with self.lock:
            for key in [key for key in self.links if key[0] == netns]:
                del self.links[key]


def changes_roots(method: Callable[..., _T]) -> Callable[..., _T]:
    """A ThreadSockets method that changes links' roots, run holding `Roots.lock`: no other
    thread decides from, or records, a root while it changes them."""
    @functools.wraps(method)
    def locked(self, *args: Any, **kwargs: Any) -> _T:
        with self._roots.lock:
            return method(self, *args, **kwargs)

    return locked


class ThreadSockets:
    """The calling thread's netlink sockets, one per namespace (NetlinkQdiscs is one)."""

    def __init__(self) -> None:
        # pyroute2 refuses a socket on any thread but the one that made it, so sockets are
        # owned by threads: the held ones by the thread that called hold() (a sweep's main
        # thread, a schedule's own thread: each holds its own), a session's by its thread
        self._thread = _ThreadState()
        self._roots = Roots()  # shared by every thread: what each link's root is

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
            with self._roots.lock:
                self._roots.holders += 1

    def release(self) -> None:
        """Close the calling thread's held sockets (the thread that called hold())."""
        state = self._thread
        if not state.held:
            return
        sockets, raw = state.sockets or {}, state.raw
        state.held, state.sockets, state.raw, state.peeked = False, None, {}, {}
        with self._roots.lock:
            self._roots.holders -= 1
            if not self._roots.holders:
                self._roots.links.clear()
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
        """Drop what this thread read and what any thread installed in `netns` (its trees are
        about to change)."""
        for key in [key for key in self._peeked if key[0] == netns]:
            del self._peeked[key]
        self._roots.forget_netns(netns)

    def _index(self, ns: Any, netns: str, ifname: str) -> int:
        found = ns.link_lookup(ifname=ifname)
        if not found:
            raise EmulationError(f"{netns}: no interface {ifname}", hint="is the testbed up? 'netbench testbed show'")
        return found[0]

