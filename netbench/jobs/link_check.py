"""Did a run's all-reduce take the path it should? Each node's link bytes per step beside the
collective's (pure).

With ``--sample-resources`` every rank samples its namespace's interface counters (loopback
left out: jobs/resources.py), so a node's first rank reports the bytes on the node's link,
and its measured steps say when they ran (both on the process's own monotonic clock). A
node's bytes per step is its counters' rate over the measured window divided by the rate of
its steps over the same window; `compare` sets it beside model.ranks.internode_bytes (ring or
hierarchical), which TCP/IP's headers and acknowledgements exceed by a few per cent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Union

from netbench.jobs import events as ev
from netbench.model import ranks


@dataclass(frozen=True)
class NodeBytes:
    """One node's link over its first rank's measured window: bytes sent and received per step."""

    node: int
    tx_per_step: float
    rx_per_step: float
    steps: float  # measured steps the window held (fractions at its edges)


def _window_steps(steps: list[ev.Step], start: float, end: float) -> float:
    """Steps inside [start, end], a step cut by an edge counted by the share inside."""
    total = 0.0
    for step in steps:
        length = step.end - step.start
        if length > 0:
            total += max(0.0, min(step.end, end) - max(step.start, start)) / length
    return total


def node_bytes(events: Iterable[Union[ev.Event, Mapping]], ranks_per_node: int = 1) -> tuple[NodeBytes, ...]:
    """Each node's bytes per measured step on its link, from its first rank's samples and steps
    (nodes without two samples inside the measured window are left out)."""
    samples: dict[int, list[ev.Resources]] = {}
    steps: dict[int, list[ev.Step]] = {}
    for e in map(ev.as_event, events):
        worker = e.worker or 0
        if e.task_role != "worker" or worker % max(1, ranks_per_node):
            continue
        if isinstance(e, ev.Resources):
            samples.setdefault(worker, []).append(e)
        elif isinstance(e, ev.Step) and e.phase == ev.PHASE_MEASURED and e.end > e.start:
            steps.setdefault(worker, []).append(e)
    out = []
    for worker in sorted(samples):
        measured = steps.get(worker, [])
        if not measured:
            continue
        first, last = min(s.start for s in measured), max(s.end for s in measured)
        inside = sorted((s for s in samples[worker] if first <= s.time <= last), key=lambda s: s.time)
        if len(inside) < 2:
            continue
        a, b = inside[0], inside[-1]
        count = _window_steps(measured, a.time, b.time)
        if count <= 0:
            continue
        out.append(NodeBytes(node=worker // max(1, ranks_per_node), tx_per_step=(b.tx_bytes - a.tx_bytes) / count,
                             rx_per_step=(b.rx_bytes - a.rx_bytes) / count, steps=count))
    return tuple(out)


def expected_per_step(collective: str, nodes: int, ranks_per_node: int, model_bytes: float,
                      accum_steps: int = 1) -> float:
    """Bytes each node sends per step in the gradient all-reduce (one all-reduce of the model's
    gradients per update; allreduce-accum's k micro-batches share one)."""
    del accum_steps  # one all-reduce per update whatever its micro-batches
    return ranks.internode_bytes(collective, nodes, ranks_per_node, model_bytes)


def compare(measured: Iterable[NodeBytes], expected: float, tolerance: float = 0.10) -> list[str]:
    """Lines for the nodes whose bytes sent per step are off the expected by more than `tolerance`."""
    return [f"node {m.node}: {m.tx_per_step:,.0f} bytes sent per step, expected {expected:,.0f}"
            for m in measured if not ranks.bytes_agree(m.tx_per_step, expected, tolerance)]


COLUMNS = ("ranks_per_node", "collective", "link_bytes_per_step", "link_bytes_expected_per_step")


def record_fields(events, job, workers: int) -> dict:
    """A run record's `ranks`: ranks_per_node, collective and, for the built-in all-reduce
    strategies with resource samples, link_bytes_per_step (each node's bytes sent per measured
    step on its link, the mean over nodes) and link_bytes_expected_per_step (the collective's)."""
    out: dict = {"ranks_per_node": job.ranks_per_node, "collective": job.collective}
    if job.command is None and job.strategy.startswith("allreduce"):
        events = list(events)
        found = node_bytes(events, job.ranks_per_node)
        model_bytes = next((e.model_bytes for e in map(ev.as_event, events) if isinstance(e, ev.Start)), 0)
        if found:
            out["link_bytes_per_step"] = sum(n.tx_per_step for n in found) / len(found)
            nodes = ranks.nodes_for_ranks(workers, job.ranks_per_node)
            out["link_bytes_expected_per_step"] = expected_per_step(job.collective, nodes, job.ranks_per_node,
                                                                    float(model_bytes or 0))
    return {"ranks": out}


def csv_cells(record: Mapping | None) -> dict:
    """results.csv's COLUMNS from a record's `ranks` (None: a record from before them, one rank a node)."""
    record = record or {}
    out = {"ranks_per_node": record.get("ranks_per_node", 1), "collective": record.get("collective", "ring")}
    for name in COLUMNS[2:]:
        value = record.get(name)
        out[name] = "" if value is None else round(value)
    return out
