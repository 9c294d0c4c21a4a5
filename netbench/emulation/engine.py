"""Per-namespace delay engine: delay, jitter and loss via NFQUEUE.

The node's iptables rule sends egress packets to NFQUEUE ``N``; this process
binds queue ``N`` in the same network namespace, holds every packet for its
scheduled delay and then accepts it, or drops it at arrival with probability
``loss``.

Design notes
------------
* :class:`DelayScheduler` is pure (no I/O, injected times) so it is unit
  testable.  All times are ``time.monotonic()`` seconds (float); parameters
  are integer microseconds.
* NO REORDERING: a packet is never released before the packet queued before
  it (``release_i = max(release_i, release_{i-1})``).  Jitter therefore
  stretches gaps instead of reordering, like netem when a rate is set.  This
  is what makes the kernel's batch verdict ("accept every id <= N") valid:
  one verdict per wakeup instead of one per packet keeps a Python engine
  fast.
* Dropped packets get an individual NF_DROP verdict at arrival, which
  removes them from the kernel queue, so later batch accepts never touch
  them.

Command line::

    python -m netbench.emulation.engine --queue-num N --delay-us D
        [--jitter-us J] [--loss RATIO] [--seed S] [--stats-file PATH]
        [--maxlen N] [--spin-us US] [--rt-priority P] [--control PATH]

Once bound it prints one JSON line ``{"event": "ready", ...}`` to stdout.
``--control PATH``: a unix datagram socket that changes the parameters in place
(engine_control.py); a change applies to packets arriving after it.
SIGTERM/SIGINT accept every held packet, write final stats, unbind, exit 0.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import select
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass, field

from netbench.emulation import engine_control, nfqueue

STATS_INTERVAL_S = 1.0
# recv() calls per readability event before we look at due releases again;
# bounds how long a burst of arrivals can postpone a release.
MAX_RECV_PER_WAKEUP = 128
MAX_STAMP_LAG_S = 0.05  # trust a kernel receive timestamp at most this far in the past
DEFAULT_SPIN_US = 100  # see DelayEngine docstring: precision vs CPU
CONTROL_POLL_S = 0.001  # while spinning, look at the control socket this often


@dataclass(frozen=True)
class EngineParams:
    """Emulation parameters.

    delay_us: constant one-way delay added, microseconds (>= 0).
    jitter_us: half-width of a uniform jitter, microseconds (>= 0); each
        packet gets delay + U(-jitter, +jitter), clamped at >= 0.
    loss: drop probability per packet, ratio in [0, 1].
    seed: seed of the random generator (loss and jitter draws).
    """

    delay_us: int
    jitter_us: int = 0
    loss: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.delay_us, int) or self.delay_us < 0:
            raise ValueError(f"delay_us must be an int >= 0, got {self.delay_us!r}")
        if not isinstance(self.jitter_us, int) or self.jitter_us < 0:
            raise ValueError(f"jitter_us must be an int >= 0, got {self.jitter_us!r}")
        if not 0.0 <= float(self.loss) <= 1.0:
            raise ValueError(f"loss must be a ratio in [0, 1], got {self.loss!r}")


@dataclass
class LatenessStats:
    """How late releases were vs. schedule (verdict time - release time), s."""

    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0

    def as_dict_us(self) -> dict:
        mean = self.total_s / self.count if self.count else 0.0
        return {"count": self.count, "mean": round(mean * 1e6, 1),
                "max": round(self.max_s * 1e6, 1)}


class DelayScheduler:
    """Decides drop / release time for each arriving packet (pure, no I/O).

    Call :meth:`arrive` for each packet in kernel queue order, then
    :meth:`due` with the current time to learn the highest packet id that may
    be accepted with one batch verdict.
    """

    def __init__(self, params: EngineParams) -> None:
        self.set_params(params)
        # (release_time_s, packet_id) in arrival == release order
        self._held: collections.deque = collections.deque()
        self._last_release_s = float("-inf")
        self.max_depth = 0
        self.released = 0
        self.dropped = 0
        self.lateness = LatenessStats()

    def set_params(self, params: EngineParams) -> None:
        """Use ``params`` for packets arriving from now on, with a generator seeded afresh.

        Held packets keep their release time, and no later arrival is released before
        them (the no-reordering rule), so nothing leaves earlier than it was scheduled.
        """
        self.params = params
        self._rng = random.Random(params.seed)
        self._delay_s = params.delay_us / 1e6
        self._jitter_s = params.jitter_us / 1e6
        self._loss = float(params.loss)

    def __len__(self) -> int:
        """Number of packets currently held."""
        return len(self._held)

    def arrive(self, packet_id: int, arrival_s: float) -> float | None:
        """Register a packet; return its release time (s) or None to drop it."""
        if self._loss and self._rng.random() < self._loss:
            self.dropped += 1
            return None
        release = arrival_s + self._sample_delay_s()
        # No reordering: never release before the previous packet.
        if release < self._last_release_s:
            release = self._last_release_s
        self._last_release_s = release
        self._held.append((release, packet_id))
        if len(self._held) > self.max_depth:
            self.max_depth = len(self._held)
        return release

    def _sample_delay_s(self) -> float:
        """delay + uniform(-jitter, +jitter), clamped at >= 0, seconds."""
        if not self._jitter_s:
            return self._delay_s
        return max(0.0, self._delay_s + self._rng.uniform(-self._jitter_s, self._jitter_s))

    def next_release_time(self) -> float | None:
        """Release time (s) of the oldest held packet, or None if none held."""
        return self._held[0][0] if self._held else None

    def due(self, now_s: float) -> int | None:
        """Pop every packet with release time <= now_s; return the highest id.

        The caller sends one batch ACCEPT for that id right away, so lateness
        (now_s - scheduled release) is recorded here per packet.
        """
        held = self._held
        if not held or held[0][0] > now_s:
            return None
        late = self.lateness
        last_id = None
        while held and held[0][0] <= now_s:
            release, last_id = held.popleft()
            lag = now_s - release
            late.count += 1
            late.total_s += lag
            if lag > late.max_s:
                late.max_s = lag
            self.released += 1
        return last_id

    def flush(self) -> int | None:
        """Pop everything regardless of time (shutdown); return highest id."""
        if not self._held:
            return None
        last_id = self._held[-1][1]
        self.released += len(self._held)
        self._held.clear()
        return last_id


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
        self.scheduler = DelayScheduler(params)
        self.counters = EngineCounters()
        self._queue: nfqueue.NfqueueSocket | None = None
        self._stop = False

    # -- lifecycle ----------------------------------------------------------
    def run(self, on_ready=None) -> None:
        """Bind, call ``on_ready()``, loop until stopped, then hand back."""
        self._queue = nfqueue.NfqueueSocket(self.queue_num, maxlen=self.maxlen)
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
            if now >= next_stats:
                self.write_stats(final=False)
                next_stats = now + STATS_INTERVAL_S
            timeout = self._timeout_s(now, next_stats)
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
        engine_control.serve_pending(self._control, lambda: self.params, self.set_params)

    def set_params(self, params: EngineParams) -> None:
        """Change the parameters in place (packets arriving from now on); stats at once."""
        self.params = params
        self.scheduler.set_params(params)
        self.counters.reconfigurations += 1
        self.write_stats(final=False)

    def _timeout_s(self, now: float, next_stats: float) -> float:
        """Seconds until the next release (or stats write), >= 0."""
        nxt = self.scheduler.next_release_time()
        deadline = next_stats if nxt is None else min(nxt, next_stats)
        return max(0.0, deadline - now)

    def _ingest(self) -> None:
        """Read pending queue messages, timestamping each recv(); drop losers."""
        q, sched, clock = self._queue, self.scheduler, time.monotonic
        for _ in range(MAX_RECV_PER_WAKEUP):
            packets = q.recv_batch()
            if packets is None:
                return
            now = clock()
            stamps = getattr(q, "last_timestamps", None) or ()
            wall = time.time() if stamps else 0.0
            for index, (packet_id, _length) in enumerate(packets):
                self.counters.received += 1
                arrival = now
                stamp = stamps[index] if index < len(stamps) else None
                if stamp is not None:
                    # the kernel's receive time: our own wake-up latency must not add to the
                    # delay. Clamped, so a wall-clock step can never push a packet far off.
                    arrival = now - min(max(wall - stamp, 0.0), MAX_STAMP_LAG_S)
                if sched.arrive(packet_id, arrival) is None:
                    q.verdict(packet_id, nfqueue.NF_DROP)

    def _release(self, now: float) -> None:
        last_id = self.scheduler.due(now)
        if last_id is not None:
            self._queue.verdict_batch(last_id, nfqueue.NF_ACCEPT)

    def _shutdown(self) -> None:
        """Accept everything held or still pending, write final stats."""
        self._ingest_all_pending()
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
        """
        sched, q = self.scheduler, self._queue
        return {
            "pid": os.getpid(),
            "queue_num": self.queue_num,
            "params": asdict(self.params),
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
        }

    def write_stats(self, final: bool) -> None:
        """Atomically replace ``stats_file`` with the current snapshot."""
        if not self.stats_file:
            return
        write_json_atomic(self.stats_file, self.stats(final))


def write_json_atomic(path: str, data: dict) -> None:
    """Write JSON to a temp file in the same directory, then os.replace."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def _drain_wakeup(sock: socket.socket) -> None:
    try:
        while sock.recv(512):
            pass
    except BlockingIOError:
        pass


# --- command line -------------------------------------------------------------

class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports usage errors as a single stderr line, exit 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog="netbench-engine",
                       description="NFQUEUE delay/jitter/loss engine for one namespace")
    p.add_argument("--queue-num", type=int, required=True, help="NFQUEUE number 0..65535")
    p.add_argument("--delay-us", type=int, required=True, help="one-way delay, microseconds")
    p.add_argument("--jitter-us", type=int, default=0, help="uniform +/- jitter, microseconds")
    p.add_argument("--loss", type=float, default=0.0, help="drop probability, ratio 0..1")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--stats-file", default=None, help="JSON stats path, rewritten ~1/s")
    p.add_argument("--spin-us", type=int, default=DEFAULT_SPIN_US,
                   help="busy-poll this long before each release instead of sleeping, us")
    p.add_argument("--rt-priority", type=int, default=0,
                   help="SCHED_FIFO priority 1..99 (0: normal scheduling)")
    p.add_argument("--maxlen", type=int, default=nfqueue.DEFAULT_QUEUE_MAXLEN,
                   help="kernel queue max length, packets")
    p.add_argument("--control", default=None, help="unix datagram socket path for live changes")
    return p


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, EngineParams]:
    """Parse and validate; exits 2 with one line on bad input."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 <= args.queue_num <= 0xFFFF:
        parser.error(f"--queue-num must be 0..65535, got {args.queue_num}")
    if args.spin_us < 0:
        parser.error(f"--spin-us must be >= 0, got {args.spin_us}")
    if not 0 <= args.rt_priority <= 99:
        parser.error(f"--rt-priority must be 0..99, got {args.rt_priority}")
    if args.maxlen < 1:
        parser.error(f"--maxlen must be >= 1, got {args.maxlen}")
    for flag, path in (("--stats-file", args.stats_file), ("--control", args.control)):
        parent = os.path.dirname(os.path.abspath(path)) if path else None
        if parent and not os.path.isdir(parent):
            parser.error(f"{flag} directory does not exist: {parent}")
    if args.loss != args.loss:  # NaN
        parser.error("--loss must be a number in [0, 1]")
    try:
        params = EngineParams(args.delay_us, args.jitter_us, args.loss, args.seed)
    except ValueError as exc:
        parser.error(str(exc).replace("delay_us", "--delay-us")
                     .replace("jitter_us", "--jitter-us").replace("loss", "--loss"))
    return args, params


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
                "params": asdict(params), "maxlen": args.maxlen,
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
