#!/usr/bin/env python3
"""Emulation fidelity: does the link netbench sets up match the profile it was given?

Brings up a 2-node testbed with netbench's own library calls (``local.up``,
``plan_apply`` + ``real_executor``, ``reset``) and measures, between n1 and n2:

* delay: ping RTT for one-way delay 1, 10, 100 ms on both nodes (expected RTT =
  2 x delay); pass if |mean RTT - expected| <= 0.5 ms. Unshaped baseline too.
* rate: iperf3 TCP throughput (receiver's bits_per_second) for 250, 500, 1000
  mbit; pass within 5 %. Plus 100 mbit + 10 ms delay (informational), with the
  RTT idle and under that load.
* loss: 1 % and 10 % on both nodes. Ping round trips cross two lossy egresses,
  so the expected round-trip loss is 1-(1-p)^2; one-way UDP datagrams n1 -> n2
  cross one, so expected p. Pass if the expected value lies inside the 99 %
  binomial interval of the measurement (Clopper-Pearson via scipy if installed,
  else Wilson).

Usage (root)::

    .venv/bin/python bench/fidelity.py [--quick] [--json PATH] [--backend auto|netem|userspace]

If a netbench testbed is already up (someone else is using the machine) it
waits for it to go (polling every 10 s, up to 10 min) and never touches it.
Everything this script creates is journaled in a private temporary state
directory and removed with ``netbench.state.reset.reset`` in ``finally`` (Ctrl-C and
SIGTERM included). Traffic goes only between the testbed's own addresses.
Exit status: 0 all checks passed, 1 a check failed, 2 could not run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import select
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_JSON = REPO / "bench" / "results" / "fidelity.json"

DELAYS_MS = (1, 10, 100)
RATES_MBIT = (250, 500, 1000)
LOSSES = (0.01, 0.10)
COMBINED = {"rate_mbit": 100, "delay_ms": 10}
DELAY_TOL_MS = 0.5
RATE_TOL_PCT = 5.0
CONFIDENCE = 0.99
UDP_PORT = 40123
UDP_PAYLOAD = struct.Struct("!Q")
UDP_BYTES = 64
WAIT_POLL_S = 10.0
WAIT_MAX_S = 600.0


@dataclass(frozen=True)
class Settings:
    baseline_pings: int
    delay_pings: int          # at interval 0.05 s (1 and 10 ms)
    slow_pings: int           # at interval 0.2 s (100 ms)
    iperf_s: int
    loss_pings: int           # at interval 0.01 s
    udp_datagrams: int
    udp_pps: int


FULL = Settings(baseline_pings=100, delay_pings=200, slow_pings=50, iperf_s=5,
                loss_pings=2000, udp_datagrams=10000, udp_pps=2000)
QUICK = Settings(baseline_pings=40, delay_pings=60, slow_pings=15, iperf_s=2,
                 loss_pings=500, udp_datagrams=4000, udp_pps=2000)


# --- roles run inside a namespace (stdlib only) ----------------------------------------

def role_udp_recv(addr: str, port: int, idle_s: float, max_s: float) -> int:
    """Count datagrams on addr:port; print "ready", then a JSON line when idle/deadline."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
    sock.bind((addr, port))
    print("ready", flush=True)
    seen: set[int] = set()
    received = 0
    start = time.monotonic()
    last = None
    while True:
        now = time.monotonic()
        if now - start > max_s or (last is not None and now - last > idle_s):
            break
        sock.settimeout(0.1)
        try:
            data = sock.recv(2048)
        except socket.timeout:
            continue
        received += 1
        last = time.monotonic()
        if len(data) >= UDP_PAYLOAD.size:
            seen.add(UDP_PAYLOAD.unpack_from(data)[0])
    print(json.dumps({"received": received, "unique": len(seen),
                      "max_seq": max(seen) if seen else None}), flush=True)
    return 0


def role_udp_send(addr: str, port: int, count: int, pps: int) -> int:
    """Send `count` sequence-numbered datagrams at `pps`; print a JSON line."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect((addr, port))
    pad = b"\0" * (UDP_BYTES - UDP_PAYLOAD.size)
    errors = 0
    start = time.monotonic()
    for seq in range(count):
        due = start + seq / pps
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        try:
            sock.send(UDP_PAYLOAD.pack(seq) + pad)
        except OSError:
            errors += 1
    print(json.dumps({"sent": count - errors, "send_errors": errors,
                      "elapsed_s": round(time.monotonic() - start, 3)}), flush=True)
    return 0


# --- statistics -------------------------------------------------------------------------

def binomial_interval(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float, str]:
    """Two-sided interval for a proportion k/n: exact Clopper-Pearson if scipy, else Wilson."""
    if n <= 0:
        return 0.0, 1.0, "none"
    alpha = 1.0 - confidence
    try:
        from scipy.stats import beta  # type: ignore
    except ImportError:
        beta = None
    if beta is not None:
        lo = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
        hi = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
        return lo, hi, "clopper-pearson"
    from statistics import NormalDist
    z = NormalDist().inv_cdf(1 - alpha / 2)
    phat = k / n
    denom = 1 + z * z / n
    centre = (phat + z * z / (2 * n)) / denom
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half), "wilson"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


# --- measurements -----------------------------------------------------------------------

_PING_LINE = re.compile(r"icmp_seq=(\d+) .*time=([\d.]+) ms")
_PING_SUMMARY = re.compile(r"(\d+) packets transmitted, (\d+) received")
_PING_RTT = re.compile(r"= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms")


def ping(proc, src, dst, count: int, interval: float, quiet: bool = False) -> dict[str, Any]:
    """ping dst.address from src's namespace; min/avg/max/mdev from ping's own summary
    (microsecond precision) and per-packet times (ping prints >= 100 ms as whole ms)."""
    argv = ["ping", "-n", "-c", str(count), "-i", f"{interval:g}", "-W", "2", dst.address]
    if quiet:
        argv.insert(1, "-q")
    result = proc.run(argv, netns=src.netns, timeout=count * interval + 30, check=False)
    out = result.stdout
    times = [float(m.group(2)) for m in _PING_LINE.finditer(out) if "DUP!" not in m.group(0)]
    summary = _PING_SUMMARY.search(out)
    rtt = _PING_RTT.search(out)
    if summary is None:
        raise RuntimeError(f"ping {dst.address} from {src.name}: no summary: "
                           f"{(result.stderr or out).strip()[-300:]}")
    data: dict[str, Any] = {"sent": int(summary.group(1)), "received": int(summary.group(2)),
                            "interval_s": interval}
    if rtt:
        data.update(min_ms=float(rtt.group(1)), mean_ms=float(rtt.group(2)),
                    max_ms=float(rtt.group(3)), mdev_ms=float(rtt.group(4)))
    if times:
        data.update(p50_ms=percentile(times, 0.5), p99_ms=percentile(times, 0.99))
    return data


def wait_listening(proc, node, port: int, proto: str = "t", timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    needle = f"{node.address}:{port}"
    while time.monotonic() < deadline:
        result = proc.run(["ss", f"-Hln{proto}"], netns=node.netns, check=False)
        if needle in result.stdout:
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {needle} in {node.netns} after {timeout:g}s")


def iperf(client, server, seconds: int, workdir: Path) -> dict[str, Any]:
    """One iperf3 TCP test client -> server; returns receiver/sender rates and retransmits."""
    from netbench.experiment.verify import DEFAULT_MSS, FRAME_OVERHEAD_BYTES, iperf3_report

    report = iperf3_report(client, server, seconds, server_log=workdir / "iperf3-server.log")
    end = report["end"]
    intervals = [iv["sum"]["bits_per_second"] for iv in report.get("intervals", [])]
    steady = intervals[1:] if len(intervals) > 1 else intervals
    mss = report.get("start", {}).get("tcp_mss_default") or DEFAULT_MSS
    return {
        "duration_s": seconds,
        "tcp_mss": mss,
        # tbf counts whole frames: MSS + TCP 20 + timestamps 12 + IP 20 + Ethernet 14
        "goodput_per_wire": mss / (mss + FRAME_OVERHEAD_BYTES),
        "receiver_bps": end["sum_received"]["bits_per_second"],
        "sender_bps": end["sum_sent"]["bits_per_second"],
        "retransmits": end["sum_sent"].get("retransmits"),
        "sender_after_1s_bps": statistics.fmean(steady) if steady else None,
        "interval_bps": intervals,
        "max_snd_cwnd_bytes": max((st.get("sender", {}).get("max_snd_cwnd", 0)
                                   for st in end.get("streams", [])), default=None),
        "max_rtt_us": max((st.get("sender", {}).get("max_rtt", 0) for st in end.get("streams", [])),
                          default=None),
    }


def udp_oneway(proc, src, dst, count: int, pps: int) -> dict[str, Any]:
    me = [sys.executable, str(Path(__file__).resolve())]
    max_s = count / pps + 20
    recv = proc.spawn([*me, "--role", "udp-recv", "--addr", dst.address, "--port", str(UDP_PORT),
                       "--max-s", str(max_s)],
                      netns=dst.netns, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ready, _, _ = select.select([recv.stdout], [], [], 10)
        if not ready or recv.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"UDP receiver in {dst.netns} did not start: {recv.stderr.read1(2000)!r}")
        sent = proc.run([*me, "--role", "udp-send", "--addr", dst.address, "--port", str(UDP_PORT),
                         "--count", str(count), "--pps", str(pps)],
                        netns=src.netns, timeout=max_s + 10)
        out, err = recv.communicate(timeout=max_s + 10)
        got = json.loads(out.decode().strip().splitlines()[-1])
    finally:
        if recv.poll() is None:
            proc.stop(recv, grace=1.0)
    return {**json.loads(sent.stdout.strip().splitlines()[-1]), **got, "pps": pps}


# --- the benchmark ------------------------------------------------------------------------

class Bench:
    def __init__(self, settings: Settings, backend_name: str, topology, journal, console, seed: int) -> None:
        from netbench import proc
        from netbench.emulation import backends, changes as ch
        from netbench.emulation.executor import real_executor

        self.s = settings
        self.backend = backend_name
        self.topo = topology
        self.n1, self.n2 = topology.nodes[0], topology.nodes[1]
        self.journal = journal
        self.console = console
        self.seed = seed
        self.proc = proc
        self.ch = ch
        self.backends = backends
        self.executor = real_executor(journal)
        self.workdir = Path(journal.dir)
        self.emulation_s = 0.0  # time spent applying/clearing (engine start/stop), not measuring

    # emulation through netbench's own plan/executor
    def apply(self, **fields: Any):
        from netbench.model.profile import Profile, validate

        profile = validate(Profile(name="fidelity", **fields), "bench")
        t = time.monotonic()
        self.executor.apply(self.backends.plan_apply(profile, self.topo, self.backend, seed=self.seed))
        self.emulation_s += time.monotonic() - t
        return profile

    def clear(self) -> dict[str, Any]:
        """Clear every node; return what the qdiscs/engines counted (engines write final stats on stop)."""
        qdiscs = {n.name: self._safe(self.executor.qdiscs.read, n.netns, n.ifname) for n in self.topo.nodes}
        t = time.monotonic()
        self.executor.apply(self.ch.plan_clear(self.topo))
        self.emulation_s += time.monotonic() - t
        engines = {}
        switch = self.topo.switch_netns
        for position, node in enumerate(self.topo.nodes):
            data = self._safe(self.executor.engines.read, switch, self.ch.queue_num(position))
            if data:
                engines[node.name] = {k: data.get(k) for k in ("received", "accepted", "dropped", "enobufs",
                                                                "max_queue_depth", "lateness_us", "kernel",
                                                                "gso_packets", "final")}
        # the stats file survives the engine: remove it so the next clear does not re-read it
        for position, _ in enumerate(self.topo.nodes):
            (self.executor.engines.dir / f"{switch}-q{self.ch.queue_num(position)}.json").unlink(missing_ok=True)
        return {"qdisc": {k: v for k, v in qdiscs.items() if v}, "engines": engines}

    @staticmethod
    def _safe(fn, *args):
        try:
            return fn(*args)
        except Exception as exc:  # stats are informational
            return {"error": str(exc)}

    def warm(self) -> None:
        """Resolve ARP both ways so the first measured ping does not include it."""
        self.proc.run(["ping", "-n", "-q", "-c", "2", "-i", "0.05", "-W", "2", self.n2.address],
                      netns=self.n1.netns, timeout=10, check=False)

    def baseline(self) -> dict[str, Any]:
        self.clear()
        self.warm()
        return ping(self.proc, self.n1, self.n2, self.s.baseline_pings, 0.05)

    def delay(self, baseline_ms: float | None) -> list[dict[str, Any]]:
        rows = []
        for delay_ms in DELAYS_MS:
            self.apply(delay_us=delay_ms * 1000)
            self.warm()
            slow = delay_ms >= 100
            count, interval = (self.s.slow_pings, 0.2) if slow else (self.s.delay_pings, 0.05)
            data = ping(self.proc, self.n1, self.n2, count, interval)
            stats = self.clear()
            expected = 2.0 * delay_ms
            mean = data.get("mean_ms")
            error = None if mean is None else mean - expected
            rows.append({"delay_ms": delay_ms, "expected_rtt_ms": expected, **data,
                         "error_ms": error,
                         "error_minus_baseline_ms": (None if error is None or baseline_ms is None
                                                     else error - baseline_ms),
                         "tolerance_ms": DELAY_TOL_MS,
                         "pass": error is not None and abs(error) <= DELAY_TOL_MS
                                 and data["received"] == data["sent"],
                         "emulation": stats})
        return rows

    def rate(self) -> list[dict[str, Any]]:
        rows = []
        for mbit in RATES_MBIT:
            profile = self.apply(rate_bps=mbit * 1_000_000)
            data = iperf(self.n1, self.n2, self.s.iperf_s, self.workdir)
            stats = self.clear()
            err_pct = (data["receiver_bps"] / profile.rate_bps - 1.0) * 100.0
            wire_pct = (data["receiver_bps"] / data["goodput_per_wire"] / profile.rate_bps - 1.0) * 100.0
            rows.append({"rate_mbit": mbit, **data, "error_pct": err_pct, "tolerance_pct": RATE_TOL_PCT,
                         "wire_equivalent_error_pct": wire_pct,
                         "tbf_burst_bytes": self.ch.tbf_burst_bytes(profile.rate_bps),
                         "tbf_limit_bytes": self.ch.tbf_limit_bytes(profile.rate_bps),
                         "pass": abs(err_pct) <= RATE_TOL_PCT, "emulation": stats})
        return rows

    def combined(self) -> dict[str, Any]:
        """rate + delay together (informational): throughput, RTT idle and under load."""
        mbit, delay_ms = COMBINED["rate_mbit"], COMBINED["delay_ms"]
        profile = self.apply(rate_bps=mbit * 1_000_000, delay_us=delay_ms * 1000)
        self.warm()
        idle = ping(self.proc, self.n1, self.n2, max(20, self.s.delay_pings // 4), 0.05)
        # RTT under load: ping in the background (it finishes before iperf3 does)
        n_load = max(5, int((self.s.iperf_s - 1) / 0.1))
        pinger = self.proc.spawn(["ping", "-n", "-c", str(n_load), "-i", "0.1", "-W", "2", self.n2.address],
                                 netns=self.n1.netns, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            data = iperf(self.n1, self.n2, self.s.iperf_s, self.workdir)
            out, _ = pinger.communicate(timeout=30)
        finally:
            if pinger.poll() is None:
                self.proc.stop(pinger, grace=1.0)
        text = out.decode(errors="replace")
        loaded_times = [float(m.group(2)) for m in _PING_LINE.finditer(text)]
        rtt = _PING_RTT.search(text)
        loaded = {"count": len(loaded_times),
                  "mean_ms": float(rtt.group(2)) if rtt else None,
                  "max_ms": float(rtt.group(3)) if rtt else None,
                  "p50_ms": percentile(loaded_times, 0.5), "p99_ms": percentile(loaded_times, 0.99)}
        stats = self.clear()
        bdp = profile.rate_bps / 8 * (2 * delay_ms / 1000)
        return {"rate_mbit": mbit, "delay_ms": delay_ms, "expected_rtt_ms": 2.0 * delay_ms,
                "bdp_bytes": int(bdp), "idle_ping": idle, "loaded_ping": loaded, **data,
                "error_pct": (data["receiver_bps"] / profile.rate_bps - 1.0) * 100.0,
                "tbf_limit_bytes": self.ch.tbf_limit_bytes(profile.rate_bps),
                "tbf_queue_ms": self.ch.tbf_limit_bytes(profile.rate_bps) * 8 / profile.rate_bps * 1000,
                "emulation": stats}

    def loss(self) -> list[dict[str, Any]]:
        """Each measurement gets fresh engines so their drop counters belong to it alone."""
        rows = []
        for p in LOSSES:
            # round trip: ping crosses n1's and n2's egress
            self.apply(loss=p)
            rt = ping(self.proc, self.n1, self.n2, self.s.loss_pings, 0.01, quiet=True)
            stats = self.clear()
            lost = rt["sent"] - rt["received"]
            lo, hi, method = binomial_interval(lost, rt["sent"])
            expected_rt = 1 - (1 - p) ** 2
            rows.append({"loss": p, "kind": "ping round trip", "expected": expected_rt,
                         "sent": rt["sent"], "lost": lost, "measured": lost / rt["sent"],
                         "ci_low": lo, "ci_high": hi, "ci_method": method, "confidence": CONFIDENCE,
                         "engine_drops": _engine_drops(stats), "pass": lo <= expected_rt <= hi,
                         "emulation": stats})
            # one way: UDP n1 -> n2 crosses only n1's egress
            self.apply(loss=p)
            udp = udp_oneway(self.proc, self.n1, self.n2, self.s.udp_datagrams, self.s.udp_pps)
            stats = self.clear()
            lost = udp["sent"] - udp["unique"]
            lo, hi, method = binomial_interval(lost, udp["sent"])
            rows.append({"loss": p, "kind": "udp one way", "expected": p,
                         "sent": udp["sent"], "lost": lost, "measured": lost / udp["sent"],
                         "ci_low": lo, "ci_high": hi, "ci_method": method, "confidence": CONFIDENCE,
                         "udp": udp, "engine_drops": _engine_drops(stats), "pass": lo <= p <= hi,
                         "emulation": stats})
        return rows


def _engine_drops(stats: dict[str, Any]) -> dict[str, Any]:
    return {name: eng.get("dropped") for name, eng in sorted(stats.get("engines", {}).items())}


# --- output ---------------------------------------------------------------------------------

def _f(value, fmt: str = ".3f", none: str = "-") -> str:
    return none if value is None else format(value, fmt)


def _ok(flag: bool) -> str:
    return "[green]pass[/]" if flag else "[red]FAIL[/]"


def _lateness(stats: dict[str, Any]) -> str:
    parts = []
    for name, eng in sorted(stats.get("engines", {}).items()):
        late = eng.get("lateness_us") or {}
        if late.get("count"):
            parts.append(f"{name} {late.get('mean', 0):.0f}/{late.get('max', 0):.0f}")
    return ", ".join(parts) or "-"


def print_tables(console, results: dict[str, Any]) -> None:
    from rich.table import Table

    base = results["baseline"]
    t = Table(title=f"Delay fidelity (ping n1 -> n2, RTT ms; pass |mean - expected| <= {DELAY_TOL_MS} ms)")
    for col in ("one-way delay", "pings", "expected RTT", "mean", "min", "max", "p99", "mdev",
                "error", "error - baseline", "engine lateness us mean/max", "result"):
        t.add_column(col, justify="right")
    t.add_row("none (baseline)", f"{base['received']}/{base['sent']}", "0", _f(base.get("mean_ms")),
              _f(base.get("min_ms")), _f(base.get("max_ms")), _f(base.get("p99_ms")), _f(base.get("mdev_ms")),
              _f(base.get("mean_ms")), "-", "-", "-")
    for row in results["delay"]:
        t.add_row(f"{row['delay_ms']} ms", f"{row['received']}/{row['sent']}", _f(row["expected_rtt_ms"], ".0f"),
                  _f(row.get("mean_ms")), _f(row.get("min_ms")), _f(row.get("max_ms")), _f(row.get("p99_ms")),
                  _f(row.get("mdev_ms")), _f(row["error_ms"], "+.3f"), _f(row["error_minus_baseline_ms"], "+.3f"),
                  _lateness(row["emulation"]), _ok(row["pass"]))
    console.print(t)

    t = Table(title=f"Rate fidelity (iperf3 TCP n1 -> n2, receiver rate; pass within {RATE_TOL_PCT:g} %)")
    for col in ("rate", "receiver Mbit/s", "error %", "wire-equiv. error %", "sender Mbit/s",
                "sender after 1 s", "retrans",
                "tbf burst B", "tbf drops n1", "result"):
        t.add_column(col, justify="right")
    for row in results["rate"]:
        q = row["emulation"]["qdisc"].get("n1") or {}
        t.add_row(f"{row['rate_mbit']} mbit", _f(row["receiver_bps"] / 1e6, ".1f"), _f(row["error_pct"], "+.2f"),
                  _f(row["wire_equivalent_error_pct"], "+.2f"),
                  _f(row["sender_bps"] / 1e6, ".1f"),
                  _f(None if row["sender_after_1s_bps"] is None else row["sender_after_1s_bps"] / 1e6, ".1f"),
                  str(row["retransmits"]), str(row["tbf_burst_bytes"]), str(q.get("drops", "-")), _ok(row["pass"]))
    c = results["combined"]
    t.add_row(f"{c['rate_mbit']} mbit + {c['delay_ms']} ms (info)", _f(c["receiver_bps"] / 1e6, ".1f"),
              _f(c["error_pct"], "+.2f"),
              _f((c["receiver_bps"] / c["goodput_per_wire"] / (c["rate_mbit"] * 1e6) - 1) * 100, "+.2f"),
              _f(c["sender_bps"] / 1e6, ".1f"),
              _f(None if c["sender_after_1s_bps"] is None else c["sender_after_1s_bps"] / 1e6, ".1f"),
              str(c["retransmits"]), "-", str((c["emulation"]["qdisc"].get("n1") or {}).get("drops", "-")), "info")
    console.print(t)
    console.print("  wire-equiv.: receiver goodput scaled by (MSS + 66 B headers) / MSS, i.e. the frame rate tbf "
                  "shapes; the pass test uses the plain receiver rate as specified")
    idle, loaded = c["idle_ping"], c["loaded_ping"]
    console.print(f"  {c['rate_mbit']} mbit + {c['delay_ms']} ms: RTT idle mean {_f(idle.get('mean_ms'))} ms "
                  f"(expected {c['expected_rtt_ms']:.0f}), under iperf3 load mean {_f(loaded.get('mean_ms'))} "
                  f"p99 {_f(loaded.get('p99_ms'))} max {_f(loaded.get('max_ms'))} ms; "
                  f"BDP {c['bdp_bytes']} B, tbf queue {c['tbf_queue_ms']:.1f} ms")

    t = Table(title=f"Loss fidelity (pass: expected inside the {CONFIDENCE:.0%} interval of the measurement)")
    for col in ("loss per egress", "path", "packets", "lost", "measured %", "expected %", "interval %",
                "engine drops n1/n2", "result"):
        t.add_column(col, justify="right")
    for row in results["loss"]:
        drops = "/".join(str(row["engine_drops"].get(n, "-")) for n in ("n1", "n2"))
        t.add_row(f"{row['loss']:.0%}", row["kind"], str(row["sent"]), str(row["lost"]),
                  _f(row["measured"] * 100, ".2f"), _f(row["expected"] * 100, ".2f"),
                  f"{row['ci_low'] * 100:.2f}..{row['ci_high'] * 100:.2f} ({row['ci_method']})",
                  drops, _ok(row["pass"]))
    console.print(t)


# --- main ------------------------------------------------------------------------------------

MAIN_PID = os.getpid()


def _on_signal(signum, frame):
    """Ctrl-C / SIGTERM: unwind to the clean-up, but only in this process.

    pyroute2's NetNS forks short-lived helper children and SIGTERMs them when done; a
    Ctrl-C reaches them too (same process group). A Python handler is inherited across
    fork(), so a helper that raised here would run *our* finally (a second reset) from
    inside pyroute2. Helpers just exit.
    """
    if os.getpid() != MAIN_PID:
        os._exit(128 + signum)
    raise KeyboardInterrupt


def wait_for_free_machine(local, console) -> None:
    start = time.monotonic()
    while True:
        existing = local.list_netbench_netns()
        if not existing:
            return
        waited = time.monotonic() - start
        if waited >= WAIT_MAX_S:
            raise TimeoutError(f"a netbench testbed ({', '.join(existing)}) is still up after "
                               f"{WAIT_MAX_S:.0f}s of waiting; not touching it")
        console.print(f"[yellow]a netbench testbed is up ({', '.join(existing)}); someone else is using "
                      f"the machine: waiting ({waited:.0f}s so far)[/]")
        time.sleep(WAIT_POLL_S)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer packets, shorter iperf3 (< 60 s)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"results file (default {DEFAULT_JSON})")
    p.add_argument("--backend", default="auto", choices=("auto", "netem", "userspace"))
    p.add_argument("--seed", type=int, default=0, help="engine seed (loss/jitter draws)")
    # internal: roles run inside a namespace
    p.add_argument("--role", choices=("udp-recv", "udp-send"), help=argparse.SUPPRESS)
    p.add_argument("--addr", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--count", type=int, help=argparse.SUPPRESS)
    p.add_argument("--pps", type=int, help=argparse.SUPPRESS)
    p.add_argument("--max-s", type=float, default=60.0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.role == "udp-recv":
        return role_udp_recv(args.addr, args.port, idle_s=1.0, max_s=args.max_s)
    if args.role == "udp-send":
        return role_udp_send(args.addr, args.port, args.count, args.pps)

    from rich.console import Console

    from netbench.emulation.executor import choose_backend
    from netbench.errors import NetbenchError, TestbedError
    from netbench.state.journal import Journal
    from netbench.state.reset import reset
    from netbench.testbed import netns as local

    console = Console(width=None if sys.stdout.isatty() else 150)
    if os.geteuid() != 0:
        console.print("[red]run as root (namespaces, qdiscs, iptables)[/]")
        return 2
    missing = [tool for tool in ("ping", "iperf3", "ss", "iptables") if shutil.which(tool) is None]
    if missing:
        console.print(f"[red]missing tools: {', '.join(missing)}[/] (apt-get install -y iperf3 iputils-ping iproute2)")
        return 2
    settings = QUICK if args.quick else FULL
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    state = Path(tempfile.mkdtemp(prefix="netbench-fidelity-"))
    journal = Journal(state)
    t0 = time.monotonic()
    started = time.time()
    results: dict[str, Any] = {}
    status = 2
    try:
        while True:
            wait_for_free_machine(local, console)
            choice = choose_backend(None if args.backend == "auto" else args.backend)
            try:
                topology = local.up(2, journal)
                break
            except TestbedError as exc:
                if journal.pending() or "already up" not in str(exc):
                    raise  # ours, half made: the finally below removes it
                console.print("[yellow]another testbed appeared just now; waiting again[/]")
        console.print(f"testbed up: {', '.join(f'{n.name}={n.address}' for n in topology.nodes)} "
                      f"({topology.subnet}); backend {choice.name}: {choice.reason}")
        bench = Bench(settings, choice.name, topology, journal, console, args.seed)
        sections: dict[str, float] = {"setup": round(time.monotonic() - t0, 2)}
        for key, label, fn in (("baseline", "baseline ping", bench.baseline),
                               ("delay", "delay", lambda: bench.delay(results["baseline"].get("mean_ms"))),
                               ("rate", "rate", bench.rate),
                               ("combined", "rate + delay", bench.combined),
                               ("loss", "loss", bench.loss)):
            t = time.monotonic()
            with console.status(label):
                results[key] = fn()
            sections[key] = round(time.monotonic() - t, 2)
        duration = time.monotonic() - t0
        checks = ([r["pass"] for r in results["delay"]] + [r["pass"] for r in results["rate"]]
                  + [r["pass"] for r in results["loss"]])
        results["summary"] = {"checks": len(checks), "passed": sum(checks), "failed": len(checks) - sum(checks)}
        results["meta"] = {
            "started": started, "duration_s": round(duration, 1), "quick": args.quick,
            "section_s": sections, "emulation_change_s": round(bench.emulation_s, 2),
            "settings": asdict(settings), "backend": choice.name, "backend_reason": choice.reason,
            "seed": args.seed, "topology": topology.to_json(), "kernel": platform.release(),
            "python": platform.python_version(), "cpus": os.cpu_count(),
            "iperf3": subprocess.run(["iperf3", "--version"], capture_output=True, text=True).stdout.split("\n")[0],
        }
        print_tables(console, results)
        console.print(f"{results['summary']['passed']}/{results['summary']['checks']} checks passed "
                      f"in {duration:.0f} s")
        status = 0 if not results["summary"]["failed"] else 1
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: cleaning up[/]")
        status = 130
    except (NetbenchError, RuntimeError, TimeoutError) as exc:
        hint = getattr(exc, "hint", None)
        console.print(f"[red]error: {exc}[/]" + (f" (hint: {hint})" if hint else ""))
        status = 2
    finally:
        if os.getpid() != MAIN_PID:  # a forked helper must never clean up for us
            os._exit(1)
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not stop the clean-up
        old_term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            if journal.pending():  # only what this run created; never someone else's testbed
                removed = reset(journal)
                console.print(f"reset: removed {len(removed)} item(s)")
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)
            shutil.rmtree(state, ignore_errors=True)
    if results:
        results.setdefault("meta", {})["exit_status"] = status
        results["meta"].setdefault("duration_s", round(time.monotonic() - t0, 1))
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True, default=str) + "\n")
        console.print(f"wrote {args.json}")
    return status


if __name__ == "__main__":
    sys.exit(main())
