"""Per-namespace delay engine: delay, jitter, loss (and per destination, rate) via NFQUEUE.

The node's iptables rule sends egress packets to NFQUEUE ``N``; this process
binds queue ``N`` in the same network namespace, holds every packet for its
scheduled delay and then accepts it, or drops it at arrival with probability
``loss``.

Design notes
------------
* The schedulers are pure (no I/O, injected times) so they are unit testable:
  delay_queue.DelayScheduler for one profile (releases in arrival order, one
  batch verdict "accept every id <= N" per wakeup: the fast path), and
  pair_queue.PairScheduler for a per-destination table (a queue per destination
  IPv4 address, each with its delay, jitter, loss and rate: a packet to a far
  peer never holds back one to a near peer; one verdict per packet, sent
  together). An engine switches between them in place when its parameters gain
  or lose a table; held packets keep their release times.
* Dropped packets get an individual NF_DROP verdict at arrival, which
  removes them from the kernel queue, so later batch accepts never touch
  them.

Command line::

    python -m netbench.emulation.engine --queue-num N --delay-us D
        [--jitter-us J] [--loss RATIO] [--seed S] [--stats-file PATH]
        [--maxlen N] [--spin-us US] [--rt-priority P] [--control PATH]
        [--pairs-file PATH]

``--pairs-file PATH``: JSON ``{"pairs": [{"dst": "10.213.0.3", "delay_us": 25000,
"jitter_us": 0, "loss": 0.001, "rate_bps": 1000000000}, ...]}``, a per-destination
table; --delay-us/--jitter-us/--loss (default 0 with a table: unshaped) are then the
default of destinations not in it.
Once bound it prints one JSON line ``{"event": "ready", ...}`` to stdout.
``--control PATH``: a unix datagram socket that changes the parameters in place
(engine_control.py); a change applies to packets arriving after it.
SIGTERM/SIGINT accept every held packet, write final stats, unbind, exit 0.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass, field

from netbench.emulation import engine_control, nfqueue
from netbench.emulation.delay_queue import (  # noqa: F401 - re-exported: the engine's parameters
    DelayScheduler, DestParams, EngineParams, LatenessStats)
from netbench.emulation.engine_args import DEFAULT_SPIN_US, build_parser, parse_args  # noqa: F401 - re-exported
from netbench.emulation.pair_queue import PairScheduler

STATS_INTERVAL_S = 1.0
# after a change through the control channel the stats (hence `netbench show`) say so this
# much later, not before the reply: a schedule changes every engine of a testbed at once, and
# 64 stats files written at real-time priority while the controller waits for the replies
# tripled the time a change took (a file's replace costs 0.2-2 ms on this disk)
STATS_AFTER_SET_S = 0.03
# recv() calls per readability event before we look at due releases again;
# bounds how long a burst of arrivals can postpone a release.
MAX_RECV_PER_WAKEUP = 128
MAX_STAMP_LAG_S = 0.05  # trust a kernel receive timestamp at most this far in the past
CONTROL_POLL_S = 0.001  # while spinning, look at the control socket this often


@dataclass
class EngineCounters:
    """Counters not owned by the scheduler or the socket."""

    received: int = 0
    reconfigurations: int = 0
    started_wall: float = field(default_factory=time.time)
    started_mono: float = field(default_factory=time.monotonic)


class DelayEngine:
    """Binds one NFQUEUE queue and runs the scheduler against it.

    Timing: select() sleeps until ``spin_us`` before the next release and
    then busy-polls (select with timeout 0), because timer wakeups on this
    VM overshoot by ~50-150 us (median) with a tail to several ms.  Spinning
    costs up to ``spin_us`` CPU per release wakeup (~10% of a core at 1k
    releases/s with the 100 us default); ``spin_us=0`` disables it.
    Arrival time is when the engine reads the message (the kernel gives no
    timestamp for locally generated egress packets), so a descheduled engine
    delays packets further; ``--rt-priority`` (SCHED_FIFO) helps on a busy
    host.
    """

    def __init__(self, params: EngineParams, queue_num: int,
                 maxlen: int = nfqueue.DEFAULT_QUEUE_MAXLEN,
                 stats_file: str | None = None, spin_us: int = DEFAULT_SPIN_US,
                 control_path: str | None = None) -> None:
        self.params = params
        self.control_path = control_path
        self._control: engine_control.ControlSocket | None = None
        self.spin_s = spin_us / 1e6
        self.queue_num = queue_num
        self.maxlen = maxlen
        self.stats_file = stats_file
        self.scheduler: DelayScheduler | PairScheduler = (
            PairScheduler(params) if params.pairs else DelayScheduler(params))
        self._verdicts_per_packet = bool(params.pairs)  # PairScheduler: releases out of id order
        self._drops: list[int] = []  # per-packet mode: drop verdicts to send with the next release
        self.counters = EngineCounters()
        self._queue: nfqueue.NfqueueSocket | None = None
        self._stop = False
        self.stats_due: float | None = None  # monotonic time of the stats write a change asked for

    # -- lifecycle ----------------------------------------------------------
    def run(self, on_ready=None) -> None:
        """Bind, call ``on_ready()``, loop until stopped, then hand back."""
        self._queue = nfqueue.NfqueueSocket(self.queue_num, maxlen=self.maxlen)
        self._queue.destinations = self._verdicts_per_packet
        try:
            self._queue.bind()
            if self.control_path:
                self._control = engine_control.ControlSocket(self.control_path)
            wake_r = self._install_signal_wakeup()
            if on_ready is not None:
                on_ready()
            self._loop(wake_r)
            self._shutdown()
        finally:
            if self._control is not None:
                self._control.close()
            self._queue.close()

    def stop(self) -> None:
        """Ask the loop to finish (safe from a signal handler)."""
        self._stop = True

    def _install_signal_wakeup(self) -> socket.socket:
        # set_wakeup_fd makes select() return on a signal; without it PEP 475
        # retries select() with the old timeout and shutdown would wait.
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        self._wake = (wake_r, wake_w)
        signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda _s, _f: self.stop())
        return wake_r

    # -- main loop ----------------------------------------------------------
    def _loop(self, wake_r: socket.socket) -> None:
        qfd = self._queue.fileno()
        control = self._control
        fds = [qfd, wake_r] + ([control.fileno()] if control else [])
        clock = time.monotonic
        next_stats = next_control = clock() + STATS_INTERVAL_S
        while not self._stop:
            now = clock()
            stats_at = self.stats_at(next_stats)
            if now >= stats_at:
                self.write_stats(final=False)
                next_stats, self.stats_due = now + STATS_INTERVAL_S, None
                stats_at = next_stats
            timeout = self._timeout_s(now, stats_at)
            if timeout > self.spin_s:
                # Sleep until spin_s before the deadline; the rest is spent
                # polling (timeout 0) because VM timer wakeups overshoot by
                # ~0.1-1 ms.
                ready, _, _ = select.select(fds, [], [], timeout - self.spin_s)
                if wake_r in ready:
                    _drain_wakeup(wake_r)
                if control and control.fileno() in ready:
                    self._serve_control()
            elif control and now >= next_control:  # spinning: still answer within ~1 ms
                self._serve_control()
                next_control = now + CONTROL_POLL_S
            self._ingest()
            self._release(clock())

    def _serve_control(self) -> None:
        # packets already queued arrived before the change: they get the old parameters
        self._ingest()
        if engine_control.serve_pending(self._control, lambda: self.params, self.set_params) and self.stats_due is None:
            self.stats_due = time.monotonic() + STATS_AFTER_SET_S  # the loop writes them (see STATS_AFTER_SET_S)

    def stats_at(self, next_stats: float) -> float:
        """When the loop writes the stats next: at `next_stats` (every STATS_INTERVAL_S), or
        sooner where a change asked for them (stats_due)."""
        return next_stats if self.stats_due is None else min(next_stats, self.stats_due)

    def set_params(self, params: EngineParams) -> None:
        """Change the parameters in place (packets arriving from now on); the stats say so
        STATS_AFTER_SET_S after the control channel's reply (the loop writes them).

        Held packets keep their release time, whichever scheduler takes over: a table
        arriving turns a DelayScheduler into a PairScheduler (which releases what the old one
        held); a table leaving keeps the PairScheduler (every destination on the one profile)
        until it has released everything, then the fast DelayScheduler takes over."""
        self.params = params
        old = self.scheduler
        if params.pairs and isinstance(old, DelayScheduler):
            self._verdicts_per_packet = True  # before the batch verdicts stop: none may accept a new packet
            if self._queue is not None:
                self._queue.destinations = True
            new = PairScheduler(params)
            new.adopt(old)
            _carry_counters(old, new)
            self.scheduler = new
        else:
            old.set_params(params)
        self.counters.reconfigurations += 1

    def _back_to_one_profile(self) -> None:
        """The table is gone and the PairScheduler holds nothing: the fast path takes over."""
        old = self.scheduler
        new = DelayScheduler(self.params)
        _carry_counters(old, new)
        self.scheduler = new
        self._verdicts_per_packet = False
        if self._queue is not None:
            self._queue.destinations = False

    def _timeout_s(self, now: float, next_stats: float) -> float:
        """Seconds until the next release (or stats write), >= 0."""
        nxt = self.scheduler.next_release_time()
        deadline = next_stats if nxt is None else min(nxt, next_stats)
        return max(0.0, deadline - now)

    def _ingest(self) -> None:
        """Read pending queue messages, timestamping each recv(); drop losers."""
        if self._verdicts_per_packet:
            self._ingest_pairs()
            return
        q, sched, clock = self._queue, self.scheduler, time.monotonic
        for _ in range(MAX_RECV_PER_WAKEUP):
            packets = q.recv_batch()
            if packets is None:
                return
            stamps = getattr(q, "last_timestamps", None) or ()
            wall, now = _clocks(clock, stamps)
            for index, (packet_id, _length) in enumerate(packets):
                self.counters.received += 1
                arrival = _arrival(now, wall, stamps[index] if index < len(stamps) else None)
                if sched.arrive(packet_id, arrival) is None:
                    q.verdict(packet_id, nfqueue.NF_DROP)

    def _ingest_pairs(self) -> None:
        """_ingest for the PairScheduler: each packet to its destination's queue."""
        q, sched, clock, drops = self._queue, self.scheduler, time.monotonic, self._drops
        for _ in range(MAX_RECV_PER_WAKEUP):
            packets = q.recv_batch()
            if packets is None:
                return
            stamps = q.last_timestamps
            dsts = q.last_destinations
            wall, now = _clocks(clock, stamps)
            for index, (packet_id, length) in enumerate(packets):
                self.counters.received += 1
                arrival = _arrival(now, wall, stamps[index] if index < len(stamps) else None)
                dst = dsts[index] if index < len(dsts) else -1
                if sched.arrive(packet_id, arrival, dst, length) is None:
                    drops.append(packet_id)

    def _release(self, now: float) -> None:
        if self._verdicts_per_packet:
            self._release_pairs(self.scheduler.due(now))
            return
        last_id = self.scheduler.due(now)
        if last_id is not None:
            self._queue.verdict_batch(last_id, nfqueue.NF_ACCEPT)

    def _release_pairs(self, ids: list[int]) -> None:
        if self._drops:
            self._queue.verdict_many(self._drops, nfqueue.NF_DROP)
            self._drops = []
        if ids:
            self._queue.verdict_many(ids, nfqueue.NF_ACCEPT)
        if not self.params.pairs and not len(self.scheduler):
            self._back_to_one_profile()

    def _shutdown(self) -> None:
        """Accept everything held or still pending, write final stats."""
        self._ingest_all_pending()
        if self._verdicts_per_packet:
            self._release_pairs(self.scheduler.flush())
        else:
            last_id = self.scheduler.flush()
            if last_id is not None:
                self._queue.verdict_batch(last_id, nfqueue.NF_ACCEPT)
        self.write_stats(final=True)

    def _ingest_all_pending(self, max_rounds: int = 64) -> None:
        # Loss still applies to packets that arrived before the signal.
        # Bounded: under continuous traffic the socket never runs dry, and
        # whatever arrives after this is dropped by the kernel on unbind.
        for _ in range(max_rounds):
            before = self.counters.received
            self._ingest()
            if self.counters.received == before:
                return

    # -- stats --------------------------------------------------------------
    def stats(self, final: bool = False) -> dict:
        """Snapshot of counters as a JSON-able dict.

        Counts are packets since start: ``received`` (queued to us),
        ``accepted`` (released by verdict), ``dropped`` (loss verdicts),
        ``enobufs`` (socket overflows: the kernel lost packets),
        ``stale_verdicts`` (verdicts for ids the kernel no longer held),
        ``gso_packets`` (GSO super-packets seen), ``queue_depth`` /
        ``max_queue_depth`` (held now / at most), ``lateness_us`` (verdict
        time minus scheduled release: count, mean, max in microseconds),
        ``kernel`` (/proc/net/netfilter/nfnetlink_queue row: queue_total,
        queue_dropped (maxlen overflow), user_dropped, ...; None if absent).
        ``started_at`` / ``updated_at`` are wall-clock epoch seconds.
        ``params``: delay_us, jitter_us, loss, seed: the one profile, or with a
        table the default of destinations not in it (all zero: unshaped).
        With a per-destination table, also ``pairs`` (one row per destination,
        in table order: ``{"dst": "10.213.0.3", "delay_us", "jitter_us",
        "loss", "rate_bps" (None: unlimited), "packets", "accepted",
        "dropped" (loss), "overlimits" (its queue limit), "queue_depth",
        "max_queue_depth"}``), ``overlimits`` and ``passed`` (released
        unshaped). The ready line carries ``pairs`` (the parameters only).
        """
        sched, q = self.scheduler, self._queue
        return {
            "pid": os.getpid(),
            "queue_num": self.queue_num,
            "params": self.params.profile_dict(),
            "maxlen": self.maxlen,
            "spin_us": round(self.spin_s * 1e6),
            "received": self.counters.received,
            "reconfigurations": self.counters.reconfigurations,
            "control": self.control_path,
            "accepted": sched.released,
            "dropped": sched.dropped,
            "enobufs": q.enobufs if q else 0,
            "stale_verdicts": q.stale_verdicts if q else 0,
            "gso_packets": q.gso_packets if q else 0,
            "queue_depth": len(sched),
            "max_queue_depth": sched.max_depth,
            "lateness_us": sched.lateness.as_dict_us(),
            "kernel": nfqueue.read_kernel_queue_stats(self.queue_num),
            "started_at": self.counters.started_wall,
            "updated_at": time.time(),
            "uptime_s": round(time.monotonic() - self.counters.started_mono, 3),
            "final": final,
            **self._table_stats(),
        }

    def _table_stats(self) -> dict:
        """With a per-destination table: "pairs", one row per destination (dst, delay_us,
        jitter_us, loss, rate_bps; its packets, accepted, dropped (loss), overlimits (queue
        limit), queue_depth, max_queue_depth), "overlimits" and "passed" (released unshaped:
        destinations not in the table, with an all-zero default)."""
        sched = self.scheduler
        if not self.params.pairs or not isinstance(sched, PairScheduler):
            return {}
        return {"pairs": sched.table_stats(), "overlimits": sched.overlimits, "passed": sched.passed}

    def write_stats(self, final: bool) -> None:
        """Atomically replace ``stats_file`` with the current snapshot."""
        if not self.stats_file:
            return
        write_json_atomic(self.stats_file, self.stats(final))


def _carry_counters(old, new) -> None:
    """A scheduler taking over keeps the totals of the one before it."""
    new.released, new.dropped, new.max_depth, new.lateness = old.released, old.dropped, old.max_depth, old.lateness


def _clocks(clock, stamps) -> tuple[float, float]:
    """(wall, monotonic) now, to turn kernel stamps into arrivals: the wall clock read first, so
    a pause between the two reads (the engine descheduled) makes arrivals later, never earlier
    (read the other way round, a 0.7 ms pause released a packet 0.7 ms early)."""
    wall = time.time() if stamps else 0.0
    return wall, clock()


def _arrival(now: float, wall: float, stamp: float | None) -> float:
    """A packet's arrival on the monotonic clock: the kernel's receive time `stamp` (wall
    clock) where there is one, so our own wake-up latency does not add to the delay; clamped,
    so a wall-clock step can never push a packet far off."""
    return now if stamp is None else now - min(max(wall - stamp, 0.0), MAX_STAMP_LAG_S)


def write_json_atomic(path: str, data: dict) -> None:
    """Write JSON to a temp file in the same directory, then os.replace."""
    tmp = f"{path}.tmp.{os.getpid()}"
    text = json.dumps(data, sort_keys=True) + "\n"  # one write: json.dump writes each token
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _drain_wakeup(sock: socket.socket) -> None:
    try:
        while sock.recv(512):
            pass
    except BlockingIOError:
        pass


def main(argv: list[str] | None = None) -> int:
    args, params = parse_args(sys.argv[1:] if argv is None else argv)
    engine = DelayEngine(params, args.queue_num, args.maxlen, args.stats_file,
                         args.spin_us, args.control)
    nfqueue.reduce_timer_slack()
    stamp_switch = nfqueue.enable_kernel_timestamps()  # noqa: F841 - held open: the kernel stamps while any socket asks
    try:
        nfqueue.set_rt_priority(args.rt_priority)
    except OSError as exc:
        print(f"netbench-engine: error: cannot set SCHED_FIFO: {exc}", file=sys.stderr)
        return 1

    def ready() -> None:
        line = {"event": "ready", "pid": os.getpid(), "queue_num": args.queue_num,
                "params": params.profile_dict(), "maxlen": args.maxlen,
                **({"pairs": [pair.as_dict() for pair in params.pairs]} if params.pairs else {}),
                "spin_us": args.spin_us, "stats_file": args.stats_file, "control": args.control}
        print(json.dumps(line, sort_keys=True), flush=True)

    try:
        engine.run(on_ready=ready)
    except (OSError, ValueError) as exc:
        print(f"netbench-engine: error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
