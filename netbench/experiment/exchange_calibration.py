"""The exchange calibration: netbench's own exchange protocol timed on the links as the
testbed starts (unshaped), beside the collective one (experiment/predict.py).

Two processes of netbench.jobs.exchange_bench, on the first two worker nodes (placed and
launched as the collective calibration's are, through the job launcher in the nodes'
namespaces): worker 0 answers, worker 1 times request-reply transfers of EXCHANGE_SIZES
bytes each way in the protocol's frames over one TCP connection between the two nodes'
addresses. Each size's median is fitted to alpha + beta x bytes moved (2 x the size;
model.collective's robust fit), and each node reports its namespace's TCP buffer limits,
from which model/exchange_model.py takes the window. It takes about a second; a failure is
noted and the exchange strategies fall back to the all-reduce's terms.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Iterable

from netbench.errors import NetbenchError
from netbench.jobs.exchange_bench import EVENT, LIMITS_EVENT
from netbench.jobs.launch import Timeouts, run_job
from netbench.model import collective as maths
from netbench.model import exchange_model
from netbench.model.job import plan_job

BENCH_MODULE = "netbench.jobs.exchange_bench"
EXCHANGE_SIZES = (64 * 2**10, 256 * 2**10, 2**20, 4 * 2**20)
WARMUP, REPS = 2, 5
TIMEOUTS = Timeouts(startup_s=60.0, step_s=60.0)


@dataclass(frozen=True)
class Exchange:
    """The protocol's request-reply terms (seconds; seconds per byte moved, both directions
    counted) and the window the nodes' kernels allow a connection (None: unknown)."""

    alpha_s: float
    beta_s_per_byte: float
    window_bytes: int | None


def measured() -> dict[str, Any]:
    """What the calibration measures (its cache key's `measured`; experiment/calibration_cache.py)."""
    return {"protocol": "exchange", "ranks": 2, "nodes": 2, "sizes": list(EXCHANGE_SIZES),
            "warmup": WARMUP, "reps": REPS}


def bench_argv(sizes: tuple[int, ...] = EXCHANGE_SIZES, python: str = sys.executable) -> tuple[str, ...]:
    return (python, "-m", BENCH_MODULE, "--sizes", ",".join(str(s) for s in sizes),
            "--warmup", str(WARMUP), "--reps", str(REPS), "--timeout", "30")


def summarise(events: Iterable[Any]) -> tuple[Exchange, dict[str, Any]]:
    """The fit and the window from the processes' events (pure); ValueError when no size was
    timed. The window is the smallest any node allows."""
    medians: dict[int, float] = {}
    windows: list[int] = []
    limits: list[dict[str, Any]] = []
    for event in events:
        kind = getattr(event, "kind", None)
        if kind not in (EVENT, LIMITS_EVENT):
            continue
        body = {k: v for k, v in event.body().items() if k != "event"}
        if kind == EVENT and body.get("times"):
            medians[int(body["bytes"])] = statistics.median(float(t) for t in body["times"])
        elif kind == LIMITS_EVENT:
            limits.append(body)
            window = exchange_model.window_from_limits(body)
            if window is not None:
                windows.append(window)
    if not medians:
        raise ValueError("the exchange benchmark timed no size")
    sizes = sorted(medians)
    fit = maths.fit_alpha_beta([2 * s for s in sizes], [medians[s] for s in sizes])
    result = Exchange(alpha_s=fit.alpha_s, beta_s_per_byte=fit.beta_s_per_byte,
                      window_bytes=min(windows) if windows else None)
    facts = {"alpha_s": result.alpha_s, "beta_s_per_byte_moved": result.beta_s_per_byte,
             "window_bytes": result.window_bytes, "tcp_limits": limits[0] if limits else {},
             "sizes": [{"bytes": s, "time_s": medians[s]} for s in sizes]}
    return result, facts


def measure(testbed, log_dir, port: int) -> tuple[Exchange, dict[str, Any]]:
    """Time the protocol between the first two worker nodes, on the links as they are now."""
    from netbench.experiment.collective import JOB

    nodes = testbed.nodes_for(JOB, 2)
    tasks = [replace(t, argv=bench_argv()) for t in plan_job(JOB, nodes, 2, port=port)]
    started = time.monotonic()
    outcome = run_job(tasks, log_dir, testbed.spawn, TIMEOUTS)
    if outcome.status != "ok":
        raise NetbenchError(f"exchange calibration: {outcome.error}", hint=f"the processes' logs are in {log_dir}")
    try:
        result, facts = summarise(outcome.events)
    except ValueError as exc:
        raise NetbenchError(f"exchange calibration: {exc}", hint=f"the processes' logs are in {log_dir}") from None
    return result, {**facts, "seconds": round(time.monotonic() - started, 3)}
