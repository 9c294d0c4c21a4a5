#!/usr/bin/env python3
"""Packets/sec ceiling of the NFQUEUE delay engine (run as root).

Builds two namespaces ``nbbench-eng-a`` / ``nbbench-eng-b`` joined by a veth
pair (10.254.77.1/24 <-> 10.254.77.2/24), queues A's egress to the engine
(``iptables -t mangle -A POSTROUTING -o veth-a -j NFQUEUE --queue-num 0``),
and for each offered rate sends timestamped UDP datagrams A -> B for a few
seconds.  The receiver in B takes the kernel receive timestamp
(SO_TIMESTAMPNS, CLOCK_REALTIME) and the sender embeds time.time_ns() at
send, so one-way latency is measured on one host clock without the
receiver's own scheduling delay.  Delay error = one-way latency - configured
delay.  A fresh engine is started per rate so its stats are per rate.

Usage::

    sudo .venv/bin/python bench/engine_ceiling.py [--delay-us 10000]
        [--rates 1000,2000,5000,10000,20000,50000] [--duration 3]
        [--spin-us N] [--rt-priority P] [--table N] [--json out.json]

``--table N``: the engine gets a per-destination table of N destinations (B's address at
--delay-us, N-1 others at other delays) instead of one profile: the per-destination path.

Everything is torn down in ``finally``.  Traffic stays inside the two
namespaces the script creates.
"""

from __future__ import annotations

import argparse
import array
import json
import os
import socket
import struct
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NS_A, NS_B = "nbbench-eng-a", "nbbench-eng-b"
IF_A, IF_B = "veth-a", "veth-b"
ADDR_A, ADDR_B = "10.254.77.1", "10.254.77.2"
PORT = 40777
QUEUE_NUM = 0
PAYLOAD = struct.Struct("!QQ")  # seq, tx time (CLOCK_REALTIME ns)
DATAGRAM_BYTES = 64
ERROR_LIMIT_MS = 0.5
SO_TIMESTAMPNS = 35  # Linux; not exported by the socket module
SO_SNDBUFFORCE = 32


@dataclass(frozen=True)
class RateResult:
    """One row of the table; times in milliseconds."""

    offered_pps: int
    achieved_pps: float
    sent: int
    received: int
    mean_err_ms: float
    p50_err_ms: float
    p99_err_ms: float
    max_err_ms: float
    engine_lateness_mean_ms: float
    engine_lateness_max_ms: float
    engine_max_depth: int
    engine_cpu_pct: float
    enobufs: int
    kernel_drops: int

    @property
    def lost(self) -> int:
        return self.sent - self.received


# --- roles run inside a namespace --------------------------------------------

def role_send(rate: int, duration: float) -> None:
    """Send ``rate`` datagrams/s for ``duration`` s; print the count sent."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    # Packets held by the engine still count against the sender's SO_SNDBUF
    # (the skb is not freed until transmitted): with the default ~208 KiB
    # only ~256 datagrams can be in flight, i.e. ~25k pps at 10 ms.
    sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, 64 << 20)
    sock.connect((ADDR_B, PORT))
    pad = b"\0" * (DATAGRAM_BYTES - PAYLOAD.size)
    t0 = time.monotonic()
    end = t0 + duration
    sent = 0
    while True:
        now = time.monotonic()
        if now >= end:
            break
        target = int((now - t0) * rate) + 1
        while sent < target:
            try:
                sock.send(PAYLOAD.pack(sent, time.time_ns()) + pad)
            except (BlockingIOError, OSError):
                pass  # counted as lost
            sent += 1
        # Pace in ~batches; sleeping until the next datagram is due.
        time.sleep(max(0.0, t0 + sent / rate - time.monotonic()))
    print(json.dumps({"sent": sent, "elapsed": time.monotonic() - t0}), flush=True)


def role_recv(deadline_s: float) -> None:
    """Record one-way latencies (ns) until idle 0.5 s or ``deadline_s``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.bind((ADDR_B, PORT))
    print(json.dumps({"event": "ready"}), flush=True)
    lat = array.array("q")
    end = time.monotonic() + deadline_s
    sock.settimeout(deadline_s)
    while time.monotonic() < end:
        try:
            data, anc, _f, _a = sock.recvmsg(256, 64)
        except socket.timeout:
            break
        sock.settimeout(0.5 if lat else deadline_s)
        rx_ns = _rx_ns(anc)
        if rx_ns is not None and len(data) >= PAYLOAD.size:
            lat.append(rx_ns - PAYLOAD.unpack_from(data)[1])
    print(json.dumps({"latencies_ns": lat.tolist()}), flush=True)


def _rx_ns(ancdata) -> int | None:
    for level, ctype, cdata in ancdata:
        if level == socket.SOL_SOCKET and ctype == SO_TIMESTAMPNS:
            sec, nsec = struct.unpack("ll", cdata[:16])
            return sec * 1_000_000_000 + nsec
    return None


# --- orchestration (root namespace) ------------------------------------------

def _in_ns(name: str):
    from pyroute2 import netns
    return lambda: netns.setns(name, flags=0)


def _run_ns(name: str, argv: list[str]) -> None:
    subprocess.run(argv, preexec_fn=_in_ns(name), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def setup_topology() -> None:
    from pyroute2 import NetNS, netns
    netns.create(NS_A)
    netns.create(NS_B)
    with NetNS(NS_A, flags=0) as ns:
        ns.link("add", ifname=IF_A, kind="veth", peer={"ifname": IF_B, "net_ns_fd": NS_B})
        _addr_up(ns, IF_A, ADDR_A)
    with NetNS(NS_B, flags=0) as ns:
        _addr_up(ns, IF_B, ADDR_B)


def _addr_up(ns, ifname: str, addr: str) -> None:
    idx = ns.link_lookup(ifname=ifname)[0]
    ns.addr("add", index=idx, address=addr, prefixlen=24)
    ns.link("set", index=idx, state="up")
    ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")


def teardown_topology() -> None:
    from pyroute2 import netns
    for name in (NS_A, NS_B):
        if name in netns.listnetns():
            netns.remove(name)


def queue_rule(action: str) -> None:
    """Add (-A) or delete (-D) the NFQUEUE rule on A's egress."""
    _run_ns(NS_A, ["iptables", "-t", "mangle", action, "POSTROUTING", "-o", IF_A,
                   "-j", "NFQUEUE", "--queue-num", str(QUEUE_NUM)])


def start_engine(delay_us: int, spin_us: int | None, stats: str,
                 rt_priority: int = 0, table: int = 0) -> subprocess.Popen:
    argv = [sys.executable, "-m", "netbench.emulation.engine", "--queue-num",
            str(QUEUE_NUM), "--delay-us", str(0 if table else delay_us), "--stats-file", stats,
            "--rt-priority", str(rt_priority)]
    if table:
        pairs = [{"dst": ADDR_B, "delay_us": delay_us}]
        pairs += [{"dst": f"10.254.78.{i}", "delay_us": 1000 * i} for i in range(1, table)]
        path = stats + ".pairs.json"
        with open(path, "w", encoding="utf-8") as fh:
            json.dump({"pairs": pairs}, fh)
        argv += ["--pairs-file", path]
    if spin_us is not None:
        argv += ["--spin-us", str(spin_us)]
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.Popen(argv, preexec_fn=_in_ns(NS_A), env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = proc.stdout.readline()
    if '"ready"' not in line:
        proc.kill()
        raise RuntimeError(f"engine did not start: {proc.stderr.read().strip()}")
    return proc


def stop_engine(proc: subprocess.Popen, stats: str) -> dict:
    proc.terminate()
    if proc.wait(timeout=10) != 0:
        raise RuntimeError(f"engine exited {proc.returncode}: {proc.stderr.read()}")
    with open(stats, encoding="utf-8") as fh:
        return json.load(fh)


def measure(rate: int, duration: float) -> tuple[int, float, list]:
    """Run one sender/receiver pair; return (sent, elapsed_s, latencies_ns)."""
    me = [sys.executable, os.path.abspath(__file__)]
    recv = subprocess.Popen(me + ["--role", "recv", "--deadline", str(duration + 5)],
                            preexec_fn=_in_ns(NS_B), stdout=subprocess.PIPE, text=True)
    try:
        if '"ready"' not in recv.stdout.readline():
            raise RuntimeError("receiver failed to start")
        send = subprocess.run(me + ["--role", "send", "--rate", str(rate),
                                    "--duration", str(duration)],
                              preexec_fn=_in_ns(NS_A), capture_output=True,
                              text=True, check=True)
        out, _ = recv.communicate(timeout=duration + 10)
    finally:
        if recv.poll() is None:
            recv.kill()
    sent_info = json.loads(send.stdout)
    return sent_info["sent"], sent_info["elapsed"], json.loads(out)["latencies_ns"]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(sorted_vals: list, q: float) -> float:
    if not sorted_vals:
        return float("nan")
    return sorted_vals[min(len(sorted_vals) - 1, int(q * len(sorted_vals)))]


def run_rate(rate: int, args: argparse.Namespace, tmpdir: str) -> RateResult:
    duration, delay_us = args.duration, args.delay_us
    stats_path = os.path.join(tmpdir, f"engine-{rate}.json")
    engine = start_engine(delay_us, args.spin_us, stats_path, args.rt_priority, args.table)
    try:
        cpu0, t0 = _cpu_s(engine.pid), time.monotonic()
        sent, elapsed, lat = measure(rate, duration)
        cpu_pct = 100 * (_cpu_s(engine.pid) - cpu0) / (time.monotonic() - t0)
    finally:
        stats = stop_engine(engine, stats_path)
    err_ms = sorted((x / 1e6) - delay_us / 1e3 for x in lat)
    kern = stats.get("kernel") or {}
    late = stats["lateness_us"]
    return RateResult(
        offered_pps=rate, achieved_pps=round(len(lat) / elapsed, 1), sent=sent,
        received=len(lat),
        mean_err_ms=round(sum(err_ms) / len(err_ms), 3) if err_ms else float("nan"),
        p50_err_ms=round(_pct(err_ms, 0.5), 3), p99_err_ms=round(_pct(err_ms, 0.99), 3),
        max_err_ms=round(err_ms[-1], 3) if err_ms else float("nan"),
        engine_lateness_mean_ms=round(late["mean"] / 1e3, 3),
        engine_lateness_max_ms=round(late["max"] / 1e3, 3),
        engine_max_depth=stats["max_queue_depth"], engine_cpu_pct=round(cpu_pct, 1),
        enobufs=stats["enobufs"],
        kernel_drops=kern.get("queue_dropped", 0) + kern.get("user_dropped", 0))


def baseline_ms(duration: float) -> float:
    """Mean one-way latency without the engine (no NFQUEUE rule), ms."""
    _sent, _el, lat = measure(1000, min(duration, 1.0))
    return round(sum(lat) / len(lat) / 1e6, 3) if lat else float("nan")


def ceiling(results: list[RateResult], metric: str = "mean_err_ms") -> int | None:
    """Highest offered rate with ``metric`` < 0.5 ms, <1% lost, >=95% achieved."""
    ok = [r.offered_pps for r in results
          if getattr(r, metric) < ERROR_LIMIT_MS and r.lost <= 0.01 * r.sent
          and r.achieved_pps >= 0.95 * r.offered_pps]
    return max(ok) if ok else None


# (header, RateResult attribute, format); errors and lateness in ms
COLUMNS = [("offered", "offered_pps", "d"), ("achieved", "achieved_pps", ".0f"),
           ("lost", "lost", "d"), ("mean_err", "mean_err_ms", ".3f"),
           ("p50_err", "p50_err_ms", ".3f"), ("p99_err", "p99_err_ms", ".3f"),
           ("max_err", "max_err_ms", ".3f"), ("eng_late", "engine_lateness_mean_ms", ".3f"),
           ("late_max", "engine_lateness_max_ms", ".3f"), ("depth", "engine_max_depth", "d"),
           ("cpu%", "engine_cpu_pct", ".0f"), ("enobufs", "enobufs", "d"),
           ("kdrops", "kernel_drops", "d")]


def print_table(results: list[RateResult], delay_us: int, base: float) -> None:
    print(f"delay {delay_us / 1000:g} ms, baseline one-way latency {base} ms "
          f"(not subtracted); errors/lateness in ms")
    print(" ".join(f"{h:>9}" for h, _a, _f in COLUMNS))
    for r in results:
        print(" ".join(f"{getattr(r, a):>9{f}}" for _h, a, f in COLUMNS))
    print(f"ceiling (<1% lost): mean error < {ERROR_LIMIT_MS} ms up to "
          f"{ceiling(results)} pps; p99 error < {ERROR_LIMIT_MS} ms up to "
          f"{ceiling(results, 'p99_err_ms')} pps")


def orchestrate(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        print("engine_ceiling: error: must run as root", file=sys.stderr)
        return 2
    import tempfile
    rates = [int(x) for x in args.rates.split(",")]
    results: list[RateResult] = []
    teardown_topology()  # leftovers from an interrupted run
    try:
        setup_topology()
        base = baseline_ms(args.duration)
        queue_rule("-A")
        with tempfile.TemporaryDirectory(prefix="nbbench-eng-") as tmp:
            for rate in rates:
                results.append(run_rate(rate, args, tmp))
                print(f"  {rate} pps done", file=sys.stderr, flush=True)
    finally:
        teardown_topology()
    print_table(results, args.delay_us, base)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"delay_us": args.delay_us, "spin_us": args.spin_us,
                       "rt_priority": args.rt_priority,
                       "baseline_one_way_ms": base, "ceiling_pps": ceiling(results),
                       "ceiling_p99_pps": ceiling(results, "p99_err_ms"),
                       "results": [asdict(r) for r in results]}, fh, indent=1)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--delay-us", type=int, default=10_000)
    p.add_argument("--rates", default="1000,2000,5000,10000,20000,50000")
    p.add_argument("--duration", type=float, default=3.0, help="seconds per rate")
    p.add_argument("--spin-us", type=int, default=None, help="engine --spin-us")
    p.add_argument("--rt-priority", type=int, default=0, help="engine --rt-priority")
    p.add_argument("--table", type=int, default=0, help="a per-destination table of N destinations")
    p.add_argument("--json", default=None)
    p.add_argument("--role", choices=("send", "recv"), help=argparse.SUPPRESS)
    p.add_argument("--rate", type=int, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "send":
        role_send(args.rate, args.duration)
        return 0
    if args.role == "recv":
        role_recv(args.deadline)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
