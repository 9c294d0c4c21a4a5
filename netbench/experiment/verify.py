"""Measure the active profile between two testbed nodes and compare it with what was configured.

The expectation is pure: from each node's profile (as configured, or as read back from the
kernel) it works out which shaped points a packet crosses on the way from `src` to `dst`
and back, and so the round-trip time, round-trip loss and bottleneck rate that path should
show. The measurement is real: `ping` for RTT and loss, `iperf3` for TCP throughput, both
run inside the nodes' namespaces. `compare` turns the two into rows with the error and a
verdict; tolerances are stated in the rows so a reader can judge them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import math
import re
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from netbench import proc
from netbench.stats import clopper_pearson_interval, percentile, tolerance
from netbench.errors import NetbenchError
from netbench.model.profile import Profile
from netbench.model.topology import Node, Topology

# tbf, htb and netem count whole frames; TCP carries MSS of MSS + TCP/IP/Ethernet headers
# (20 + 12 timestamps + 20 + 14 bytes)
FRAME_OVERHEAD_BYTES = 66
DEFAULT_MSS = 1448
CONFIDENCE = 0.99
RTT_TOLERANCE_MS = 0.5  # absolute floor: scheduling noise on a loaded 2-core machine
RTT_TOLERANCE_REL = 0.05
RATE_TOLERANCE_REL = 0.10
IPERF_PORT = 5299


@dataclass(frozen=True)
class Settings:
    """How hard to look: ping count and interval (s), iperf3 seconds (0: no throughput test),
    and whether to measure throughput on a path with no configured rate (for the record)."""

    ping_count: int = 100
    ping_interval_s: float = 0.02
    iperf_seconds: float = 3.0
    unshaped_rate: bool = True


QUICK = Settings(ping_count=30, ping_interval_s=0.02, iperf_seconds=2.0, unshaped_rate=False)


@dataclass(frozen=True)
class Expected:
    """What the path src -> dst -> src should show, in canonical units."""

    rtt_us: int
    loss_round_trip: float  # probability a ping round trip is lost
    rate_bps: int | None  # bottleneck on src -> dst, None when unshaped
    crossings: int  # shaped points a round trip crosses


@dataclass(frozen=True)
class Measured:
    rtt_mean_us: float | None
    rtt_p50_us: float | None
    rtt_p99_us: float | None
    pings_sent: int
    pings_received: int
    throughput_bps: float | None  # iperf3 receiver goodput
    wire_rate_bps: float | None  # goodput scaled to whole frames, comparable with a shaped rate


@dataclass(frozen=True)
class Tolerance:
    """How far a mean RTT may stray from the configured one: `floor_ms` and `relative` of the
    configured RTT, added (`additive`, as all-pairs verification states it: 0.5 ms + 2 %) or
    the larger of the two (the single-pair default: 0.5 ms or 5 %)."""

    floor_ms: float = RTT_TOLERANCE_MS
    relative: float = RTT_TOLERANCE_REL
    additive: bool = False

    def ms(self, expected_ms: float) -> float:
        if self.additive:
            return self.floor_ms + self.relative * expected_ms
        return tolerance(expected_ms, self.floor_ms, self.relative)

    def describe(self) -> str:
        return f"{self.floor_ms:g} ms {'+' if self.additive else 'or'} {self.relative * 100:g} %"


@dataclass(frozen=True)
class Check:
    metric: str
    configured: float | None
    measured: float | None
    error: float | None  # measured - configured, in the metric's unit (ratio for rate)
    unit: str
    ok: bool | None  # None: nothing to judge (not configured or not measured)
    rule: str


def _in(address: str, cidrs: tuple[str, ...]) -> bool:
    ip = ipaddress.IPv4Address(address)
    return any(ip in ipaddress.IPv4Network(c, strict=False) for c in cidrs)


def _shaped(profile: Profile | None, side: str, other: str) -> bool:
    """Does `profile` shape traffic on `side` ("egress"/"ingress") exchanged with `other`?"""
    if profile is None or profile.is_null:
        return False
    if profile.direction not in (side, "both"):
        return False
    return not profile.peers or _in(other, profile.peers)


def shaped_points(src: Node, src_profile: Profile | None, dst: Node,
                  dst_profile: Profile | None) -> tuple[list[Profile], list[Profile]]:
    """The shaped points on src -> dst (src egress, dst ingress) and back (dst egress,
    src ingress), with peers given as CIDRs (as read back from the kernel)."""
    forward = [p for p, side, other in ((src_profile, "egress", dst.address), (dst_profile, "ingress", src.address))
               if _shaped(p, side, other)]
    back = [p for p, side, other in ((dst_profile, "egress", src.address), (src_profile, "ingress", dst.address))
            if _shaped(p, side, other)]
    return forward, back


def expected_path(src: Node, src_profile: Profile | None, dst: Node, dst_profile: Profile | None) -> Expected:
    """What a round trip src -> dst -> src crosses (shaped_points) should show."""
    return expected_crossing(*shaped_points(src, src_profile, dst, dst_profile))


def expected_crossing(forward: list[Profile], back: list[Profile]) -> Expected:
    """The round trip over the shaped points `forward` (src -> dst) and `back` (dst -> src):
    delays add, survival multiplies, the rate is the forward path's bottleneck."""
    crossings = forward + back
    survive = math.prod(1.0 - _loss(p) for p in crossings)
    rates = [p.rate_bps for p in forward if p.rate_bps]
    return Expected(rtt_us=sum(p.delay_us for p in crossings), loss_round_trip=1.0 - survive,
                    rate_bps=min(rates) if rates else None, crossings=len(crossings))


def _loss(profile: Profile) -> float:
    """Long-run drop probability at one shaped point (Gilbert-Elliott: the stationary mix)."""
    if profile.uses_ge:
        bad_share = profile.ge_p / (profile.ge_p + profile.ge_r) if profile.ge_p + profile.ge_r else 0.0
        return bad_share * profile.ge_bad_loss + (1 - bad_share) * profile.ge_good_loss
    return profile.loss


def compare(expected: Expected, measured: Measured, rtt_tolerance: Tolerance = Tolerance()) -> list[Check]:
    """Configured against measured, with the error and whether it is within tolerance."""
    checks = []
    rtt_ms = expected.rtt_us / 1000
    tol = rtt_tolerance.ms(rtt_ms)
    got = None if measured.rtt_mean_us is None else measured.rtt_mean_us / 1000
    checks.append(Check("rtt", rtt_ms, got, None if got is None else got - rtt_ms, "ms",
                        None if got is None else abs(got - rtt_ms) <= tol,
                        f"mean RTT within {tol:.2f} ms of the configured delays"))
    n, k = measured.pings_sent, measured.pings_sent - measured.pings_received
    lo, hi = clopper_pearson_interval(k, n, CONFIDENCE)
    lost = k / n if n else None
    checks.append(Check("loss", expected.loss_round_trip, lost,
                        None if lost is None else lost - expected.loss_round_trip, "ratio",
                        None if lost is None else lo <= expected.loss_round_trip <= hi,
                        f"configured round-trip loss inside the exact {CONFIDENCE:.0%} interval "
                        f"[{lo:.4f}, {hi:.4f}] of {n} pings"))
    if expected.rate_bps is None:
        checks.append(Check("rate", None, measured.wire_rate_bps, None, "bit/s", None,
                            "no rate configured: measured for the record"))
    else:
        wire = measured.wire_rate_bps
        rel = None if wire is None else wire / expected.rate_bps - 1
        if expected.loss_round_trip > 0:
            # TCP backs off on every loss and stays below the rate: measured, not judged
            ok, rule = None, "not judged: TCP under loss stays below the configured rate"
        else:
            ok = None if rel is None else abs(rel) <= RATE_TOLERANCE_REL
            rule = f"TCP goodput as whole frames within {RATE_TOLERANCE_REL:.0%} of the configured rate"
        checks.append(Check("rate", float(expected.rate_bps), wire, rel, "bit/s", ok, rule))
    return checks


def passed(checks: list[Check]) -> bool:
    return all(c.ok is not False for c in checks)


def summary(expected: Expected, measured: Measured, checks: list[Check]) -> dict[str, Any]:
    """A JSON-ready record: what sweeps store beside the configured profile."""
    return {"expected": asdict(expected), "measured": asdict(measured), "checks": [asdict(c) for c in checks],
            "ok": passed(checks)}


# ---------------------------------------------------------------- measurement (the edge)

_PING_LINE = re.compile(r"icmp_seq=\d+ .*time=([\d.]+) ms")
_PING_SUMMARY = re.compile(r"(\d+) packets transmitted, (\d+) received")


def parse_ping(text: str) -> tuple[int, int, list[float]]:
    """(sent, received, RTTs in us) from iputils ping output; duplicates are not replies."""
    summary_line = _PING_SUMMARY.search(text)
    if summary_line is None:
        raise NetbenchError(f"ping printed no summary: {text.strip()[-200:]}")
    times = [float(m.group(1)) * 1000 for line in text.splitlines() if "DUP!" not in line
             for m in [_PING_LINE.search(line)] if m]
    return int(summary_line.group(1)), int(summary_line.group(2)), times


def measure(src: Node, dst: Node, settings: Settings = Settings()) -> Measured:
    """ping dst from src, then (if asked) iperf3 TCP src -> dst; both inside the namespaces."""
    argv = ["ping", "-n", "-c", str(settings.ping_count), "-i", f"{settings.ping_interval_s:g}", "-W", "2",
            dst.address]
    result = proc.run(argv, netns=src.netns, timeout=settings.ping_count * settings.ping_interval_s + 30,
                      check=False)
    sent, received, times = parse_ping(result.stdout)
    throughput = wire = None
    if settings.iperf_seconds > 0:
        throughput, wire = measure_throughput(src, dst, settings.iperf_seconds)
    return Measured(rtt_mean_us=statistics.fmean(times) if times else None,
                    rtt_p50_us=percentile(times, 50) if times else None,
                    rtt_p99_us=percentile(times, 99) if times else None, pings_sent=sent, pings_received=received,
                    throughput_bps=throughput, wire_rate_bps=wire)


def measure_throughput(src: Node, dst: Node, seconds: float) -> tuple[float, float]:
    """One iperf3 TCP test src -> dst: (receiver goodput, the same scaled to whole frames), bit/s."""
    throughput, mss = _iperf(src, dst, seconds)
    return throughput, throughput * (mss + FRAME_OVERHEAD_BYTES) / mss


def _iperf(src: Node, dst: Node, seconds: float) -> tuple[float, int]:
    """Receiver goodput (bits/s) of one iperf3 TCP test src -> dst, and the MSS it used."""
    report = iperf3_report(src, dst, seconds)
    mss = report.get("start", {}).get("tcp_mss_default") or DEFAULT_MSS
    return float(report["end"]["sum_received"]["bits_per_second"]), int(mss)


def iperf3_report(src: Node, dst: Node, seconds: float, server_log: Path | None = None) -> dict:
    """iperf3's JSON report of one TCP test src -> dst (server on dst, started and stopped
    here; its output to `server_log` if given). A test that gives no report is an error."""
    with open(server_log, "wb") if server_log else contextlib.nullcontext(subprocess.DEVNULL) as out:
        server = proc.spawn(["iperf3", "-s", "-1", "-B", dst.address, "-p", str(IPERF_PORT)], netns=dst.netns,
                            stdout=out, stderr=subprocess.STDOUT if server_log else subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while f"{dst.address}:{IPERF_PORT}" not in proc.run(["ss", "-Hlnt"], netns=dst.netns, check=False).stdout:
            if time.monotonic() > deadline or server.poll() is not None:
                raise NetbenchError(f"iperf3 server in {dst.netns} did not start")
            time.sleep(0.05)
        result = proc.run(["iperf3", "-c", dst.address, "-B", src.address, "-p", str(IPERF_PORT),
                           "-t", f"{seconds:g}", "-J"], netns=src.netns, timeout=seconds + 30, check=False)
        try:
            report = json.loads(result.stdout)
        except json.JSONDecodeError:
            raise NetbenchError(f"iperf3 gave no report: {(result.stderr or result.stdout).strip()[-200:]}") from None
        if "error" in report:
            raise NetbenchError(f"iperf3: {report['error']}")
        return report
    finally:
        if server.poll() is None:
            proc.stop(server, grace=1.0)


def verify(src: Node, src_profile: Profile | None, dst: Node, dst_profile: Profile | None,
           settings: Settings = Settings(), rtt_tolerance: Tolerance = Tolerance()) -> dict[str, Any]:
    """Measure src <-> dst and compare with the profiles each holds; a summary record."""
    expected = expected_path(src, src_profile, dst, dst_profile)
    if expected.rate_bps is None and not settings.unshaped_rate:
        settings = Settings(settings.ping_count, settings.ping_interval_s, 0.0, False)
    measured = measure(src, dst, settings)
    return summary(expected, measured, compare(expected, measured, rtt_tolerance))


def verify_point(run, topology: Topology, observer) -> dict | None:
    """Measure the point just applied between the first two nodes (quick settings); a
    measurement that cannot be made is recorded as such and does not stop the sweep.

    `run` is a netbench.model.run.Run; `observer` hears a note (the runner's Observer)."""
    if len(topology.nodes) < 2:
        return None
    src, dst = topology.nodes[:2]
    try:
        record = verify(src, run.profile, dst, run.profile, QUICK)
    except NetbenchError as exc:
        observer.note(f"{run.run_id}: verify could not measure: {exc.message}")
        return {"error": exc.message}
    checks = {c["metric"]: c for c in record["checks"]}
    rtt = checks["rtt"]
    observer.note(f"{run.run_id}: verify RTT {rtt['measured'] or 0:.2f} ms (configured {rtt['configured']:.2f} ms)"
                  + ("" if record["ok"] else " [out of tolerance]"))
    return record
