"""The delay engine's per-destination scheduler (pure: no I/O, injected times).

One queue per destination IPv4 address, each with its own delay, jitter, loss and rate
(delay_queue.DestParams); destinations not in the table get the default (EngineParams'
delay/jitter/loss), or pass unshaped when that is all zero.

* A packet to a far destination never holds back one to a near destination: each queue
  releases on its own, and :meth:`PairScheduler.due` merges the queues' heads (a heap with
  one entry per non-empty queue: its head's release time).
* Within a destination nothing is reordered (``release_i >= release_{i-1}``), as in the
  single-profile DelayScheduler.
* Rate: a serialization clock per destination, as a link of that rate: a packet starts
  sending when it arrives or when the one before it is sent, whichever is later, takes
  ``bytes * 8 / rate`` to send, then the delay. So ``release = max(arrival, free) +
  size*8/rate + delay``. A packet that would take the destination's held bytes past its
  limit (its bandwidth-delay product plus RATE_QUEUE_S of the rate) is dropped (overlimit).
* Releases are no longer in packet-id order, so the engine sends one verdict per packet
  (several in one send) instead of the batch verdict "accept every id <= N".
* A change of table (:meth:`set_table`) keeps every held packet's release time.
"""

from __future__ import annotations

import collections
import heapq
import ipaddress
import random

from netbench.emulation.delay_queue import DelayScheduler, DestParams, EngineParams, LatenessStats

RATE_QUEUE_S = 0.05  # queueing a rate-limited destination allows beyond its BDP (as the tbf: 50 ms)
MIN_LIMIT_BYTES = 2 * 65536  # two GSO super-packets
UNKNOWN = -1  # the queue of packets whose destination could not be read (not IPv4)
ADOPTED = -2  # the queue of packets held by the scheduler this one took over from


def limit_bytes(params: DestParams) -> int | None:
    """A rate-limited destination's queue limit: its BDP plus RATE_QUEUE_S of its rate; None
    without a rate (the kernel queue's maxlen bounds it)."""
    if params.rate_bps is None:
        return None
    seconds = (params.delay_us + params.jitter_us) / 1e6 + RATE_QUEUE_S
    return max(MIN_LIMIT_BYTES, int(params.rate_bps / 8 * seconds))


class DestQueue:
    """One destination's held packets and counters."""

    __slots__ = ("key", "params", "held", "last_release", "free_s", "held_bytes", "limit", "rng",
                 "delay_s", "jitter_s", "loss", "byte_s", "packets", "accepted", "dropped", "overlimits",
                 "max_depth")

    def __init__(self, key: int, params: DestParams | None, seed: int, floor_s: float) -> None:
        self.key = key
        self.held: collections.deque = collections.deque()  # (release_s, packet_id, bytes)
        self.last_release = floor_s
        self.free_s = float("-inf")
        self.held_bytes = 0
        self.packets = self.accepted = self.dropped = self.overlimits = self.max_depth = 0
        self.configure(params, seed)

    def configure(self, params: DestParams | None, seed: int) -> None:
        """New parameters for arrivals from now on (a generator seeded afresh per destination)."""
        self.params = params
        self.rng = random.Random(f"{seed}/{self.key}")
        self.delay_s = params.delay_us / 1e6 if params else 0.0
        self.jitter_s = params.jitter_us / 1e6 if params else 0.0
        self.loss = float(params.loss) if params else 0.0
        self.byte_s = 8 / params.rate_bps if params and params.rate_bps else 0.0
        self.limit = limit_bytes(params) if params else None

    def counters(self) -> dict:
        return {"packets": self.packets, "accepted": self.accepted, "dropped": self.dropped,
                "overlimits": self.overlimits, "queue_depth": len(self.held), "max_queue_depth": self.max_depth}


def _as_dest(params: EngineParams) -> DestParams | None:
    """The table's default as a DestParams, or None when it passes unshaped."""
    if not (params.delay_us or params.jitter_us or params.loss):
        return None
    return DestParams("0.0.0.0", params.delay_us, params.jitter_us, params.loss)


class PairScheduler:
    """Per-destination drop / release decisions (see the module docstring).

    :meth:`arrive` for each packet in kernel queue order (with its destination, the IPv4
    header's big-endian u32, and its length), then :meth:`due` with the current time for
    the ids to accept, in release order.
    """

    def __init__(self, params: EngineParams) -> None:
        self._queues: dict[int, DestQueue] = {}
        self._heap: list[tuple[float, int]] = []  # (head release, key): one per non-empty queue
        self._immediate: list[int] = []  # unshaped packets to accept at the next due()
        self._floor_s = float("-inf")
        self._held = 0
        self.max_depth = 0
        self.released = 0
        self.dropped = 0
        self.overlimits = 0
        self.passed = 0
        self.lateness = LatenessStats()
        self.set_params(params)

    def set_params(self, params: EngineParams) -> None:
        """Use ``params``' table (and default) for arrivals from now on; held packets keep their
        release time, and no later arrival to a destination is released before them."""
        self.params = params
        self._table = {pair.key: pair for pair in params.pairs}
        self._default = _as_dest(params)
        for key, queue in list(self._queues.items()):
            queue.configure(self._params_for(key), params.seed)
            if queue.params is None and not queue.held and key not in self._table:
                del self._queues[key]  # nothing to keep: its counters start afresh if shaped again

    def _params_for(self, key: int) -> DestParams | None:
        if key == ADOPTED:
            return None
        return self._table.get(key, self._default)

    def adopt(self, old: DelayScheduler) -> None:
        """Take over the packets `old` holds (their release times kept, released by id) and its
        counters; nothing arriving from now on is released before `old`'s last release."""
        self._floor_s = old.last_release_s
        self.released, self.dropped, self.max_depth = old.released, old.dropped, old.max_depth
        self.lateness = old.lateness
        held = old.held_packets()
        if held:
            queue = DestQueue(ADOPTED, None, self.params.seed, self._floor_s)
            queue.held.extend((release, packet_id, 0) for release, packet_id in held)
            self._queues[ADOPTED] = queue
            self._held += len(held)
            heapq.heappush(self._heap, (held[0][0], ADOPTED))

    def __len__(self) -> int:
        """Number of packets currently held."""
        return self._held

    def arrive(self, packet_id: int, arrival_s: float, dst: int, length: int) -> float | None:
        """Register a packet to `dst` (UNKNOWN when not read) of `length` bytes; its release time
        (s), or None to drop it."""
        queue = self._queues.get(dst)
        if queue is None:
            params = self._table.get(dst, self._default)
            if params is None and arrival_s >= self._floor_s:  # unshaped, nothing held for it: out at once
                self._immediate.append(packet_id)
                self.passed += 1
                return arrival_s
            # (unshaped before an adopted scheduler's last release: queued until then, in order)
            queue = self._queues[dst] = DestQueue(dst, params, self.params.seed, self._floor_s)
        queue.packets += 1
        if queue.loss and queue.rng.random() < queue.loss:
            queue.dropped += 1
            self.dropped += 1
            return None
        length = max(length, 0)
        if queue.limit is not None and queue.held_bytes + length > queue.limit and queue.held:
            queue.overlimits += 1
            self.overlimits += 1
            return None
        start = arrival_s
        if queue.byte_s:
            if queue.free_s > start:
                start = queue.free_s
            start += length * queue.byte_s
            queue.free_s = start
        delay = queue.delay_s
        if queue.jitter_s:
            delay = max(0.0, delay + queue.rng.uniform(-queue.jitter_s, queue.jitter_s))
        release = start + delay
        if release < queue.last_release:
            release = queue.last_release
        queue.last_release = release
        held = queue.held
        if not held:
            heapq.heappush(self._heap, (release, dst))
        held.append((release, packet_id, length))
        queue.held_bytes += length
        if len(held) > queue.max_depth:
            queue.max_depth = len(held)
        self._held += 1
        if self._held > self.max_depth:
            self.max_depth = self._held
        return release

    def next_release_time(self) -> float | None:
        """The earliest release time held (-inf when an unshaped packet waits), or None."""
        if self._immediate:
            return float("-inf")
        return self._heap[0][0] if self._heap else None

    def due(self, now_s: float) -> list[int]:
        """Pop every packet whose release time is <= now_s; their ids, in release order per
        destination (the caller accepts each right away; lateness is recorded here)."""
        out = self._immediate
        self._immediate = []
        heap = self._heap
        if not heap or heap[0][0] > now_s:
            return out
        late, queues = self.lateness, self._queues
        count = 0
        while heap and heap[0][0] <= now_s:
            _, key = heapq.heappop(heap)
            queue = queues[key]
            held = queue.held
            while held and held[0][0] <= now_s:
                release, packet_id, length = held.popleft()
                out.append(packet_id)
                queue.held_bytes -= length
                late.record(now_s - release)
                queue.accepted += 1
                count += 1
            if held:
                heapq.heappush(heap, (held[0][0], key))
            elif queue.params is None and key not in self._table:
                del queues[key]  # an unshaped destination's queue lives only while it holds packets
        self._held -= count
        self.released += count
        return out

    def flush(self) -> list[int]:
        """Pop everything regardless of time (shutdown): every held id."""
        out = self._immediate
        self._immediate = []
        for queue in self._queues.values():
            out.extend(packet_id for _, packet_id, _ in queue.held)
            queue.accepted += len(queue.held)
            self.released += len(queue.held)
            queue.held.clear()
            queue.held_bytes = 0
        self._heap.clear()
        self._held = 0
        return out

    def table_stats(self) -> list[dict]:
        """One row per table entry, in table order: its parameters and counters."""
        rows = []
        for pair in self.params.pairs:
            queue = self._queues.get(pair.key)
            counters = queue.counters() if queue else DestQueue(pair.key, None, 0, 0.0).counters()
            rows.append({**pair.as_dict(), **counters})
        return rows


def dst_text(key: int) -> str:
    """A destination key back in dotted form ("" for UNKNOWN/ADOPTED)."""
    return str(ipaddress.IPv4Address(key)) if key >= 0 else ""
