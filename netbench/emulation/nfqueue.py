"""Minimal NFQUEUE client speaking nfnetlink_queue directly over AF_NETLINK: the socket.

Only what the delay engine needs: bind a queue, receive packet ids (and lengths, and with
``destinations`` each packet's IPv4 destination), and send single, batch or many verdicts. The wire layout (constants, pure encoders and parsers)
lives in netbench/emulation/netlink/nfqueue_wire.py and is re-exported here, so
``nfqueue.encode_verdict`` and friends keep working.
"""

from __future__ import annotations

import ctypes
import errno as errno_mod
import os
import socket

from netbench.emulation.netlink.nfqueue_wire import *  # noqa: F401,F403 - the wire layout, re-exported
from netbench.emulation.netlink.nfqueue_wire import _NLMSGHDR, _RECV_BUFSIZE, _hint  # noqa: F401


VERDICTS_PER_SEND = 1024  # 28 bytes each: one send stays well inside the socket's send buffer


class NfqueueSocket:
    """One bound NFQUEUE queue in the current network namespace.

    Usage::

        with NfqueueSocket(queue_num=3) as q:
            q.bind()
            for packet_id, length in q.receive():
                q.verdict(packet_id, NF_ACCEPT)

    ``receive`` is non-blocking (returns [] when nothing is pending); poll
    ``fileno()`` for readability.  Counters: ``enobufs`` (times the kernel
    reported the socket buffer overflowed, i.e. packets were lost),
    ``stale_verdicts`` (verdicts the kernel answered with ENOENT: the id was
    no longer queued, e.g. its device went away), ``gso_packets``.
    """

    def __init__(self, queue_num: int, copy_mode: int = NFQNL_COPY_PACKET,
                 copy_range: int = DEFAULT_COPY_RANGE,
                 maxlen: int = DEFAULT_QUEUE_MAXLEN, gso: bool = True,
                 rcvbuf_bytes: int = DEFAULT_RCVBUF_BYTES,
                 legacy_pf_bind: bool = False) -> None:
        if not 0 <= queue_num <= 0xFFFF:
            raise ValueError(f"queue_num must be 0..65535, got {queue_num}")
        self.queue_num = queue_num
        self.copy_mode = copy_mode
        self.copy_range = copy_range
        self.maxlen = maxlen
        self.gso = gso
        self.legacy_pf_bind = legacy_pf_bind
        self.enobufs = 0
        self.stale_verdicts = 0
        self.gso_packets = 0
        # True: recv_batch also reads each packet's IPv4 destination into last_destinations
        # (the copy range must reach past the IPv4 header: IPV4_HEADER_BYTES)
        self.destinations = False
        self.last_destinations: list = []
        self.last_timestamps: list = []
        self.bound = False
        self._seq = 0
        self._buf = bytearray(_RECV_BUFSIZE)
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW,
                                   NETLINK_NETFILTER)
        self._set_rcvbuf(rcvbuf_bytes)
        self._sock.bind((0, 0))  # kernel assigns our port id

    def _set_rcvbuf(self, nbytes: int) -> None:
        # FORCE bypasses net.core.rmem_max (root only); fall back silently
        # to the capped variant when unprivileged.
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, nbytes)
        except PermissionError:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, nbytes)

    def fileno(self) -> int:
        return self._sock.fileno()

    # -- config -----------------------------------------------------------
    def bind(self) -> None:
        """Bind the queue and apply copy mode, max length and flags."""
        q = self.queue_num
        if self.legacy_pf_bind:
            # Needed only before Linux 3.8; newer kernels ignore these.
            self._request(encode_config_cmd(q, NFQNL_CFG_CMD_PF_UNBIND,
                                            socket.AF_INET, self._next_seq()))
            self._request(encode_config_cmd(q, NFQNL_CFG_CMD_PF_BIND,
                                            socket.AF_INET, self._next_seq()))
        self._request(encode_config_cmd(q, NFQNL_CFG_CMD_BIND, 0, self._next_seq()),
                      what=f"bind queue {q}")
        self.bound = True
        self._request(encode_config_params(q, self.copy_mode, self.copy_range,
                                           self._next_seq()), what="set copy mode")
        self._request(encode_config_maxlen(q, self.maxlen, self._next_seq()),
                      what="set queue maxlen")
        flags = NFQA_CFG_F_GSO if self.gso else 0
        self._request(encode_config_flags(q, flags, NFQA_CFG_F_GSO, self._next_seq()),
                      what="set queue flags")
        self._sock.setblocking(False)

    def unbind(self) -> None:
        """Unbind; the kernel drops any packet still queued."""
        if not self.bound:
            return
        self._sock.setblocking(True)
        self._request(encode_config_cmd(self.queue_num, NFQNL_CFG_CMD_UNBIND, 0,
                                        self._next_seq()), what="unbind")
        self.bound = False

    def close(self) -> None:
        try:
            if self.bound:
                self.unbind()
        finally:
            self._sock.close()

    def __enter__(self) -> NfqueueSocket:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFF or 1
        return self._seq

    def _request(self, msg: bytes, what: str = "request") -> None:
        """Send a request with NLM_F_ACK and wait for its ACK (blocking)."""
        seq = _NLMSGHDR.unpack_from(msg, 0)[3]
        self._sock.sendall(msg)
        while True:
            nbytes = self._recv_blocking()
            batch = parse_messages(self._buf, nbytes)
            self._pending_packets_during_config(batch)
            for err in batch.errors:
                if err.seq != seq:
                    continue
                if err.errno:
                    raise NfqueueError(err.errno, f"nfqueue {what} failed: "
                                       f"{os.strerror(err.errno)}{_hint(err.errno, what)}")
                return

    def _recv_blocking(self) -> int:
        self._sock.settimeout(5.0)
        try:
            while True:
                try:
                    return self._sock.recv_into(self._buf)
                except OSError as exc:
                    if exc.errno != errno_mod.ENOBUFS:
                        raise
                    self.enobufs += 1
        except socket.timeout as exc:
            raise NfqueueError(errno_mod.ETIMEDOUT, "no ACK from nfnetlink_queue") from exc
        finally:
            self._sock.settimeout(None)

    def _pending_packets_during_config(self, batch: ParsedBatch) -> None:
        # Packets can only arrive after BIND; during setup/teardown we hand
        # them straight back to the stack rather than lose them.
        for packet_id, _length in batch.packets:
            self._sock.sendall(encode_verdict(self.queue_num, packet_id, NF_ACCEPT))

    # -- data path --------------------------------------------------------
    def recv_batch(self) -> list | None:
        """One non-blocking recv(): its packets, or None if nothing pending.

        Returns ``(packet_id, length)`` tuples in arrival order (possibly an
        empty list: an ACK, a stale-verdict error, or ENOBUFS - which is
        counted in ``enobufs`` and means the kernel lost packets).  ENOENT
        verdict errors are counted in ``stale_verdicts``; any other
        NLMSG_ERROR raises NfqueueError.
        """
        try:
            nbytes = self._sock.recv_into(self._buf)
        except BlockingIOError:
            return None
        except OSError as exc:
            if exc.errno == errno_mod.ENOBUFS:
                self.enobufs += 1
                return []
            raise
        batch = parse_messages(self._buf, nbytes, self.destinations)
        if batch.gso_packets:
            self.gso_packets += batch.gso_packets
        if batch.errors:
            self._handle_async_errors(batch.errors)
        self.last_timestamps = batch.timestamps
        self.last_destinations = batch.destinations
        return batch.packets

    def receive(self, max_messages: int = 1024) -> list:
        """Drain up to ``max_messages`` recv() calls without blocking."""
        packets: list = []
        for _ in range(max_messages):
            got = self.recv_batch()
            if got is None:
                break
            packets.extend(got)
        return packets

    def _handle_async_errors(self, errors: list) -> None:
        for err in errors:
            if err.errno == 0:
                continue
            if err.errno == errno_mod.ENOENT and err.msg_type in (
                    NFQNL_MSG_VERDICT, NFQNL_MSG_VERDICT_BATCH):
                self.stale_verdicts += 1
                continue
            raise NfqueueError(err.errno, f"nfqueue message type {err.msg_type:#x} "
                               f"failed: {os.strerror(err.errno)}")

    def verdict(self, packet_id: int, verdict: int) -> None:
        """Verdict for exactly one packet id (NF_ACCEPT or NF_DROP)."""
        self._send(encode_verdict(self.queue_num, packet_id, verdict))

    def verdict_batch(self, max_id: int, verdict: int) -> None:
        """Same verdict for every queued packet with id <= ``max_id``."""
        self._send(encode_verdict(self.queue_num, max_id, verdict, batch=True))

    def verdict_many(self, packet_ids: list, verdict: int) -> None:
        """``verdict`` for each of ``packet_ids`` (one message each), in as few sends as fit
        (VERDICTS_PER_SEND each): for packets released out of id order."""
        for start in range(0, len(packet_ids), VERDICTS_PER_SEND):
            self._send(encode_verdicts(self.queue_num, packet_ids[start:start + VERDICTS_PER_SEND], verdict))

    def _send(self, msg: bytes) -> None:
        # Netlink sends to the kernel are synchronous; EAGAIN here would only
        # mean memory pressure, so retry once in blocking mode.
        try:
            self._sock.send(msg)
        except BlockingIOError:
            self._sock.setblocking(True)
            try:
                self._sock.send(msg)
            finally:
                self._sock.setblocking(False)


# --- kernel-side counters ----------------------------------------------------

_PROC_QUEUE_FIELDS = ("queue_num", "peer_portid", "queue_total", "copy_mode",
                      "copy_range", "queue_dropped", "user_dropped", "id_sequence")


def parse_proc_queue(text: str, queue_num: int) -> dict | None:
    """Parse /proc/net/netfilter/nfnetlink_queue content for one queue.

    ``queue_total`` is packets currently held in the kernel queue,
    ``queue_dropped`` packets dropped because the queue was full (maxlen),
    ``user_dropped`` packets lost because the netlink socket buffer was full.
    """
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < len(_PROC_QUEUE_FIELDS):
            continue
        values = [int(f) for f in fields[:len(_PROC_QUEUE_FIELDS)]]
        if values[0] == queue_num:
            return dict(zip(_PROC_QUEUE_FIELDS, values))
    return None


def read_kernel_queue_stats(queue_num: int) -> dict | None:
    """Kernel counters for ``queue_num`` in the current network namespace."""
    try:
        with open("/proc/net/netfilter/nfnetlink_queue", encoding="ascii") as fh:
            return parse_proc_queue(fh.read(), queue_num)
    except (OSError, ValueError):
        return None


# --- process setup for the delay engine --------------------------------------

SO_TIMESTAMP_LINUX = 29  # asm-generic/socket.h; Python's socket module does not export it
PR_SET_TIMERSLACK = 29


def enable_kernel_timestamps():
    """Ask the kernel to timestamp received packets, so queued packets carry NFQA_TIMESTAMP.

    Forwarded packets get a receive timestamp only while some socket on the host has asked
    for timestamps; one UDP socket with SO_TIMESTAMP, held open, is enough. Returns it.
    """
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_TIMESTAMP", SO_TIMESTAMP_LINUX), 1)
        return sock
    except OSError:
        return None  # best effort: without it arrival is when the engine reads the packet


def reduce_timer_slack() -> None:
    """Ask for 1 us timer slack (default 50 us) so select() wakes on time."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)  # nanoseconds
    except (OSError, AttributeError):
        pass  # best effort: only costs ~50 us of precision


def set_rt_priority(priority: int) -> None:
    """SCHED_FIFO at ``priority`` (1..99); 0 leaves normal scheduling."""
    if priority:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
