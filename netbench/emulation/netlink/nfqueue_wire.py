"""Minimal NFQUEUE client speaking nfnetlink_queue directly over AF_NETLINK.

Only what the delay engine needs: bind a queue, receive packet ids (and
lengths), and send single or batch verdicts.  No payload inspection.

Wire format (see <linux/netfilter/nfnetlink_queue.h>, <linux/netlink.h>):

* ``nlmsghdr``: len u32, type u16, flags u16, seq u32, pid u32 - HOST order.
* ``nfgenmsg``: family u8, version u8 (NFNETLINK_V0), res_id be16 (the queue
  number) - res_id is BIG endian.
* attributes: ``nlattr`` len u16, type u16 (host order), payload padded to 4
  bytes.  nfqueue attribute payloads (ids, verdicts, lengths, config values)
  are BIG endian.

The encode/parse functions are pure (bytes in, bytes/records out) so they can
be unit tested without root; :class:`netbench.emulation.nfqueue.NfqueueSocket` wraps the socket.
"""

from __future__ import annotations

import errno as errno_mod
import socket
import struct
from dataclasses import dataclass, field

# --- netlink generic ---------------------------------------------------------
NETLINK_NETFILTER = 12
SOL_NETLINK = 270
SO_RCVBUFFORCE = 33  # not exported by the socket module on all builds

NLMSG_NOOP = 1
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLMSG_OVERRUN = 4

NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4

NLA_TYPE_MASK = 0x3FFF  # strips NLA_F_NESTED / NLA_F_NET_BYTEORDER

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_NFGENMSG = struct.Struct("!BBH")  # family, version, res_id (be16)
_NLATTR = struct.Struct("=HH")  # len, type
_NLMSGERR = struct.Struct("=i")  # negative errno, followed by original header
NLMSG_HDRLEN = _NLMSGHDR.size  # 16
NFGEN_HDRLEN = _NFGENMSG.size  # 4

# --- nfnetlink / nfnetlink_queue --------------------------------------------
NFNETLINK_V0 = 0
NFNL_SUBSYS_QUEUE = 3

NFQNL_MSG_PACKET = (NFNL_SUBSYS_QUEUE << 8) | 0
NFQNL_MSG_VERDICT = (NFNL_SUBSYS_QUEUE << 8) | 1
NFQNL_MSG_CONFIG = (NFNL_SUBSYS_QUEUE << 8) | 2
NFQNL_MSG_VERDICT_BATCH = (NFNL_SUBSYS_QUEUE << 8) | 3

# enum nfqnl_attr_type
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_TIMESTAMP = 4  # struct nfqnl_msg_packet_timestamp {be64 sec; be64 usec}, CLOCK_REALTIME
NFQA_PAYLOAD = 10
NFQA_CAP_LEN = 13
NFQA_SKB_INFO = 14

# enum nfqnl_attr_config
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5

# enum nfqnl_msg_config_cmds
NFQNL_CFG_CMD_BIND = 1
NFQNL_CFG_CMD_UNBIND = 2
NFQNL_CFG_CMD_PF_BIND = 3
NFQNL_CFG_CMD_PF_UNBIND = 4

# enum nfqnl_config_mode
NFQNL_COPY_NONE = 0
NFQNL_COPY_META = 1
NFQNL_COPY_PACKET = 2

NFQA_CFG_F_FAIL_OPEN = 1 << 0
NFQA_CFG_F_GSO = 1 << 2

NFQA_SKB_GSO = 1 << 1

NF_DROP = 0
NF_ACCEPT = 1

_BE32 = struct.Struct("!I")
_BE64X2 = struct.Struct("!QQ")
_VERDICT_HDR = struct.Struct("!II")  # verdict, id
_CFG_CMD = struct.Struct("!BxH")  # command, pad, pf (be16)
_CFG_PARAMS = struct.Struct("!IB")  # copy_range (be32), copy_mode; packed, 5 bytes
_PACKET_ID = struct.Struct("!I")  # first field of nfqnl_msg_packet_hdr

DEFAULT_COPY_RANGE = 64
DEFAULT_QUEUE_MAXLEN = 65536
DEFAULT_RCVBUF_BYTES = 32 * 1024 * 1024
_RECV_BUFSIZE = 256 * 1024


class NfqueueError(OSError):
    """A netlink request was rejected by the kernel (``errno`` is set)."""


@dataclass(frozen=True)
class NetlinkError:
    """An NLMSG_ERROR record: ``errno`` is positive, 0 means an ACK."""

    seq: int
    errno: int
    msg_type: int  # type of the request that caused it


@dataclass(frozen=True)
class ParsedBatch:
    """Result of parsing one recv() buffer.

    ``packets`` holds ``(packet_id, length)`` tuples in arrival order; plain
    tuples, not objects, because this is the per-packet hot path.  ``length``
    is the original packet length in bytes (from NFQA_CAP_LEN when the copy
    was truncated, else the copied payload length), or -1 when unknown
    (COPY_META / COPY_NONE modes report no length).
    """

    packets: list
    errors: list
    gso_packets: int = 0
    # kernel receive time of each packet (CLOCK_REALTIME seconds) or None, parallel to packets
    timestamps: list = field(default_factory=list)
    # with parse_messages(destinations=True): each packet's IPv4 destination (the header's
    # big-endian u32) or -1 (not IPv4, or fewer than 20 bytes copied), parallel to packets
    destinations: list = field(default_factory=list)


# --- pure encoders -----------------------------------------------------------

def _align4(n: int) -> int:
    return (n + 3) & ~3


def encode_attr(attr_type: int, payload: bytes) -> bytes:
    """One netlink attribute: header (host order) + payload padded to 4."""
    length = _NLATTR.size + len(payload)
    pad = _align4(length) - length
    return _NLATTR.pack(length, attr_type) + payload + b"\0" * pad


def encode_nfq_message(msg_type: int, queue_num: int, attrs: bytes,
                       seq: int = 0, flags: int = NLM_F_REQUEST,
                       family: int = socket.AF_UNSPEC) -> bytes:
    """nlmsghdr + nfgenmsg(family, NFNETLINK_V0, queue_num) + attributes."""
    body = _NFGENMSG.pack(family, NFNETLINK_V0, queue_num) + attrs
    return _NLMSGHDR.pack(NLMSG_HDRLEN + len(body), msg_type, flags, seq, 0) + body


def encode_config_cmd(queue_num: int, command: int, pf: int = 0,
                      seq: int = 0) -> bytes:
    """NFQNL_MSG_CONFIG carrying NFQA_CFG_CMD (bind/unbind/pf_[un]bind)."""
    attr = encode_attr(NFQA_CFG_CMD, _CFG_CMD.pack(command, pf))
    return encode_nfq_message(NFQNL_MSG_CONFIG, queue_num, attr, seq,
                              NLM_F_REQUEST | NLM_F_ACK)


def encode_config_params(queue_num: int, copy_mode: int, copy_range: int,
                         seq: int = 0) -> bytes:
    """NFQA_CFG_PARAMS: copy mode and copy range (bytes of payload copied)."""
    attr = encode_attr(NFQA_CFG_PARAMS, _CFG_PARAMS.pack(copy_range, copy_mode))
    return encode_nfq_message(NFQNL_MSG_CONFIG, queue_num, attr, seq,
                              NLM_F_REQUEST | NLM_F_ACK)


def encode_config_maxlen(queue_num: int, maxlen: int, seq: int = 0) -> bytes:
    """NFQA_CFG_QUEUE_MAXLEN: max packets held in the kernel queue."""
    attr = encode_attr(NFQA_CFG_QUEUE_MAXLEN, _BE32.pack(maxlen))
    return encode_nfq_message(NFQNL_MSG_CONFIG, queue_num, attr, seq,
                              NLM_F_REQUEST | NLM_F_ACK)


def encode_config_flags(queue_num: int, flags: int, mask: int,
                        seq: int = 0) -> bytes:
    """NFQA_CFG_MASK + NFQA_CFG_FLAGS (the kernel requires both)."""
    attrs = (encode_attr(NFQA_CFG_MASK, _BE32.pack(mask))
             + encode_attr(NFQA_CFG_FLAGS, _BE32.pack(flags)))
    return encode_nfq_message(NFQNL_MSG_CONFIG, queue_num, attrs, seq,
                              NLM_F_REQUEST | NLM_F_ACK)


def encode_verdicts(queue_num: int, packet_ids: list, verdict: int) -> bytes:
    """One buffer of single-packet verdict messages, the same verdict for each id: sent at
    once, the kernel handles every message in it (nfnetlink walks the whole buffer)."""
    prefix = encode_verdict(queue_num, 0, verdict)[:-4]  # the id is the message's last 4 bytes
    pack = _BE32.pack
    return b"".join([prefix + pack(packet_id) for packet_id in packet_ids])


def encode_verdict(queue_num: int, packet_id: int, verdict: int,
                   batch: bool = False, seq: int = 0) -> bytes:
    """A verdict for one id, or with ``batch`` for every queued id <= packet_id.

    No NLM_F_ACK: verdicts are fire-and-forget; the kernel still reports
    failures (e.g. ENOENT for an unknown id) as NLMSG_ERROR in the stream.
    """
    msg_type = NFQNL_MSG_VERDICT_BATCH if batch else NFQNL_MSG_VERDICT
    attr = encode_attr(NFQA_VERDICT_HDR, _VERDICT_HDR.pack(verdict, packet_id))
    return encode_nfq_message(msg_type, queue_num, attr, seq)


# --- pure parser -------------------------------------------------------------

def parse_attrs(buf, start: int, end: int) -> dict:
    """Map attribute type -> (payload_offset, payload_len) within ``buf``."""
    attrs = {}
    off = start
    while off + _NLATTR.size <= end:
        alen, atype = _NLATTR.unpack_from(buf, off)
        if alen < _NLATTR.size or off + alen > end:
            raise ValueError(f"malformed netlink attribute at offset {off}")
        attrs[atype & NLA_TYPE_MASK] = (off + _NLATTR.size, alen - _NLATTR.size)
        off += _align4(alen)
    return attrs


def _parse_packet(buf, start: int, end: int) -> tuple:
    """(packet_id, length, is_gso, timestamp, payload offset or -1) from an NFQNL_MSG_PACKET body.

    Hot path (once per packet): attributes are scanned inline rather than
    via parse_attrs() to avoid building a dict.
    """
    packet_id = length = payload_len = payload_off = -1
    gso = False
    stamp = None
    off = start + NFGEN_HDRLEN
    unpack_attr, unpack_be32 = _NLATTR.unpack_from, _BE32.unpack_from
    while off + 4 <= end:
        alen, atype = unpack_attr(buf, off)
        if alen < 4 or off + alen > end:
            raise ValueError(f"malformed netlink attribute at offset {off}")
        atype &= NLA_TYPE_MASK
        if atype == NFQA_PACKET_HDR:
            packet_id = unpack_be32(buf, off + 4)[0]
        elif atype == NFQA_CAP_LEN:
            length = unpack_be32(buf, off + 4)[0]
        elif atype == NFQA_PAYLOAD:
            payload_len = alen - 4
            payload_off = off + 4
        elif atype == NFQA_SKB_INFO:
            gso = bool(unpack_be32(buf, off + 4)[0] & NFQA_SKB_GSO)
        elif atype == NFQA_TIMESTAMP and alen >= 20:
            sec, usec = _BE64X2.unpack_from(buf, off + 4)
            stamp = sec + usec / 1e6
        off += (alen + 3) & ~3
    if packet_id < 0:
        raise ValueError("NFQNL_MSG_PACKET without NFQA_PACKET_HDR")
    # CAP_LEN is only sent when the copy was truncated; otherwise the
    # payload is the whole packet.
    if payload_len < IPV4_HEADER_BYTES:
        payload_off = -1
    return packet_id, (length if length >= 0 else payload_len), gso, stamp, payload_off


IPV4_HEADER_BYTES = 20  # what must be copied to read a packet's destination


def ipv4_destination(buf, payload_off: int) -> int:
    """The destination of the IPv4 packet at ``payload_off`` (a big-endian u32), or -1."""
    if payload_off < 0 or buf[payload_off] >> 4 != 4:
        return -1
    return _BE32.unpack_from(buf, payload_off + 16)[0]


def parse_messages(buf, nbytes: int | None = None, destinations: bool = False) -> ParsedBatch:
    """Parse every netlink message in ``buf[:nbytes]``.

    Returns packets as ``(packet_id, length)`` and NLMSG_ERROR records (ACKs
    included, errno 0), and with ``destinations`` each packet's IPv4 destination.
    Unknown message types are ignored.  Raises ValueError on a truncated/malformed buffer.
    """
    end = len(buf) if nbytes is None else nbytes
    packets, errors, gso, stamps, dsts = [], [], 0, [], []
    off = 0
    while off + NLMSG_HDRLEN <= end:
        mlen, mtype, _flags, seq, _pid = _NLMSGHDR.unpack_from(buf, off)
        if mlen < NLMSG_HDRLEN or off + mlen > end:
            raise ValueError(f"malformed netlink message at offset {off}")
        body = off + NLMSG_HDRLEN
        if mtype == NFQNL_MSG_PACKET:
            packet_id, length, is_gso, stamp, payload_off = _parse_packet(buf, body, off + mlen)
            packets.append((packet_id, length))
            stamps.append(stamp)
            gso += is_gso
            if destinations:
                dsts.append(ipv4_destination(buf, payload_off))
        elif mtype == NLMSG_ERROR:
            errors.append(_parse_error(buf, body, off + mlen, seq))
        elif mtype == NLMSG_DONE:
            break
        off += _align4(mlen)
    return ParsedBatch(packets, errors, gso, stamps, dsts)


def _parse_error(buf, start: int, end: int, seq: int) -> NetlinkError:
    if end - start < _NLMSGERR.size + NLMSG_HDRLEN:
        raise ValueError("truncated NLMSG_ERROR")
    err = _NLMSGERR.unpack_from(buf, start)[0]
    _l, orig_type, _f, orig_seq, _p = _NLMSGHDR.unpack_from(buf, start + _NLMSGERR.size)
    return NetlinkError(seq=orig_seq or seq, errno=-err, msg_type=orig_type)


# --- socket ------------------------------------------------------------------

def _hint(err: int, what: str) -> str:
    """Extra context for the confusing errnos a bind can return."""
    if what.startswith("bind") and err in (errno_mod.EPERM, errno_mod.EBUSY):
        return " (queue already bound by another socket, or not CAP_NET_ADMIN)"
    return ""
