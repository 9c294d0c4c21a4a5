"""Verify every ordered pair of testbed nodes: the RTT matrix measured beside the configured one.

The expectation is pure: from a per-pair topology (model/pairs.py: the one-way profile of
each ordered pair) or, without one, from the profile each node holds (verify.expected_path),
every ordered pair (src, dst) gets its configured one-way delays both ways and the round
trip, loss and rate a ping and an iperf3 test from src to dst should show.

The measurement pings every ordered pair in rounds: in round k node i pings node i + k
(mod n), all nodes of a round at once. Each node then sends one ping stream and answers one,
so no node's egress or delay engine carries more than two light streams at a time (a few
dozen small packets a second: an unloaded link delays them as it would one stream), and
n nodes take n - 1 rounds, not n (n - 1) sequential pings. Throughput tests, which would
disturb each other, run one ordered pair at a time after the pings.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from netbench import units
from netbench.errors import NetbenchError, UsageError
from netbench.experiment import verify
from netbench.model.pairs import PairTopology
from netbench.model.profile import Profile
from netbench.model.topology import Node, Topology

PAIRS_TOLERANCE = verify.Tolerance(floor_ms=0.5, relative=0.02, additive=True)
# ping count and interval when all pairs are measured; iperf3 only when asked for
PAIRS_SETTINGS = verify.Settings(ping_count=50, ping_interval_s=0.02, iperf_seconds=0.0, unshaped_rate=False)
MAX_PARALLEL = 16  # pings of one round in flight at once (a 64-node round runs in four waves)

Pair = tuple[str, str]
Pinger = Callable[[Node, Node, verify.Settings], verify.Measured]
Throughput = Callable[[Node, Node, float], tuple[float, float]]


@dataclass(frozen=True)
class PairExpected:
    """What src -> dst -> src should show: the configured one-way delays each way (the sum
    of the shaped points crossed) and the round trip (verify.Expected)."""

    src: str
    dst: str
    delay_there_us: int
    delay_back_us: int
    path: verify.Expected


# ---------------------------------------------------------------- expectation (pure)

def expected_matrix(topology: Topology, pairs: PairTopology | None,
                    profile: Profile | Mapping[str, Profile | None] | None) -> dict[Pair, PairExpected]:
    """Every ordered pair of the testbed's nodes and what it should show: from `pairs` when
    given (pairs.link(src, dst) is the one-way path; a pair it does not shape is unshaped),
    else from `profile`, the one every node holds or a mapping node name -> the profile that
    node holds (as read back). A node of `pairs` that is not in the testbed is a UsageError."""
    names = [node.name for node in topology.nodes]
    if pairs is not None:
        unknown = [name for name in pairs.nodes if name not in names]
        if unknown:
            where = f"topology {pairs.source or pairs.name}"
            raise UsageError(f"{where}: node {unknown[0]} is not in the testbed ({', '.join(names)})",
                             hint="name the testbed's nodes, or bring up a testbed with as many nodes")
    out = {}
    for src in topology.nodes:
        for dst in topology.nodes:
            if src.name == dst.name:
                continue
            if pairs is not None:
                forward = [p for p in [pairs.link(src.name, dst.name)] if p is not None and not p.is_null]
                back = [p for p in [pairs.link(dst.name, src.name)] if p is not None and not p.is_null]
            else:
                held = profile if isinstance(profile, Mapping) else {src.name: profile, dst.name: profile}
                forward, back = verify.shaped_points(src, held.get(src.name), dst, held.get(dst.name))
            out[(src.name, dst.name)] = PairExpected(
                src.name, dst.name, sum(p.delay_us for p in forward), sum(p.delay_us for p in back),
                verify.expected_crossing(forward, back))
    return out


def parse_tolerance(text: str, where: str = "flag --tolerance") -> verify.Tolerance:
    """'0.5ms+2%' (either term alone too): a floor and a share of the configured RTT, added."""
    floor_ms, relative = 0.0, 0.0
    terms = [term.strip() for term in str(text).split("+")]
    try:
        if not all(terms):
            raise ValueError("an empty term")
        for term in terms:
            if term.endswith("%"):
                relative += units.parse_ratio(term)
            else:
                floor_ms += units.parse_duration_us(term) / 1000
    except ValueError as exc:
        raise UsageError(f"{where}: {text!r}: {exc}", hint="e.g. 0.5ms+2%, 1ms or 3%") from None
    return verify.Tolerance(floor_ms=floor_ms, relative=relative, additive=True)


def compare_pairs(expected: Mapping[Pair, PairExpected], measured: Mapping[Pair, verify.Measured],
                  tolerance: verify.Tolerance = PAIRS_TOLERANCE) -> dict[Pair, list[verify.Check]]:
    """Each measured pair's checks (verify.compare) against its expectation."""
    return {pair: verify.compare(expected[pair].path, got, tolerance) for pair, got in measured.items()}


def matrix_record(topology: Topology, pairs: PairTopology | None, expected: Mapping[Pair, PairExpected],
                  measured: Mapping[Pair, verify.Measured], checks: Mapping[Pair, list[verify.Check]],
                  tolerance: verify.Tolerance, settings: verify.Settings) -> dict[str, Any]:
    """The JSON-ready matrix: matrix[src][dst] holds the pair's expectation, measurement,
    checks and verdict; `failed` names the pairs out of tolerance as "src->dst"."""
    names = [node.name for node in topology.nodes]
    matrix: dict[str, dict[str, Any]] = {name: {} for name in names}
    failed = []
    for (src, dst), got in measured.items():
        want = expected[(src, dst)]
        ok = verify.passed(checks[(src, dst)])
        if not ok:
            failed.append(f"{src}->{dst}")
        matrix[src][dst] = {"expected": {"delay_there_us": want.delay_there_us, "delay_back_us": want.delay_back_us,
                                         **asdict(want.path)},
                            "measured": asdict(got), "checks": [asdict(c) for c in checks[(src, dst)]], "ok": ok}
    return {"topology": None if pairs is None else {"name": pairs.name, "source": pairs.source, "scale": pairs.scale},
            "nodes": names,
            "tolerance": {"floor_ms": tolerance.floor_ms, "relative": tolerance.relative,
                          "additive": tolerance.additive, "rule": tolerance.describe()},
            "settings": asdict(settings), "matrix": matrix, "failed": failed, "ok": not failed}


# ---------------------------------------------------------------- measurement (the edge)

def ping_rounds(names: Sequence[str]) -> list[list[Pair]]:
    """Round k (1..n-1): node i pings node i + k (mod n). Every ordered pair once; within a
    round every node sends one ping stream and answers one."""
    n = len(names)
    return [[(names[i], names[(i + k) % n]) for i in range(n)] for k in range(1, n)]


def _ping(src: Node, dst: Node, settings: verify.Settings) -> verify.Measured:
    return verify.measure(src, dst, settings)


def measure_all_pairs(topology: Topology, settings: verify.Settings = PAIRS_SETTINGS, *,
                      throughput_pairs: Iterable[Pair] | None = None, pinger: Pinger | None = None,
                      throughput: Throughput | None = None, max_parallel: int = MAX_PARALLEL,
                      on_round: Callable[[int, int], None] | None = None) -> dict[Pair, verify.Measured]:
    """Ping every ordered pair (ping_rounds; up to `max_parallel` at once), then, when
    settings.iperf_seconds > 0, run iperf3 over `throughput_pairs` (None: every pair) one pair
    at a time. `pinger` and `throughput` default to verify.measure and verify.measure_throughput;
    `on_round(done, total)` hears each finished round."""
    pinger = pinger or _ping
    throughput = throughput or verify.measure_throughput
    by_name = {node.name: node for node in topology.nodes}
    rounds = ping_rounds([node.name for node in topology.nodes])
    pings = dataclasses.replace(settings, iperf_seconds=0.0)  # the pinger pings only
    measured: dict[Pair, verify.Measured] = {}
    if rounds:
        with ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(topology.nodes)))) as pool:
            for index, batch in enumerate(rounds, 1):
                futures = {pair: pool.submit(pinger, by_name[pair[0]], by_name[pair[1]], pings) for pair in batch}
                for pair, future in futures.items():
                    measured[pair] = future.result()
                if on_round is not None:
                    on_round(index, len(rounds))
    if settings.iperf_seconds > 0:
        for src, dst in (list(measured) if throughput_pairs is None else list(throughput_pairs)):
            goodput, wire = throughput(by_name[src], by_name[dst], settings.iperf_seconds)
            measured[(src, dst)] = dataclasses.replace(measured[(src, dst)], throughput_bps=goodput,
                                                       wire_rate_bps=wire)
    names = [node.name for node in topology.nodes]
    return {(s, d): measured[(s, d)] for s in names for d in names if s != d}  # in matrix order


def verify_all_pairs(topology: Topology, pairs: PairTopology | None,
                     profile: Profile | Mapping[str, Profile | None] | None,
                     settings: verify.Settings = PAIRS_SETTINGS, *, tolerance: verify.Tolerance = PAIRS_TOLERANCE,
                     pinger: Pinger | None = None, throughput: Throughput | None = None,
                     on_round: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Measure every ordered pair and compare it with `pairs` (or `profile`): matrix_record.
    Throughput (settings.iperf_seconds > 0) on every pair, or with settings.unshaped_rate
    False only on pairs with a configured rate. What a sweep stores in a run record."""
    expected = expected_matrix(topology, pairs, profile)
    rated = None if settings.unshaped_rate else [pair for pair, e in expected.items() if e.path.rate_bps]
    measured = measure_all_pairs(topology, settings, throughput_pairs=rated, pinger=pinger, throughput=throughput,
                                 on_round=on_round)
    return matrix_record(topology, pairs, expected, measured, compare_pairs(expected, measured, tolerance),
                         tolerance, settings)


def verify_pairs_point(run: Any, topology: Topology, observer: Any) -> dict | None:
    """sweep --verify for a run with a per-pair topology (`run.pairs`): every ordered pair
    measured (PAIRS_SETTINGS) against it, recorded as its matrix_record; a measurement that
    cannot be made is recorded as such and does not stop the sweep."""
    if len(topology.nodes) < 2:
        return None
    try:
        record = verify_all_pairs(topology, run.pairs, None, PAIRS_SETTINGS)
    except NetbenchError as exc:
        observer.note(f"{run.run_id}: verify could not measure: {exc.message}")
        return {"error": exc.message}
    failed = record["failed"]
    measured = sum(len(row) for row in record["matrix"].values())
    observer.note(f"{run.run_id}: verify {measured} pairs"
                  + (f", out of tolerance: {', '.join(failed)}" if failed else ", all within tolerance"))
    return record
