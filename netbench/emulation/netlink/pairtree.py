"""A per-destination tree (changes.ShapePairs) through netlink: the u32 hash-table filters
pyroute2 cannot encode, the in-place steps from what a device holds to what is wanted, and
the read-back of every destination's class.

The tree, as tc would make it (changes.ShapePairs.describe):

    htb root 4e42: default 0                      traffic to no listed destination: unshaped
      class 4e42:<i+1> rate <pair rate>            one per destination, in plan order
        netem <CHILD_MAJOR + i>:                    that pair's delay, loss, ... and limit
    u32 at prio 1, protocol ip:
      table 4e4: divisor 256                       buckets keyed on the destination's last byte
      800:: match-all, hashkey 0x000000ff at 16, link 4e4:
      4e4:<last byte>:<n> match ip dst <peer>/32 flowid 4e42:<i+1>

pyroute2 0.9's u32 plugin sends only a class id and match keys (no TCA_U32_HASH, LINK or
DIVISOR, no hash mask or offset in the selector), so `u32_message` builds the request
itself: TCA_OPTIONS per include/uapi/linux/pkt_cls.h (struct tc_u32_sel, then 16-byte
struct tc_u32_key each), as iproute2's tc/f_u32.c fills them for `ht`, `divisor`, `link`,
`hashkey mask M at O` and `flowid`.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, nla
from pyroute2.netlink.rtnl import RTM_DELTCLASS, RTM_DELTFILTER, RTM_NEWQDISC, RTM_NEWTCLASS, RTM_NEWTFILTER
from pyroute2.netlink.rtnl.tcmsg import sched_htb, tcmsg

from netbench.emulation.changes import (CHILD_MAJOR, HANDLE_MAJOR, HTB_UNLIMITED_BPS, PAIRS_BUCKETS, PAIRS_HTID,
                                        U32_ROOT_HTID, ShapePairs, htb_burst_bytes, htb_quantum, pair_bucket)
from netbench.emulation.netlink import netem, rtnl

ETH_P_IP = 0x0800
FILTER_PRIO = 1
TC_U32_TERMINAL = 1
DST_OFFSET = 16  # the destination address in the IPv4 header
HASH_MASK = 0x000000FF  # its last byte
_HANDLE_INT = HANDLE_MAJOR << 16
TABLE_HANDLE = PAIRS_HTID << 20  # u32 handles: table (12 bits) : bucket (8) : node (12)
ROOT_TABLE_HANDLE = U32_ROOT_HTID << 20
WINDOW = 32  # requests sent before their acks are read (the acks fit a default receive buffer)


class u32_options(nla):
    """TCA_OPTIONS of a u32 filter, the attributes netbench sends and reads (pkt_cls.h)."""

    nla_map = (
        (0, "TCA_U32_UNSPEC", "none"),
        (1, "TCA_U32_CLASSID", "uint32"),
        (2, "TCA_U32_HASH", "uint32"),
        (3, "TCA_U32_LINK", "uint32"),
        (4, "TCA_U32_DIVISOR", "uint32"),
        (5, "TCA_U32_SEL", "cdata"),  # struct tc_u32_sel + keys, packed by pack_sel
    )


class u32_tcmsg(tcmsg):
    """A tcmsg whose TCA_OPTIONS is u32_options (its own compiled map: see netem.netem_tcmsg)."""

    _nlmsg_base__compiled_nla = False
    _nlmsg_base__t_nla_map = None
    _nlmsg_base__r_nla_map = None

    @staticmethod
    def get_options(self, *argv, **kwarg):
        return u32_options


def pack_sel(keys: Iterable[tuple[int, int, int]] = (), hmask: int = 0, hoff: int = 0,
             flags: int = TC_U32_TERMINAL) -> bytes:
    """struct tc_u32_sel {u8 flags, offshift, nkeys, pad; be16 offmask; u16 off; s16 offoff,
    hoff; be32 hmask} followed by struct tc_u32_key {be32 mask, val; s32 off, offmask} per
    (mask, value, offset) key."""
    keys = list(keys)
    head = (struct.pack("=BBBx", flags, 0, len(keys)) + struct.pack(">H", 0) + struct.pack("=Hhh", 0, 0, hoff)
            + struct.pack(">I", hmask))
    return head + b"".join(struct.pack(">II", mask, value & mask) + struct.pack("=ii", off, 0)
                           for mask, value, off in keys)


def unpack_sel(raw: bytes) -> dict[str, Any]:
    """pack_sel's inverse: {"flags", "hmask", "hoff", "keys": [(mask, value, offset)]}."""
    flags, _, nkeys = struct.unpack_from("=BBB", raw, 0)
    (hoff,) = struct.unpack_from("=h", raw, 10)
    (hmask,) = struct.unpack_from(">I", raw, 12)
    keys = []
    for i in range(nkeys):
        at = 16 + 16 * i
        if at + 16 > len(raw):
            break
        mask, value = struct.unpack_from(">II", raw, at)
        (off,) = struct.unpack_from("=i", raw, at + 8)
        keys.append((mask, value, off))
    return {"flags": flags, "hmask": hmask, "hoff": hoff, "keys": keys}


def u32_message(index: int, handle: int = 0, attrs: list[list[Any]] | None = None, delete: bool = False,
                exclusive: bool = False) -> u32_tcmsg:
    """RTM_NEWTFILTER (or DELTFILTER) for a u32 filter at netbench's root, prio 1, protocol ip.
    Without `exclusive` a filter of the same handle is changed (its class id)."""
    msg = u32_tcmsg()
    msg["family"], msg["index"], msg["handle"], msg["parent"] = 0, index, handle, _HANDLE_INT
    msg["info"] = (FILTER_PRIO << 16) | socket.htons(ETH_P_IP)
    msg["attrs"] = [["TCA_KIND", "u32"]] + ([["TCA_OPTIONS", {"attrs": attrs}]] if attrs is not None else [])
    flags = NLM_F_REQUEST | NLM_F_ACK
    if not delete:
        flags |= NLM_F_CREATE | (NLM_F_EXCL if exclusive else 0)
    msg["header"]["type"], msg["header"]["flags"] = (RTM_DELTFILTER if delete else RTM_NEWTFILTER), flags
    return msg


def table_message(index: int) -> u32_tcmsg:
    """tc filter add ... handle 4e4: u32 divisor 256"""
    return u32_message(index, TABLE_HANDLE, [["TCA_U32_DIVISOR", PAIRS_BUCKETS]], exclusive=True)


def link_message(index: int) -> u32_tcmsg:
    """tc filter add ... u32 ht 800:: match u32 0 0 hashkey mask 0x000000ff at 16 link 4e4:"""
    return u32_message(index, 0, [["TCA_U32_HASH", ROOT_TABLE_HANDLE], ["TCA_U32_LINK", TABLE_HANDLE],
                                  ["TCA_U32_SEL", pack_sel([(0, 0, 0)], hmask=HASH_MASK, hoff=DST_OFFSET, flags=0)]],
                       exclusive=True)


def dst_message(index: int, peer: str, classid: int, handle: int = 0) -> u32_tcmsg:
    """tc filter add ... u32 ht 4e4:<bucket>: match ip dst <peer> flowid <classid> (handle 0:
    the kernel numbers it in its bucket; a handle changes that filter's class in place)."""
    network = ipaddress.IPv4Network(peer, strict=False)
    table = TABLE_HANDLE | (pair_bucket(peer) << 12)
    sel = pack_sel([(int(network.netmask), int(network.network_address), DST_OFFSET)])
    return u32_message(index, handle, [["TCA_U32_HASH", table], ["TCA_U32_CLASSID", classid],
                                       ["TCA_U32_SEL", sel]], exclusive=not handle)


def delete_message(index: int, handle: int) -> u32_tcmsg:
    return u32_message(index, handle, None, delete=True)


@dataclass(frozen=True)
class U32Node:
    """One dumped u32 entry at prio 1: a table (divisor > 0) or a filter."""

    handle: int
    divisor: int = 0
    link: int = 0
    classid: int = 0
    peer: str | None = None  # "a.b.c.d/n" when it matches one destination network at offset 16

    @property
    def table(self) -> int:
        return self.handle >> 20

    @property
    def is_table(self) -> bool:
        return self.handle & 0xFFF == 0


def decode_u32(tfilter: Any) -> U32Node | None:
    """A dumped tcmsg -> U32Node; None for another prio, protocol or kind."""
    if tfilter.get_attr("TCA_KIND") != "u32" or tfilter["info"] != (FILTER_PRIO << 16) | socket.htons(ETH_P_IP):
        return None
    raw = next((attr[1] for attr in tfilter["attrs"] if attr[0] == "TCA_OPTIONS"), None)
    if raw is None:
        return U32Node(tfilter["handle"])
    options = u32_options(raw.data, offset=raw.offset)
    options.decode()
    sel = options.get_attr("TCA_U32_SEL")
    peer = None
    if sel:
        keys = unpack_sel(bytes(sel))["keys"]
        if len(keys) == 1 and keys[0][2] == DST_OFFSET and keys[0][0]:
            mask, value, _ = keys[0]
            peer = str(ipaddress.IPv4Network((value & mask, bin(mask).count("1"))))
    return U32Node(tfilter["handle"], options.get_attr("TCA_U32_DIVISOR") or 0, options.get_attr("TCA_U32_LINK") or 0,
                   options.get_attr("TCA_U32_CLASSID") or 0, peer)


def class_handle(i: int) -> int:
    """The htb class of the change's i-th destination."""
    return _HANDLE_INT | (i + 1)


def filter_steps(index: int, held: list[U32Node], change: ShapePairs) -> list[u32_tcmsg]:
    """The requests that turn the filters `held` at prio 1 into `change`'s, in order: the table
    if missing, a filter per new destination (a held one pointing at another class is changed
    in place), the link into the table if missing, then every other filter removed (a removed
    destination's, an older peers tree's chain) so no class they name stays in use."""
    wanted = {ipaddress.IPv4Network(c.peer, strict=False).with_prefixlen: class_handle(i)
              for i, c in enumerate(change.classes)}
    steps: list[u32_tcmsg] = []
    if not any(n.is_table and n.table == PAIRS_HTID for n in held):
        steps.append(table_message(index))
    removals: list[u32_tcmsg] = []
    kept: set[str] = set()
    linked = False
    for node in held:
        if node.is_table:
            continue
        if node.table == U32_ROOT_HTID and node.link == TABLE_HANDLE and not linked:
            linked = True
            continue
        in_bucket = node.peer is not None and node.table == PAIRS_HTID and (node.handle >> 12) & 0xFF == pair_bucket(node.peer)
        if in_bucket and node.peer in wanted and node.peer not in kept:
            kept.add(node.peer)
            if node.classid != wanted[node.peer]:
                steps.append(dst_message(index, node.peer, wanted[node.peer], node.handle))
            continue
        removals.append(delete_message(index, node.handle))
    for i, pair in enumerate(change.classes):
        peer = ipaddress.IPv4Network(pair.peer, strict=False).with_prefixlen
        if peer not in kept:
            kept.add(peer)
            steps.append(dst_message(index, peer, class_handle(i)))
    if not linked:
        steps.append(link_message(index))
    return steps + removals


def class_messages(index: int, change: ShapePairs) -> list[Any]:
    """RTM_NEWTCLASS (replace) for every destination's htb class, encoded by pyroute2's htb
    plugin as its `tc("replace-class", "htb", ...)` would, to be sent pipelined."""
    out = []
    for i, pair in enumerate(change.classes):
        rate_bps = pair.rate_bps or HTB_UNLIMITED_BPS
        msg = tcmsg()
        msg["family"], msg["index"], msg["handle"], msg["parent"] = 0, index, class_handle(i), _HANDLE_INT
        msg["attrs"] = [["TCA_KIND", "htb"], ["TCA_OPTIONS", sched_htb.get_class_parameters(dict(
            rate=rate_bps // 8, ceil=rate_bps // 8, burst=htb_burst_bytes(rate_bps), cburst=htb_burst_bytes(rate_bps),
            quantum=htb_quantum(rate_bps)))]]
        msg["header"]["type"] = RTM_NEWTCLASS
        msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
        out.append(msg)
    return out


def class_delete_message(index: int, handle: int) -> Any:
    """RTM_DELTCLASS (pyroute2 0.9's `tc("del-class", "htb", ...)` fails to encode one)."""
    msg = tcmsg()
    msg["family"], msg["index"], msg["handle"], msg["parent"] = 0, index, handle, _HANDLE_INT
    msg["attrs"] = []
    msg["header"]["type"], msg["header"]["flags"] = RTM_DELTCLASS, NLM_F_REQUEST | NLM_F_ACK
    return msg


def netem_messages(index: int, leaves: list[Any], change: ShapePairs) -> list[Any]:
    """RTM_NEWQDISC for every destination's netem leaf: `change` where that class already has
    netbench's netem (the queue is kept), else `add` (grafted over the class's default leaf).
    `leaves`: the device's qdiscs as dumped after the classes were made."""
    live = {(q["handle"], q["parent"]) for q in leaves if q.get_attr("TCA_KIND") == "netem"}
    out = []
    for i, pair in enumerate(change.classes):
        handle, parent = (CHILD_MAJOR + i) << 16, class_handle(i)
        msg = netem.netem_tcmsg()
        msg["family"], msg["index"], msg["handle"], msg["parent"] = 0, index, handle, parent
        msg["attrs"] = [["TCA_KIND", "netem"], ["TCA_OPTIONS", netem.options(pair.netem)]]
        msg["header"]["type"] = RTM_NEWQDISC
        msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | (
            NLM_F_REPLACE if (handle, parent) in live else NLM_F_CREATE | NLM_F_EXCL)
        out.append(msg)
    return out


def send_all(netns: str, messages: list[Any], window: int = WINDOW) -> None:
    """Send `messages` on one socket in `netns`, `window` at a time before reading their acks;
    the first refusal raises NetlinkError (the kernel's reason, as rtnl.request). A filter or
    class already gone when it is deleted is not an error."""
    if not messages:
        return
    with rtnl.socket_in(netns) as sock:
        for start in range(0, len(messages), window):
            batch = messages[start:start + window]
            waiting: dict[int, Any] = {}
            for seq, msg in enumerate(batch, start + 1):
                msg["header"]["sequence_number"], msg["header"]["pid"] = seq, 0
                msg.encode()
                sock.sendto(bytes(msg.data), (0, 0))
                waiting[seq] = msg
            while waiting:
                data = sock.recv(1 << 20)
                offset = 0
                while offset + rtnl._HDR.size <= len(data):
                    length, kind, flags, seq, _ = rtnl._HDR.unpack_from(data, offset)
                    if length < rtnl._HDR.size:
                        break
                    if kind == rtnl.NLMSG_ERROR and seq in waiting:
                        msg = waiting.pop(seq)
                        try:
                            rtnl._check_ack(data[offset:offset + length], flags)
                        except Exception as exc:
                            gone = getattr(exc, "code", None) in (errno.ENOENT, errno.EINVAL)
                            if not (gone and msg["header"]["type"] in (RTM_DELTFILTER, RTM_DELTCLASS)):
                                raise
                    offset += (length + 3) & ~3


def decode_pairs(qdiscs: list[Any], classes: list[Any], filters: list[Any],
                 decode_leaf: Callable[[Any], dict[str, Any]], unlimited_bps: int) -> list[dict[str, Any]] | None:
    """A per-destination tree's destinations, or None when the filters are not one (no
    destination filter in table 4e4:): [{"peer": "a.b.c.d/32", "netem": NetemParams | None,
    "rate_bps": int | None (None: unlimited), "classid": "4e42:<i>", "bytes", "packets",
    "drops", "backlog": the netem leaf's counters}] in class order (the plan's order)."""
    nodes = [n for n in (decode_u32(f) for f in filters) if n is not None]
    dsts = sorted((n.classid, n.peer) for n in nodes
                  if not n.is_table and n.table == PAIRS_HTID and n.peer is not None and n.classid)
    if not dsts:
        return None
    rates: dict[int, int] = {}
    for tclass in classes:
        options = tclass.get_attr("TCA_OPTIONS")
        parms = options.get_attr("TCA_HTB_PARMS") if options is not None else None
        if parms is not None:
            rates[tclass["handle"]] = (options.get_attr("TCA_HTB_RATE64") or parms["rate"]) * 8
    leaves = {q["parent"]: q for q in qdiscs}
    out = []
    for classid, peer in dsts:
        leaf = decode_leaf(leaves[classid]) if classid in leaves else {}
        rate = rates.get(classid)
        row = {"peer": peer, "netem": leaf.get("netem"), "rate_bps": None if rate in (None, unlimited_bps) else rate,
               "classid": f"{classid >> 16:x}:{classid & 0xFFFF:x}"}
        row.update({key: leaf[key] for key in ("bytes", "packets", "drops", "backlog") if key in leaf})
        out.append(row)
    return out
