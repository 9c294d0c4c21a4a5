"""Gloo's ring all-reduce (PyTorch's CPU collectives), replayed event by event (pure).

torch's ProcessGroupGloo runs ``gloo::allreduce`` with its ring algorithm (gloo/allreduce.cc):

* the buffer is cut into segments of at most 1 MiB, at least 2 per rank and a multiple of the
  ranks, so each rank owns ``segments / W`` of them;
* a reduce-scatter and then an all-gather, each ``segments - segments / W`` iterations; rank r
  receives from r + 1 and sends to r - 1; an iteration first waits for the receive and the send
  it issued two iterations before (two segments in flight), then issues the next pair;
* the TCP transport sends an unbound buffer only once the receiver has said it posted the
  receive (gloo/transport/tcp/pair.cc: NOTIFY_RECV_READY): a segment waits for that note,
  one way across the hop, then for its bytes and the hop's delay.

So a ring's round trips overlap its transfers: with two segments in flight a rate-limited link
keeps sending while the next note crosses, and a latency-bound ring pays about one round trip
per two segments. ``allreduce_s`` replays that schedule on the point's links: each node's egress
is one queue at the link's rate (data and notes in the order they were sent), then the
configured one-way delay; ranks of one node talk over its loopback (no delay, the measured
per-byte cost). Nothing here is fitted: the segment rule and the pipelining are gloo's.
"""

from __future__ import annotations

import heapq
from functools import lru_cache
from dataclasses import dataclass

MAX_SEGMENT_BYTES = 1 << 20  # gloo's AllreduceOptions kMaxSegmentSize
ELEMENT_BYTES = 4  # float32 gradients
NOTE_BYTES = 64  # a NOTIFY_RECV_READY: the op's preamble and TCP/IP's headers


@dataclass(frozen=True)
class Links:
    """The ring's paths: ranks numbered node-major, `ranks_per_node` a node. A hop between two
    nodes queues on the sender's egress at `wire_s_per_byte` and then takes `one_way_s`; a hop
    inside a node costs `local_s_per_byte` (its loopback; no queue, no delay)."""

    ranks: int
    ranks_per_node: int
    one_way_s: float
    wire_s_per_byte: float
    local_s_per_byte: float

    def node(self, rank: int) -> int:
        return rank // max(1, self.ranks_per_node)


def segments(total_bytes: float, ranks: int) -> tuple[int, float]:
    """gloo's segment count and size for a buffer of `total_bytes` over `ranks` ranks."""
    count = max(-(-int(total_bytes) // MAX_SEGMENT_BYTES), 2 * ranks)
    count = -(-count // ranks) * ranks
    size = -(-int(total_bytes) // count)
    return count, float(-(-size // ELEMENT_BYTES) * ELEMENT_BYTES)


@lru_cache(maxsize=4096)  # a sweep asks for the same few rings point after point
def allreduce_s(total_bytes: float, links: Links) -> float:
    """Seconds from the first rank's start to the last rank's end of one ring all-reduce of
    `total_bytes`, every rank starting at 0."""
    w = links.ranks
    if w < 2 or total_bytes <= 0:
        return 0.0
    count, seg = segments(total_bytes, w)
    per_phase = count - count // w  # segments each rank sends in a phase
    return _Replay(links, per_phase, seg).run()


class _Replay:
    """The schedule of every rank's iterations (two phases of per_phase + 2 each), sends and
    notes, in time order; each node's egress a first-in first-out queue."""

    def __init__(self, links: Links, per_phase: int, seg: float) -> None:
        self.links, self.per_phase, self.seg = links, per_phase, seg
        self.iters = 2 * (per_phase + 2)
        self.events: list[tuple[float, int, str, int, int]] = []
        self.order = 0
        self.next_iter = [0] * links.ranks
        self.started: dict[tuple[int, int], float] = {}
        self.recv_done: dict[tuple[int, int], float] = {}  # (rank, op): its segment arrived
        self.note_in: dict[tuple[int, int], float] = {}  # (sender, op): the receiver's note arrived
        self.sent: dict[tuple[int, int], float] = {}  # (rank, op): handed to its socket
        self.egress_free = [0.0] * (links.node(links.ranks - 1) + 1)
        self.end = 0.0

    def _op(self, it: int) -> int | None:
        """The send/receive an iteration issues (numbered over both phases), None if it issues none."""
        phase, i = divmod(it, self.per_phase + 2)
        return phase * self.per_phase + i if i < self.per_phase else None

    def _waits_on(self, it: int) -> int | None:
        phase, i = divmod(it, self.per_phase + 2)
        return phase * self.per_phase + i - 2 if i >= 2 else None

    def _push(self, t: float, kind: str, rank: int, op: int) -> None:
        self.order += 1
        heapq.heappush(self.events, (t, self.order, kind, rank, op))

    def _transfer(self, t: float, src: int, dst: int, nbytes: float) -> float:
        """When `nbytes` handed over at `t` from rank src reach rank dst."""
        links = self.links
        if links.node(src) == links.node(dst):
            return t + nbytes * links.local_s_per_byte
        node = links.node(src)
        start = max(t, self.egress_free[node])
        self.egress_free[node] = start + nbytes * max(links.wire_s_per_byte, links.local_s_per_byte)
        return self.egress_free[node] + links.one_way_s

    def _try_start(self, rank: int, t: float) -> None:
        it = self.next_iter[rank]
        if it >= self.iters:
            return
        wait = self._waits_on(it)
        if wait is not None and ((rank, wait) not in self.recv_done or (rank, wait) not in self.sent):
            return
        when = max(t, self.recv_done.get((rank, wait), t), self.sent.get((rank, wait), t))
        self.next_iter[rank] = it + 1
        self.end = max(self.end, when)
        op = self._op(it)
        if op is not None:
            w = self.links.ranks
            self.started[(rank, op)] = when
            self._push(self._transfer(when, rank, (rank + 1) % w, NOTE_BYTES), "note", (rank + 1) % w, op)
            self._try_send(rank, op, when)
        self._try_start(rank, when)

    def _try_send(self, rank: int, op: int, t: float) -> None:
        if (rank, op) in self.started and (rank, op) in self.note_in and (rank, op) not in self.sent:
            when = max(self.started[(rank, op)], self.note_in[(rank, op)], t)
            self.sent[(rank, op)] = when
            dst = (rank - 1) % self.links.ranks
            self._push(self._transfer(when, rank, dst, self.seg), "data", dst, op)
            self._try_start(rank, when)

    def run(self) -> float:
        for rank in range(self.links.ranks):
            self._try_start(rank, 0.0)
        while self.events:
            t, _, kind, rank, op = heapq.heappop(self.events)
            if kind == "note":  # rank may now send op to the note's sender
                self.note_in[(rank, op)] = t
                self._try_send(rank, op, t)
            else:
                self.recv_done[(rank, op)] = t
                self._try_start(rank, t)
        if any(it < self.iters for it in self.next_iter):
            raise RuntimeError("ring replay stalled")  # a bug in the schedule, never a slow link
        return self.end
