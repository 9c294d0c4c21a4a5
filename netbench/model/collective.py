"""Collective benchmark maths (pure): message sizes, algorithm and bus bandwidth as nccl-tests
defines them, summaries of timed repetitions, and the latency/bandwidth (alpha-beta) fit.

Units: bytes, seconds, and bandwidths in gigabits per second (Gbit/s, 1e9 bits/s, as the
network's rates are given; nccl-tests prints GB/s, 8 times smaller numbers).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from netbench import units

OPS = ("allreduce", "broadcast", "allgather")
DEFAULT_MIN_BYTES = 8
DEFAULT_MAX_BYTES = 64 * 2**20


def doubling_sizes(low: int = DEFAULT_MIN_BYTES, high: int = DEFAULT_MAX_BYTES) -> tuple[int, ...]:
    """low, 2 low, 4 low, ... up to high (inclusive where it lands on it)."""
    if low < 1 or high < low:
        raise ValueError(f"sizes: need 1 <= low <= high, got {low} and {high}")
    out, size = [], low
    while size <= high:
        out.append(size)
        size *= 2
    return tuple(out)


def bus_factor(op: str, workers: int) -> float:
    """busbw / algbw for `op` over `workers` (nccl-tests' factors): all-reduce 2(n-1)/n, all-gather
    (of a per-worker message) n-1, broadcast 1."""
    if op not in OPS:
        raise ValueError(f"op: unknown {op!r}; choose from {', '.join(OPS)}")
    n = max(1, workers)
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op == "allgather":
        return float(n - 1)
    return 1.0


def algbw_gbps(size_bytes: int, time_s: float) -> float:
    """Algorithm bandwidth: the message's bits over the time, in Gbit/s."""
    return size_bytes * 8 / time_s / 1e9 if time_s > 0 else 0.0


@dataclass(frozen=True)
class SizeResult:
    """One operation at one message size: the time of one collective (the median of the
    repetitions' slowest worker) and its bandwidths."""

    op: str
    bytes: int
    time_s: float
    algbw_gbps: float
    busbw_gbps: float
    reps: int

    def to_json(self) -> dict:
        return {"bytes": self.bytes, "time_s": self.time_s, "algbw_gbps": self.algbw_gbps,
                "busbw_gbps": self.busbw_gbps}


def summarise(op: str, size_bytes: int, times_by_worker: list[list[float]], workers: int) -> SizeResult:
    """A size's result from each worker's repetition times: each repetition lasts as long as its
    slowest worker (a collective ends when every worker has its result); the median over them."""
    reps = min((len(t) for t in times_by_worker), default=0)
    if reps == 0:
        raise ValueError(f"{op} at {size_bytes} bytes: no timed repetitions")
    slowest = [max(t[i] for t in times_by_worker) for i in range(reps)]
    time_s = statistics.median(slowest)
    alg = algbw_gbps(size_bytes, time_s)
    return SizeResult(op=op, bytes=size_bytes, time_s=time_s, algbw_gbps=alg,
                      busbw_gbps=alg * bus_factor(op, workers), reps=reps)


@dataclass(frozen=True)
class AlphaBeta:
    """time(bytes) = alpha_s + beta_s_per_byte * bytes for one operation."""

    alpha_s: float
    beta_s_per_byte: float

    def time(self, size_bytes: float) -> float:
        return self.alpha_s + self.beta_s_per_byte * size_bytes


def _weighted_line(xs: list[float], ys: list[float], ws: list[float]) -> tuple[float, float]:
    """Weighted least squares of y = a + b x: (a, b); b = 0 when x does not vary."""
    sw = sum(ws)
    mx = sum(w * x for w, x in zip(ws, xs)) / sw
    my = sum(w * y for w, y in zip(ws, ys)) / sw
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs))
    if sxx <= 0:
        return my, 0.0
    b = sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys)) / sxx
    return my - b * mx, b


def fit_alpha_beta(sizes: list[int] | tuple[int, ...], times: list[float] | tuple[float, ...],
                   iterations: int = 30, k: float = 1.345) -> AlphaBeta:
    """A robust fit of time = alpha + beta * bytes.

    Sizes span several decades, so the residuals are relative (each point weighted by 1/time^2:
    a small message's 1 ms counts as much as a large one's second), and Huber weights (k times
    the residuals' MAD scale, iteratively reweighted) keep one disturbed size from moving the
    line. Neither term is negative: a negative one is refitted as zero."""
    if len(sizes) != len(times) or not sizes:
        raise ValueError("fit: need as many times as sizes, at least one")
    if any(t <= 0 or not math.isfinite(t) for t in times):
        raise ValueError("fit: every time must be a finite number > 0")
    xs, ys = [float(s) for s in sizes], [float(t) for t in times]
    base = [1.0 / (y * y) for y in ys]
    robust = [1.0] * len(xs)
    a = b = 0.0
    for _ in range(iterations):
        ws = [w * r for w, r in zip(base, robust)]
        a, b = _weighted_line(xs, ys, ws)
        if b < 0:  # no per-byte cost visible: a constant
            b, a = 0.0, sum(w * y for w, y in zip(ws, ys)) / sum(ws)
        if a < 0:  # no latency visible: a line through the origin
            a, b = 0.0, sum(w * x * y for w, x, y in zip(ws, xs, ys)) / sum(w * x * x for w, x in zip(ws, xs))
        residuals = [(y - (a + b * x)) / y for x, y in zip(xs, ys)]
        scale = 1.4826 * statistics.median(abs(r) for r in residuals)
        if scale <= 1e-12:
            break
        updated = [min(1.0, k * scale / abs(r)) if r else 1.0 for r in residuals]
        if max(abs(u - r) for u, r in zip(updated, robust)) < 1e-9:
            break
        robust = updated
    return AlphaBeta(alpha_s=a, beta_s_per_byte=b)


def parse_bytes(text: str) -> int:
    """"8", "8B", "64KiB", "1MiB" -> bytes (units.parse_size_bytes); ValueError saying what is wrong."""
    return units.parse_size_bytes(text)


def parse_sizes(text: str) -> tuple[int, ...]:
    """"8-64MiB" (doubling from the first to the last) or a list "8,1KiB,1MiB" -> sorted bytes."""
    text = text.strip()
    if "-" in text and "," not in text:
        low, high = text.split("-", 1)
        return doubling_sizes(parse_bytes(low), parse_bytes(high))
    sizes = sorted({parse_bytes(part) for part in text.split(",") if part.strip()})
    if not sizes:
        raise ValueError("no sizes given")
    return tuple(sizes)


def format_bytes(size: int) -> str:
    """8 -> "8B", 65536 -> "64KiB", 67108864 -> "64MiB" (exact multiples only)."""
    return units.format_size_bytes(size)
