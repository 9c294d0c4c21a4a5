"""Many links' root qdisc (tbf, or netem) changed at once: every request sent before any ack is read.

A schedule changes the rate of every node's link at each step. Through pyroute2's IPRoute one
tbf `replace` costs about a millisecond of Python (its request machinery, encoding the 1 KB
rate table, decoding the ack), and reading the root first to decide how to change it as much
again: 64 links took 100-200 ms, longer than a schedule's step. Here:

- the message is encoded once per (rate, burst, limit) with pyroute2's own tbf plugin (the
  same bytes its `tc("replace", "tbf", ...)` sends) and copied per link with that link's
  ifindex and a sequence number written into it (`with_index`);
- whether a link's tbf must be deleted first (its burst shrinks: see NetlinkQdiscs.replace_tbf)
  is decided from what this process last installed there (`Installed`), not read back;
- the requests go out on each namespace's socket, all of them, and then the acks are read
  (`send_and_collect`): one refusal per link, each with the kernel's reason; a link whose
  answer could not be read (`Unread`) is read back and changed one at a time by the caller.

The same goes for a netem root this process installed (`change_netem`: the netem backend's
change of delay, loss or rate on every node), `change`d in place.

The decisions are pure (`steps`, `requests`, `with_index`); `send_and_collect` is the only I/O.
"""

from __future__ import annotations

import functools
import itertools
import select
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_DELQDISC, RTM_NEWQDISC

from netbench.emulation.netlink import netem, rtnl
from netbench.emulation.netlink.netem import NetemParams

ROOT_PARENT = 0xFFFFFFFF
_INDEX_OFFSET = 20  # nlmsghdr (16 bytes), then tcmsg: family, pad, pad (4 bytes), ifindex (i32)
_SEQ_OFFSET = 8  # nlmsghdr: length, type, flags, sequence number
ACK_TIMEOUT_S = 2.0  # the kernel answers a request while it is sent; this only guards a lost socket
_sequence = itertools.count(1 << 20)  # above the small numbers rtnl.request and pairtree use


@dataclass(frozen=True)
class TbfLink:
    """One link's wanted tbf: rate in bits/s, burst and limit in bytes."""

    netns: str
    ifname: str
    rate_bps: int
    burst_bytes: int
    limit_bytes: int


@dataclass(frozen=True)
class Installed:
    """What this process last installed (and the kernel acked) as netbench's root on a link:
    the interface's index, the root's kind ("tbf" or "netem") and a tbf's burst in bytes."""

    index: int
    burst_bytes: int = 0
    kind: str = "tbf"


def steps(link: TbfLink, installed: Installed) -> tuple[str, ...]:
    """The requests that bring a link holding `installed` to `link`'s tbf: `replace` changes a
    tbf in place (its queue kept); when the burst shrinks the old tbf is deleted first, as a
    packet queued under the larger burst would never gather the tokens to leave."""
    return ("del", "replace") if installed.burst_bytes > link.burst_bytes else ("replace",)


class Unread(NetlinkError):
    """A request whose answer could not be read (the socket's receive buffer overran:
    ENOBUFS): the kernel may or may not have applied it. Its link is read back, not assumed."""


def change(sockets: dict[str, socket.socket], installed: dict[tuple[str, str], Installed],
           links: Sequence[TbfLink], handle: int) -> dict[tuple[str, str], NetlinkError]:
    """Bring every one of `links` (each in `installed`) to its tbf at `handle`: all requests
    sent, then all acks read, on `sockets` (namespace -> socket, opened here where missing:
    FileNotFoundError when a namespace does not exist). `installed` is updated: the links are
    dropped from it before anything is sent, and only a link whose change the kernel acked is
    recorded again, so a link refused, unanswered (Unread) or left by an error raised on the
    way (an interrupt) is read back before it is changed again. Returns the refusals per link."""
    for netns in dict.fromkeys(link.netns for link in links):
        if netns not in sockets:
            sockets[netns] = rtnl.open_socket(netns)
    out, owner = requests(links, installed, handle)
    indices = {(link.netns, link.ifname): installed[(link.netns, link.ifname)].index for link in links}
    for key in indices:
        del installed[key]
    failed = {owner[seq]: error for seq, error in send_and_collect(sockets, out).items()}
    for link in links:
        key = (link.netns, link.ifname)
        if key not in failed:
            installed[key] = Installed(indices[key], link.burst_bytes)
    return failed


def change_netem(sockets: dict[str, socket.socket], installed: dict[tuple[str, str], Installed],
                 changes: Sequence[Any], handle: int) -> dict[tuple[str, str], NetlinkError]:
    """`change` the netem at the root (`handle`) of each ShapeDevice in `changes` (each in
    `installed` as a netem root) to its parameters, its queue kept: all requests sent, then
    all acks read, on `sockets` (opened here where missing, as change()). A device refused or
    unanswered (Unread), or left by an error raised on the way, is dropped from `installed`.
    Returns the refusals per (netns, device)."""
    for netns in dict.fromkeys(c.netns for c in changes):
        if netns not in sockets:
            sockets[netns] = rtnl.open_socket(netns)
    out: list[tuple[str, int, bytes]] = []
    owner: dict[int, tuple[str, str]] = {}
    for c in changes:
        seq = next_seq()
        out.append((c.netns, seq, with_index(netem_template(handle, c.netem), installed[(c.netns, c.dev)].index, seq)))
        owner[seq] = (c.netns, c.dev)
    held = {key: installed.pop(key) for key in owner.values()}  # recorded again once acked
    failed = {owner[seq]: error for seq, error in send_and_collect(sockets, out).items()}
    installed.update({key: root for key, root in held.items() if key not in failed})
    return failed


def requests(links: Sequence[TbfLink], installed: Mapping[tuple[str, str], Installed],
             handle: int) -> tuple[list[tuple[str, int, bytes]], dict[int, tuple[str, str]]]:
    """The requests (netns, sequence number, bytes) that bring each of `links` (each held as
    `installed` says) to its tbf at `handle`, in order, and the link (netns, device) of each
    sequence number."""
    out: list[tuple[str, int, bytes]] = []
    owner: dict[int, tuple[str, str]] = {}
    for link in links:
        held = installed[(link.netns, link.ifname)]
        for step in steps(link, held):
            template = (delete_template(handle) if step == "del"
                        else tbf_template(handle, link.rate_bps, link.burst_bytes, link.limit_bytes))
            seq = next_seq()
            out.append((link.netns, seq, with_index(template, held.index, seq)))
            owner[seq] = (link.netns, link.ifname)
    return out, owner


@functools.lru_cache(maxsize=64)
def tbf_template(handle: int, rate_bps: int, burst_bytes: int, limit_bytes: int) -> bytes:
    """The RTM_NEWQDISC `replace` of netbench's tbf at the root (ifindex 0, sequence 0), encoded
    by pyroute2's tbf plugin from the keywords NetlinkQdiscs.replace_tbf gives `tc`."""
    from pyroute2.netlink.rtnl.tcmsg import plugins, tcmsg

    msg = tcmsg()
    msg["family"], msg["index"], msg["handle"], msg["parent"] = 0, 0, handle, ROOT_PARENT
    options = plugins["tbf"].get_parameters({"rate": rate_bps // 8, "burst": burst_bytes, "limit": limit_bytes})
    msg["attrs"] = [["TCA_KIND", "tbf"], ["TCA_OPTIONS", options]]
    msg["header"]["type"] = RTM_NEWQDISC
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
    msg["header"]["sequence_number"], msg["header"]["pid"] = 0, 0
    msg.encode()
    return bytes(msg.data)


@functools.lru_cache(maxsize=64)
def netem_template(handle: int, params: NetemParams) -> bytes:
    """The RTM_NEWQDISC `change` of netbench's netem at the root to `params` (ifindex 0,
    sequence 0): the bytes NetlinkQdiscs sends for it one at a time (qdisc._send_netem)."""
    msg = netem.netem_tcmsg()
    msg["family"], msg["index"], msg["handle"], msg["parent"] = 0, 0, handle, ROOT_PARENT
    msg["attrs"] = [["TCA_KIND", "netem"], ["TCA_OPTIONS", netem.options(params)]]
    msg["header"]["type"], msg["header"]["flags"] = RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK | NLM_F_REPLACE
    msg["header"]["sequence_number"], msg["header"]["pid"] = 0, 0
    msg.encode()
    return bytes(msg.data)


@functools.lru_cache(maxsize=4)
def delete_template(handle: int) -> bytes:
    """The RTM_DELQDISC of netbench's root qdisc (ifindex 0, sequence 0)."""
    from pyroute2.netlink.rtnl.tcmsg import tcmsg

    msg = tcmsg()
    msg["family"], msg["index"], msg["handle"], msg["parent"] = 0, 0, handle, ROOT_PARENT
    msg["header"]["type"], msg["header"]["flags"] = RTM_DELQDISC, NLM_F_REQUEST | NLM_F_ACK
    msg["header"]["sequence_number"], msg["header"]["pid"] = 0, 0
    msg.encode()
    return bytes(msg.data)


def with_index(template: bytes, index: int, seq: int) -> bytes:
    """`template` (an encoded tcmsg request) for interface `index`, as request number `seq`."""
    data = bytearray(template)
    struct.pack_into("=I", data, _SEQ_OFFSET, seq)
    struct.pack_into("=i", data, _INDEX_OFFSET, index)
    return bytes(data)


def next_seq() -> int:
    return next(_sequence) & 0xFFFFFFFF


def send_and_collect(sockets: Mapping[str, socket.socket],
                     requests: Sequence[tuple[str, int, bytes]]) -> dict[int, NetlinkError]:
    """Send every request (netns, sequence number, bytes) on its namespace's socket (bound,
    extended acks on: rtnl.open_socket), then read every ack. Returns the refusals by sequence
    number (empty: all applied). A socket that cannot be written or read answers each of its
    requests with that error; acks of earlier batches still queued are skipped. A read that
    fails (ENOBUFS: the kernel dropped answers the socket had no room for) ends that socket's
    wait: the answers still queued are read, and each request left unanswered is Unread."""
    waiting: dict[str, set[int]] = {}
    refused: dict[int, NetlinkError] = {}
    for netns, seq, data in requests:
        try:
            sockets[netns].sendto(data, (0, 0))
            waiting.setdefault(netns, set()).add(seq)
        except OSError as exc:
            refused[seq] = NetlinkError(exc.errno or 5, f"cannot send: {exc.strerror or exc}")
    deadline = time.monotonic() + ACK_TIMEOUT_S
    for netns, seqs in waiting.items():
        sock = sockets[netns]
        while seqs:
            left = deadline - time.monotonic()
            ready = select.select([sock], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                for seq in seqs:
                    refused[seq] = NetlinkError(110, "no answer from the kernel")  # ETIMEDOUT
                break
            try:
                data = sock.recv(65536)
            except OSError as exc:
                _drain(sock, seqs, refused)
                for seq in seqs:
                    refused[seq] = Unread(exc.errno or 5, f"cannot read the kernel's answer: {exc.strerror or exc}")
                break
            _answered(data, seqs, refused)
    return refused


def _answered(data: bytes, seqs: set[int], refused: dict[int, NetlinkError]) -> None:
    """Take the acks in `data` off `seqs` (the requests still waiting), refusals into `refused`."""
    for seq, error in parse_acks(data):
        if seq in seqs:
            seqs.discard(seq)
            if error is not None:
                refused[seq] = error


def _drain(sock: socket.socket, seqs: set[int], refused: dict[int, NetlinkError]) -> None:
    """Read the answers already queued on `sock` without waiting (after a failed read)."""
    while seqs and select.select([sock], [], [], 0)[0]:
        try:
            data = sock.recv(65536)
        except OSError:
            return
        _answered(data, seqs, refused)


def parse_acks(data: bytes) -> list[tuple[int, NetlinkError | None]]:
    """The acks in one datagram: (sequence number, None when applied, else the refusal with
    the kernel's reason). Messages that are not acks are skipped."""
    acks: list[tuple[int, NetlinkError | None]] = []
    offset = 0
    while offset + rtnl._HDR.size <= len(data):
        length, kind, flags, seq, _ = rtnl._HDR.unpack_from(data, offset)
        if length < rtnl._HDR.size:
            break
        if kind == rtnl.NLMSG_ERROR:
            try:
                rtnl._check_ack(data[offset:offset + length], flags)
                acks.append((seq, None))
            except NetlinkError as exc:
                acks.append((seq, exc))
        offset += (length + 3) & ~3
    return acks
