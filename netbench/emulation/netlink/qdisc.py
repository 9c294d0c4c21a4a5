"""netbench's qdisc trees through pyroute2 (netlink, not `tc`): encode and decode together.

NetlinkQdiscs writes and reads the trees the executor plans (tbf, netem, htb with u32 peer
filters, ingress redirects to an ifb); decode_tree turns a dump back into canonical units
for read-back. QdiscAdapter is the seam; tests/fakes.py has the in-memory fake.
"""

from __future__ import annotations

import errno
import ipaddress
from typing import Any, Protocol

from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_NEWQDISC

from netbench.emulation.changes import (CHILD_MAJOR, HANDLE_MAJOR, HTB_UNLIMITED_BPS, QDISC_HANDLE, ShapeDevice,
                                        ShapePairs, htb_burst_bytes, htb_quantum, tbf_burst_bytes)
from netbench.emulation.netlink import netem, pairtree, rtnl
from netbench.emulation.netlink.netem import NetemParams
from netbench.emulation.netlink.qdisc_read import decode_qdisc, decode_tree
from netbench.emulation.netlink import batch
from netbench.emulation.netlink.batch import Installed, TbfLink
from netbench.emulation.netlink.sockets import ThreadSockets, changes_roots
from netbench.errors import EmulationError, PrivilegeError

ETH_P_IP = 0x0800
ETH_P_ALL = 0x0003
_HANDLE_INT = int(QDISC_HANDLE.rstrip(":"), 16) << 16


def _nl_error(action: str, exc: NetlinkError) -> EmulationError:
    if exc.code == errno.EPERM:
        return PrivilegeError(f"{action}: permission denied", hint="run netbench as root")
    if exc.code in (errno.ENOENT, errno.EOPNOTSUPP):
        return EmulationError(f"{action}: the kernel does not support this qdisc",
                              hint="run 'netbench show --backend userspace' or use --backend userspace")
    return EmulationError(f"{action}: {exc.args[1] if len(exc.args) > 1 else exc}")


class QdiscAdapter(Protocol):
    def replace_tbf(self, netns: str, ifname: str, rate_bps: int, burst_bytes: int, limit_bytes: int) -> None: ...
    def shape(self, change: ShapeDevice) -> None: ...
    def shape_pairs(self, change: ShapePairs) -> None: ...
    def set_ingress(self, netns: str, dev: str, ifb: str) -> None: ...
    def clear_ingress(self, netns: str, dev: str, ifb: str) -> bool: ...
    def clear(self, netns: str, ifname: str) -> bool: ...
    def read(self, netns: str, ifname: str, distribution: str = "uniform") -> dict[str, Any] | None: ...
    def root_qdisc(self, netns: str, ifname: str) -> tuple[str, int] | None: ...
    def ingress_qdisc(self, netns: str, dev: str) -> str | None: ...


def _handle(major: int, minor: int = 0) -> int:
    return (major << 16) | minor


ROOT_PARENT = 0xFFFFFFFF
INGRESS_HANDLE = 0xFFFF0000
INGRESS_PARENT = 0xFFFFFFF1  # TC_H_INGRESS: where ingress and clsact qdiscs sit
FILTER_PRIO = 1


def _htb_default(qdisc: Any) -> int | None:
    """The default class of a dumped htb qdisc (None if the dump has no TCA_HTB_INIT)."""
    options = qdisc.get_attr("TCA_OPTIONS")
    init = options.get_attr("TCA_HTB_INIT") if options is not None else None
    return None if init is None else init["defcls"]


def _send_netem(netns: str, command: str, index: int, handle: int, parent: int, params: NetemParams) -> None:
    """RTM_NEWQDISC for netem with netbench's full options (see netem.py): pyroute2's own
    netem plugin has no distribution table, loss model or 64-bit fields. Sent by rtnl.py."""
    flags = {"add": NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
             "change": NLM_F_REQUEST | NLM_F_ACK | NLM_F_REPLACE}[command]
    msg = netem.netem_tcmsg()
    msg["family"], msg["index"], msg["handle"], msg["parent"] = 0, index, handle, parent
    msg["attrs"] = [["TCA_KIND", "netem"], ["TCA_OPTIONS", netem.options(params)]]
    msg["header"]["type"], msg["header"]["flags"] = RTM_NEWQDISC, flags
    rtnl.request(netns, msg)


class NetlinkQdiscs(ThreadSockets):
    """netbench's qdisc trees on a node's interfaces, through pyroute2 (netlink, not `tc`).

    Idempotent: everything lives under netbench-owned handles (4e42: at the root, 4e43:+
    below it); a tree of the same shape is changed in place (netem `change` keeps the
    queue), a different shape replaces only the netbench-owned root.
    """

    @changes_roots
    def replace_tbf(self, netns, ifname, rate_bps, burst_bytes, limit_bytes):
        self._roots.forget((netns, ifname))  # until the kernel acks the change below
        with self._ns(netns) as ns:
            peeked = self._peeked.pop((netns, ifname), None)
            index = peeked[0] if peeked else self._index(ns, netns, ifname)
            try:
                root = peeked[1] if peeked else self._root(ns, index)
                if self._drop_root_unless(ns, index, "tbf", root) and _tbf_burst(root) > burst_bytes:
                    # tbf keeps its queue when changed, and a packet queued under a larger burst
                    # than the new one (a 64 KB GSO segment under 1gbit's, then 100mbit's
                    # 12.5 KB) never gathers the tokens to leave: the link stalls for good. A
                    # smaller burst gets a new tbf (the queue is dropped, as a fall in rate
                    # would drop much of it anyway; the link is unshaped between the two
                    # messages, tens of microseconds)
                    ns.tc("del", index=index, handle=QDISC_HANDLE, root=True)
                # pyroute2 takes an integer rate in bytes/s; burst and limit in bytes
                ns.tc("replace", "tbf", index, handle=QDISC_HANDLE, rate=rate_bps // 8,
                      burst=burst_bytes, limit=limit_bytes)
            except NetlinkError as exc:
                raise _nl_error(f"{netns}: tbf on {ifname}", exc) from None
            self._roots.put((netns, ifname), Installed(index, burst_bytes))

    def replace_tbf_many(self, links: list[TbfLink]) -> None:
        """replace_tbf on every link of `links`; while this thread holds its sockets, the
        requests of the links whose root netbench installed (by any thread: `Roots`) all sent
        before any ack is read (batch); any other link as replace_tbf, as is one whose answer
        could not be read (batch.Unread) or whose root is not the one recorded (ENOENT, or
        EINVAL "Invalid handle": something else removed it): read back, then changed. Every
        link is tried; EmulationError names each one refused (the others hold their new tbf)."""
        with self._roots.lock:
            state, roots = self._thread, self._roots.links
            known = [link for link in links
                     if state.held and getattr(roots.get((link.netns, link.ifname)), "kind", "") == "tbf"]
            for link in [link for link in links if link not in known]:  # read first, then known
                self.replace_tbf(link.netns, link.ifname, link.rate_bps, link.burst_bytes, link.limit_bytes)
            if not known:
                return
            try:
                failed = batch.change(state.raw, roots, known, _HANDLE_INT)
            except FileNotFoundError as exc:
                raise EmulationError(f"namespace {exc.filename} does not exist",
                                     hint="is the testbed up? 'netbench testbed show'") from None
            for link in [link for link in known if _read_back(failed.get((link.netns, link.ifname)))]:
                del failed[(link.netns, link.ifname)]
                self.replace_tbf(link.netns, link.ifname, link.rate_bps, link.burst_bytes, link.limit_bytes)
            if failed:
                _refused(failed, len(links), "tbf")

    @staticmethod
    def _root(ns: Any, index: int) -> Any | None:
        for qdisc in list(ns.get_qdiscs(index=index)):
            if qdisc["parent"] == ROOT_PARENT:
                return qdisc
        return None

    def _drop_root_unless(self, ns: Any, index: int, kind: str, root: Any = False) -> bool:
        """Delete the netbench-owned root if it is of another kind; True if one of `kind` stays.
        `root`: the root as just read (None: there is none), else it is read now."""
        root = self._root(ns, index) if root is False else root
        if root is None or root["handle"] != _HANDLE_INT:
            return False
        if root.get_attr("TCA_KIND") == kind:
            return True
        ns.tc("del", index=index, handle=QDISC_HANDLE, root=True)
        return False

    @changes_roots
    def shape(self, change: ShapeDevice) -> None:
        netns, dev = change.netns, change.dev
        self._forget(netns)
        try:
            with self._ns(netns) as ns:
                index = self._index(ns, netns, dev)
            if change.uses_htb:
                self._shape_htb(netns, index, change)
            else:
                self._put_netem(netns, index, _HANDLE_INT, ROOT_PARENT, change.netem, "netem")
                self._roots.put((netns, dev), Installed(index, kind="netem"))
        except NetlinkError as exc:
            raise _nl_error(f"{netns}: netem on {dev}", exc) from None

    def shape_many(self, changes: list[ShapeDevice]) -> None:
        """shape() of every change; a netem root netbench installed (by any thread: `Roots`) is
        `change`d, while this thread holds its sockets, with the others' requests all sent
        before any ack is read (batch); one the kernel no longer has (ENOENT, EINVAL), or whose
        answer could not be read (batch.Unread), gets shape()'s whole path. EmulationError
        names each device refused (the others hold their new netem)."""
        with self._roots.lock:
            installed = self._roots.links
            known = [c for c in changes if self._thread.held and not c.uses_htb
                     and getattr(installed.get((c.netns, c.dev)), "kind", "") == "netem"]
            for change in [c for c in changes if c not in known]:
                self.shape(change)
            try:
                failed = batch.change_netem(self._thread.raw, installed, known, _HANDLE_INT) if known else {}
            except FileNotFoundError as exc:
                raise EmulationError(f"namespace {exc.filename} does not exist",
                                     hint="is the testbed up? 'netbench testbed show'") from None
            for change in [c for c in known if failed.get((c.netns, c.dev)) is not None
                           and (isinstance(failed[(c.netns, c.dev)], batch.Unread)
                                or failed[(c.netns, c.dev)].code in (errno.ENOENT, errno.EINVAL))]:
                del failed[(change.netns, change.dev)]
                self.shape(change)
            if failed:
                _refused(failed, len(changes), "netem")

    def _put_netem(self, netns: str, index: int, handle: int, parent: int, params: NetemParams, root_kind: str) -> None:
        """`change` the netem at `handle` in place (the queue is kept); if there is none, `add`
        it; if the root is netbench's but of another shape, replace that root.

        The kernel's answer says which case holds, so no dump is needed unless a root of
        another kind is in the way.
        """
        try:
            _send_netem(netns, "change", index, handle, parent, params)
            return
        except NetlinkError as exc:
            if exc.code not in (errno.ENOENT, errno.EINVAL):
                raise
        try:
            _send_netem(netns, "add", index, handle, parent, params)
            return
        except NetlinkError as exc:
            if exc.code not in (errno.EEXIST, errno.EINVAL) or parent != ROOT_PARENT:
                raise
        with self._ns(netns) as ns:  # a netbench root of another kind (tbf, htb) is in the way
            self._drop_root_unless(ns, index, root_kind)
        _send_netem(netns, "add", index, handle, parent, params)

    @staticmethod
    def _htb_root(ns: Any, index: int, default: int) -> None:
        """An htb root of netbench's with default class `default`: kept if there is one (htb has
        no qdisc `change`), any other netbench root replaced."""
        root = NetlinkQdiscs._root(ns, index)
        owned = root is not None and root["handle"] == _HANDLE_INT
        if not (owned and root.get_attr("TCA_KIND") == "htb" and _htb_default(root) == default):
            if owned:
                ns.tc("del", index=index, handle=QDISC_HANDLE, root=True)
            ns.tc("replace", "htb", index, handle=_HANDLE_INT, root=True, default=default)

    @staticmethod
    def _htb_class(ns: Any, index: int, minor: int, rate_bps: int) -> None:
        ns.tc("replace-class", "htb", index, handle=_handle(HANDLE_MAJOR, minor), parent=_HANDLE_INT,
              rate=rate_bps // 8, ceil=rate_bps // 8, burst=htb_burst_bytes(rate_bps),
              cburst=htb_burst_bytes(rate_bps), quantum=htb_quantum(rate_bps))

    def _drop_classes_above(self, netns: str, index: int, count: int) -> None:
        """Remove netbench's classes past `count` (of a wider tree before; their netem goes with
        them). After the filters: the kernel refuses to delete a class a filter points at."""
        with self._ns(netns) as ns:
            stale = [c["handle"] for c in ns.get_classes(index=index)
                     if c["handle"] >> 16 == HANDLE_MAJOR and (c["handle"] & 0xFFFF) > count]
        pairtree.send_all(netns, [pairtree.class_delete_message(index, handle) for handle in stale])

    def _shape_htb(self, netns: str, index: int, change: ShapeDevice) -> None:
        rate_bps = change.htb_rate_bps or HTB_UNLIMITED_BPS
        with self._ns(netns) as ns:
            self._htb_root(ns, index, 0 if change.peers else 1)  # 0: unclaimed traffic leaves unshaped
            for i in range(change.class_count()):
                self._htb_class(ns, index, i + 1, rate_bps)
            self._replace_filters(ns, index, change)
        self._drop_classes_above(netns, index, change.class_count())
        for i in range(change.class_count()):
            self._put_netem(netns, index, _handle(CHILD_MAJOR + i), _handle(HANDLE_MAJOR, i + 1), change.netem, "htb")

    @changes_roots
    def shape_pairs(self, change: ShapePairs) -> None:
        """The per-destination tree (pairtree.py) in place: the htb root kept, a class and its
        netem leaf per destination replaced or `change`d (queues kept), the hash-table filters
        brought to the wanted set, then classes no destination needs any more removed. Classes,
        leaves and filters go pipelined on one socket (63 destinations: ~190 requests)."""
        netns, dev = change.netns, change.dev
        self._forget(netns)
        try:
            with self._ns(netns) as ns:
                index = self._index(ns, netns, dev)
                self._htb_root(ns, index, 0)
            pairtree.send_all(netns, pairtree.class_messages(index, change))
            with self._ns(netns) as ns:
                leaves = list(ns.get_qdiscs(index=index))
                held = [n for n in (pairtree.decode_u32(f) for f in ns.get_filters(index=index, parent=_HANDLE_INT))
                        if n is not None]
            pairtree.send_all(netns, pairtree.netem_messages(index, leaves, change)
                              + pairtree.filter_steps(index, held, change))
            self._drop_classes_above(netns, index, len(change.classes))
        except NetlinkError as exc:
            raise _nl_error(f"{netns}: per-destination tree on {dev}", exc) from None

    @staticmethod
    def _replace_filters(ns: Any, index: int, change: ShapeDevice) -> None:
        try:
            ns.tc("del-filter", index=index, parent=_HANDLE_INT, prio=FILTER_PRIO, protocol=ETH_P_IP)
        except NetlinkError as exc:
            if exc.code not in (errno.ENOENT, errno.EINVAL):
                raise
        offset = 16 if change.match == "dst" else 12  # IPv4 header: source at 12, destination at 16
        for i, cidr in enumerate(change.peers):
            network = ipaddress.IPv4Network(cidr)
            key = f"0x{int(network.network_address):08x}/0x{int(network.netmask):08x}+{offset}"
            ns.tc("add-filter", "u32", index, parent=_HANDLE_INT, prio=FILTER_PRIO, protocol=ETH_P_IP,
                  target=_handle(HANDLE_MAJOR, i + 1), keys=[key])

    @changes_roots
    def set_ingress(self, netns: str, dev: str, ifb: str) -> None:
        self._forget(netns)
        with self._ns(netns) as ns:
            try:
                if not ns.link_lookup(ifname=ifb):
                    ns.link("add", ifname=ifb, kind="ifb")
                ifb_index = self._index(ns, netns, ifb)
                ns.link("set", index=ifb_index, state="up")
                index = self._index(ns, netns, dev)
                if not any(q["handle"] == INGRESS_HANDLE for q in list(ns.get_qdiscs(index=index))):
                    ns.tc("add", "ingress", index, handle=INGRESS_HANDLE)
                try:
                    ns.tc("del-filter", index=index, parent=INGRESS_HANDLE, prio=FILTER_PRIO, protocol=ETH_P_ALL)
                except NetlinkError as exc:
                    if exc.code not in (errno.ENOENT, errno.EINVAL):
                        raise
                ns.tc("add-filter", "u32", index, parent=INGRESS_HANDLE, prio=FILTER_PRIO, protocol=ETH_P_ALL,
                      keys=["0x0/0x0+0"], target=_handle(1, 1),
                      action={"kind": "mirred", "direction": "egress", "action": "redirect", "ifindex": ifb_index})
            except NetlinkError as exc:
                raise _nl_error(f"{netns}: ingress redirect from {dev} to {ifb}", exc) from None

    @changes_roots
    def clear_ingress(self, netns: str, dev: str, ifb: str) -> bool:
        """Remove the ingress redirect and the ifb device if netbench made them (the ifb's name
        says so); a missing one is not an error."""
        self._forget(netns)
        try:
            with self._open(netns) as ns:
                found_ifb = ns.link_lookup(ifname=ifb)
                if not found_ifb:
                    return False
                found = ns.link_lookup(ifname=dev)
                if found and any(q["handle"] == INGRESS_HANDLE for q in list(ns.get_qdiscs(index=found[0]))):
                    ns.tc("del", "ingress", found[0], handle=INGRESS_HANDLE)
                ns.link("del", index=found_ifb[0])
                return True
        except FileNotFoundError:
            return False
        except NetlinkError as exc:
            if exc.code in (errno.ENOENT, errno.EINVAL, errno.ENODEV):
                return False
            raise _nl_error(f"{netns}: removing ingress redirect on {dev}", exc) from None

    @changes_roots
    def clear(self, netns, ifname):
        """Delete the root qdisc if netbench owns it; a missing one is not an error."""
        self._forget(netns)
        try:
            with self._open(netns) as ns:
                found = ns.link_lookup(ifname=ifname)
                if not found:
                    return False
                root = self._root(ns, found[0])
                if root is not None and root["handle"] == _HANDLE_INT:
                    ns.tc("del", index=found[0], handle=QDISC_HANDLE, root=True)
                    return True
        except FileNotFoundError:
            return False
        except NetlinkError as exc:
            if exc.code in (errno.ENOENT, errno.EINVAL):
                return False
            raise _nl_error(f"{netns}: removing qdisc on {ifname}", exc) from None
        return False

    def root_qdisc(self, netns: str, ifname: str) -> tuple[str, int] | None:
        """(kind, handle) of the root qdisc on `ifname`; handle 0 is the kernel's default.
        None when there is none, or no such interface or namespace (yet)."""
        installed = self._roots.get((netns, ifname)) if self._thread.held else None
        if installed is not None:  # netbench installed it (on any thread); this one holds its sockets
            return installed.kind, _HANDLE_INT
        try:
            with self._open(netns) as ns:
                found = ns.link_lookup(ifname=ifname)
                root = self._root(ns, found[0]) if found else None
                if found and self._sockets() is not None:
                    self._peeked[(netns, ifname)] = (found[0], root)
        except FileNotFoundError:
            return None
        except NetlinkError as exc:
            raise _nl_error(f"{netns}: reading the qdiscs of {ifname}", exc) from None
        return None if root is None else (root.get_attr("TCA_KIND"), root["handle"])

    def ingress_qdisc(self, netns: str, dev: str) -> str | None:
        """The kind of the qdisc at `dev`'s ingress hook (ingress or clsact), or None."""
        try:
            with self._open(netns) as ns:
                found = ns.link_lookup(ifname=dev)
                qdiscs = list(ns.get_qdiscs(index=found[0])) if found else []
        except FileNotFoundError:
            return None
        except NetlinkError as exc:
            raise _nl_error(f"{netns}: reading the qdiscs of {dev}", exc) from None
        return next((q.get_attr("TCA_KIND") for q in qdiscs
                     if q["parent"] == INGRESS_PARENT or q["handle"] == INGRESS_HANDLE), None)

    def read(self, netns, ifname, distribution="uniform"):
        """The netbench-owned tree on `ifname` in canonical units, or None (see decode_tree)."""
        with self._ns(netns) as ns:
            found = ns.link_lookup(ifname=ifname)
            if not found:
                return None
            qdiscs = list(ns.get_qdiscs(index=found[0]))
            root = next((q for q in qdiscs if q["parent"] == ROOT_PARENT and q["handle"] == _HANDLE_INT), None)
            if root is None:
                return None
            classes = list(ns.get_classes(index=found[0])) if root.get_attr("TCA_KIND") == "htb" else []
            filters = list(ns.get_filters(index=found[0], parent=_HANDLE_INT)) if classes else []
            return decode_tree(root, qdiscs, classes, filters, distribution)


def _read_back(error: Exception | None) -> bool:
    """Whether a batched link's refusal says to read it back and change it one at a time: its
    answer was not read, or its root is not the one recorded (gone, or another's)."""
    return isinstance(error, batch.Unread) or (isinstance(error, NetlinkError)
                                               and error.code in (errno.ENOENT, errno.EINVAL))


def _refused(failed: dict[tuple[str, str], Exception], count: int, kind: str) -> None:
    """One EmulationError naming every link of a batch the kernel refused, with its reason."""
    reasons = "; ".join(f"{netns}: {kind} on {dev}: {exc.args[1] if len(exc.args) > 1 else exc}"
                        for (netns, dev), exc in sorted(failed.items()))
    raise EmulationError(f"{len(failed)} of {count} links refused their {kind} change: {reasons}",
                         hint="the other links hold their new settings; 'netbench show' reads them back")


def _tbf_burst(root: Any) -> int:
    """The burst, in bytes, netbench gave the tbf `root` (it sizes burst from the rate)."""
    rate_bps = decode_qdisc(root).get("rate_bps")
    return tbf_burst_bytes(rate_bps) if rate_bps else 0
