"""One rtnetlink request on a plain blocking socket in a namespace, with the kernel's ack.

The message is built and encoded with pyroute2's classes; the send and the ack are done
here, synchronously, with extended acks on, so a refusal carries the kernel's own reason
(pyroute2 0.9.7's NetNS has no extended-ack option and its sync request path is broken).
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from contextlib import contextmanager
from typing import Iterator

from pyroute2.netlink.exceptions import NetlinkError

from netbench.proc import NETNS_RUN_DIR

ROOTLESS_ENV = "NETBENCH_PRIVILEGE"  # state/places.py's: set to rootless inside a user's sandbox

NETLINK_EXT_ACK = 11
SOL_NETLINK = 270
NLMSG_ERROR = 2
NLMSGERR_ATTR_MSG = 1
NLM_F_CAPPED = 0x100
NLM_F_ACK_TLVS = 0x200
_HDR = struct.Struct("=IHHII")


def raw_socket_in(netns: str | None, kind: int = socket.SOCK_RAW) -> socket.socket:
    """A NETLINK_ROUTE socket created inside `netns` (None: the current one), unbound. A socket
    stays in the namespace it was created in, so the thread switches back at once: no child
    process (pyroute2's NetNS forks one per socket, ~7 ms; this takes ~0.1 ms).
    FileNotFoundError when the namespace does not exist.

    Without root (a sandbox's user namespace) a thread may enter the testbed's namespaces but
    never return to the host's, which the sandbox does not own: the socket is then made on a
    thread of its own that ends with it."""
    if netns and os.environ.get(ROOTLESS_ENV) == "rootless":
        return _on_own_thread(lambda: _socket_there(netns, kind))
    return _socket_here(netns, kind)


def _on_own_thread(make):
    import threading

    out: list = []

    def run() -> None:
        try:
            out.append((True, make()))
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller
            out.append((False, exc))

    thread = threading.Thread(target=run, name="netbench-netns-socket", daemon=True)
    thread.start()
    thread.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value


def _socket_here(netns: str | None, kind: int) -> socket.socket:
    original = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        target = os.open(NETNS_RUN_DIR / netns, os.O_RDONLY) if netns else None
        try:
            if target is not None:
                _setns(target)
            try:
                return socket.socket(socket.AF_NETLINK, kind, socket.NETLINK_ROUTE)
            finally:
                if target is not None:
                    _setns(original)
        finally:
            if target is not None:
                os.close(target)
    finally:
        os.close(original)


def _socket_there(netns: str, kind: int) -> socket.socket:
    """A socket made in `netns` by a thread that stays there (it ends right after)."""
    target = os.open(NETNS_RUN_DIR / netns, os.O_RDONLY)
    try:
        _setns(target)
    finally:
        os.close(target)
    return socket.socket(socket.AF_NETLINK, kind, socket.NETLINK_ROUTE)


def iproute_in(netns: str):
    """A pyroute2 IPRoute whose socket lives in `netns` (created in-process, see raw_socket_in);
    the caller closes it. FileNotFoundError when the namespace does not exist."""
    from pyroute2 import IPRoute

    sock = raw_socket_in(netns, socket.SOCK_DGRAM)
    try:
        # groups=0: no multicast subscription, or every change in the namespace would queue a
        # notification that each later request must read past (a held socket slowed down)
        return IPRoute(use_socket=sock, groups=0)
    except BaseException:
        sock.close()
        raise


def open_socket(netns: str | None) -> socket.socket:
    """A bound NETLINK_ROUTE socket with extended acks, created inside `netns`; the caller
    closes it. FileNotFoundError when the namespace does not exist."""
    sock = raw_socket_in(netns)
    try:
        sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
        sock.bind((0, 0))
    except BaseException:
        sock.close()
        raise
    return sock


@contextmanager
def socket_in(netns: str | None) -> Iterator[socket.socket]:
    """A bound NETLINK_ROUTE socket with extended acks, created inside `netns`, closed after."""
    sock = open_socket(netns)
    try:
        yield sock
    finally:
        sock.close()


def _setns(fd: int) -> None:
    """Move the calling thread into the network namespace `fd` (os.setns exists from 3.12)."""
    if hasattr(os, "setns"):
        os.setns(fd, os.CLONE_NEWNET)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def request(netns: str | None, msg, seq: int = 1) -> None:
    """Send one encoded-on-demand pyroute2 message with NLM_F_ACK set; raise NetlinkError
    (code, kernel's message) on a NACK."""
    msg["header"]["sequence_number"] = seq
    msg["header"]["pid"] = 0
    msg.encode()
    with socket_in(netns) as sock:
        sock.sendto(bytes(msg.data), (0, 0))
        while True:
            data = sock.recv(65536)
            offset = 0
            while offset + _HDR.size <= len(data):
                length, kind, flags, rseq, _ = _HDR.unpack_from(data, offset)
                if length < _HDR.size:
                    break
                if kind == NLMSG_ERROR and rseq == seq:
                    _check_ack(data[offset:offset + length], flags)
                    return
                offset += (length + 3) & ~3


def _check_ack(message: bytes, flags: int) -> None:
    (code,) = struct.unpack_from("=i", message, _HDR.size)
    if code == 0:
        return
    reason = os.strerror(-code)
    if flags & NLM_F_ACK_TLVS:
        # struct nlmsgerr: error + the request's header (+ payload unless capped), then TLVs
        (orig_len,) = struct.unpack_from("=I", message, _HDR.size + 4)
        tlv = _HDR.size + 4 + (_HDR.size if flags & NLM_F_CAPPED else (orig_len + 3) & ~3)
        while tlv + 4 <= len(message):
            tlen, ttype = struct.unpack_from("=HH", message, tlv)
            if tlen < 4:
                break
            if ttype & 0x3FFF == NLMSGERR_ATTR_MSG:
                reason = message[tlv + 4:tlv + tlen].split(b"\0", 1)[0].decode(errors="replace") or reason
            tlv += (tlen + 3) & ~3
    raise NetlinkError(-code if -code > 0 else errno.EIO, reason)
