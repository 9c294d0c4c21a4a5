"""A model of a training step from the point's network and measured inputs (pure).

    step = compute x batches per step + communication(strategy's pattern, alpha, beta)

* compute: the per-batch time of the job's model on one node with no network (the compute
  calibration: one single-strategy process per worker node at once, so the CPU is shared
  as in the run);
* communication: what the strategy moves per step (PATTERNS), with the point's terms:
  - a message's latency: the framework's overhead per collective (the intercept of an
    all-reduce on unshaped links, measured) plus one round trip (2 x the configured one-way
    delay: TensorFlow's ring moves each chunk with a RecvBuf RPC, a request and its reply)
    per sequential transfer; torch's Gloo ring is replayed segment by segment instead
    (model/gloo_ring.py: two segments in flight, so its round trips overlap its transfers);
  - a byte's cost: the configured rate's (8 / rate), or the per-byte cost measured on
    unshaped links when that is slower (the CPU then limits, not the link).

The exchange strategies (ps-sync, ps-async, ps-ssp, easgd, gosgd, adpsgd) move their models
in netbench's own frames on plain TCP, not in TensorFlow's collectives: their communication is
model/exchange_model.py's, with the exchange protocol's own calibration and TCP's window.

Unequal nodes (model/compute.py): a worker's compute is the calibrated one times its slowdown
under its CPU limit, plus its step delay; a synchronous step waits for the slowest worker.

Where it stops holding (docs/guide/collectives.md and docs/validation.md say more): loss (TCP's recovery is not modelled),
CPU saturation beyond what the compute calibration shared, congestion-window growth when a
step's transfer is short against the bandwidth-delay product (slow start after idle), and
jitter (ignored).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

from netbench.model import exchange_model, gloo_ring, ranks
from netbench.model.job import OWN_PACE_STRATEGIES


@dataclass(frozen=True)
class Calibration:
    """Measured apart from any point's steps: the all-reduce's intercept and slope on unshaped
    links (seconds, seconds per byte) for `workers`, and the compute time of a batch per job
    key (compute_key)."""

    overhead_s: float
    beta_s_per_byte: float
    workers: int
    compute_s: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StepInputs:
    """One point of one job: everything the model reads."""

    strategy: str
    workers: int
    model_bytes: int
    compute_s: float  # one batch on one node
    delay_s: float  # configured one-way delay
    rate_bps: float | None  # configured rate; None: unshaped
    overhead_s: float  # per collective (or per message), measured
    beta_s_per_byte: float  # the all-reduce's per-byte slope on unshaped links, measured
    accum_steps: int = 1
    ps: int = 1
    buckets: int = 1  # all-reduces per step: TF packs every gradient into one (bytes_per_pack 0)
    params: Mapping[str, float] = field(default_factory=dict)  # a pattern's own settings (period, ...)
    # per-pair topologies: the round trip of each hop of the ring, worker i to worker i + 1 (the
    # sum of the two one-way delays); () when every pair has `delay_s` each way
    ring_rtts_s: tuple[float, ...] = ()
    # the exchange protocol's request-reply fit on unshaped links (seconds; seconds per byte
    # moved) and the most a TCP connection keeps in flight (the nodes' kernel limits); None:
    # not calibrated (older folders), the all-reduce's terms stand in and no window binds
    exchange_alpha_s: float | None = None
    exchange_beta_s_per_byte: float | None = None
    window_bytes: float | None = None
    # unequal nodes (model/compute.py): each worker's compute slowdown (its CPU limit against the
    # calibration's unlimited node) and step delay, worker 0 first; () when every node is as calibrated
    node_slowdown: tuple[float, ...] = ()
    node_delay_s: tuple[float, ...] = ()
    # several ranks per node (model/ranks.py): `workers` ranks, ranks_per_node of them on each
    # node talking over its loopback; collective "ring" (every rank) or "hierarchical"
    ranks_per_node: int = 1
    collective: str = "ring"
    # ps-sync's backup workers: a round closes on the first workers - backup gradients
    backup_workers: int = 0
    # the framework's collectives (model/frameworks.py): TensorFlow's ring passes each chunk on
    # hop after hop; Gloo's (torch) is replayed (model/gloo_ring.py)
    framework: str = "tensorflow"
    # the exchange strategies: the job's own mean step on unshaped links, measured
    # (experiment/base_calibration.py); None: predicted from the parts alone
    base_step_s: float | None = None


@dataclass(frozen=True)
class Prediction:
    step_s: float
    compute_s: float
    comm_s: float
    floor_s: float  # compute plus the communication's physical lower bound


# seconds per payload byte on one node's shaped egress (0: unshaped)
_wire = exchange_model.wire_s_per_byte


def link_beta(x: StepInputs) -> float:
    """Seconds per byte of a point-to-point transfer: the rate's, or the measured one when slower
    (the measured slope is the all-reduce's; one link carries 2(n-1)/n of its bytes)."""
    n = max(2, x.workers)
    measured = x.beta_s_per_byte * n / (2 * (n - 1))
    return max(_wire(x), measured)


def ring_round_trips_s(x: StepInputs) -> float:
    """The round trips a ring all-reduce waits on: its 2(n-1) transfers follow each other
    around the ring, each a round trip on its hop (a transfer can start only when the one
    before it on the ring has arrived), so the slowest run of 2(n-1) consecutive hops: with
    every pair alike 2(n-1) x 2 x delay, on a per-pair topology the hops' own round trips."""
    n = x.workers
    transfers = 2 * (n - 1)
    if len(x.ring_rtts_s) != n:
        return transfers * 2 * x.delay_s
    hops = x.ring_rtts_s
    return max(sum(hops[(start + k) % n] for k in range(transfers)) for start in range(n))


def allreduce_s(x: StepInputs, size_bytes: float | None = None) -> float:
    """Ring all-reduce of `size_bytes` (default: the model's) in x.buckets pieces: 2(n-1)
    sequential transfers of 1/n of a bucket, each a round trip, per bucket, and the measured
    overhead once. Several ranks per
    node: two_level_allreduce_s."""
    n = x.workers
    if n < 2:
        return 0.0
    size = x.model_bytes if size_bytes is None else size_bytes
    if x.framework == "torch" and x.collective == "ring" and len(x.ring_rtts_s) != n:
        return x.overhead_s + gloo_ring_s(x, size, n, max(1, x.ranks_per_node))
    if x.ranks_per_node > 1:
        return two_level_allreduce_s(x, size)
    # the overhead once per step: it is the calibration's (TensorFlow's collective ops, one pack)
    latency = x.overhead_s + x.buckets * ring_round_trips_s(x)
    per_byte = max(x.beta_s_per_byte, 2 * (n - 1) / n * _wire(x))
    return latency + per_byte * size


def two_level_allreduce_s(x: StepInputs, size: float) -> float:
    """An all-reduce over nodes of R ranks: two levels. Inside a node the ranks talk over its
    loopback: no configured delay or rate, only the measured per-collective overhead and
    per-byte cost (the collective calibration runs on the job's own placement, R ranks a node,
    links unshaped). Between nodes the shaped links: their round trips and rate.

    ring (node-major over all W = N R ranks): of its 2(W-1) sequential transfers N/W cross a
    node's link (a round trip each); each link carries 2(W-1)/W of the buffer.
    hierarchical: reduce and broadcast inside each node (the measured per-byte cost on the
    buffer, two more collectives' overhead), and a ring among the N leaders: 2(N-1) round
    trips, 2(N-1)/N of the buffer through each link."""
    w, per = x.workers, max(1, x.ranks_per_node)
    nodes = max(1, w // per)
    if x.collective == "hierarchical":
        if nodes < 2:
            return 2 * x.overhead_s + x.beta_s_per_byte * size
        inside = 2 * x.overhead_s  # the reduce and the broadcast: two more collectives
        if x.framework == "torch":
            return x.overhead_s + inside + x.beta_s_per_byte * size + gloo_ring_s(x, size, nodes, 1, concurrent=False)
        leaders = 2 * (nodes - 1) * 2 * x.delay_s
        per_byte = x.beta_s_per_byte + 2 * (nodes - 1) / nodes * _wire(x)
        return x.overhead_s + inside + x.buckets * leaders + per_byte * size
    crossing = ring_crossings(w, nodes)  # TensorFlow's (torch's ring: allreduce_s, replayed)
    latency = x.overhead_s + x.buckets * crossing * 2 * x.delay_s
    per_byte = max(x.beta_s_per_byte, 2 * (w - 1) / w * _wire(x) if nodes > 1 else 0.0)
    return latency + per_byte * size


# ProcessGroupGloo's worker threads (its Options' default): DDP's bucket all-reduces are
# asynchronous, so up to this many run at once, each on a context (connections) of its own
GLOO_THREADS = 2


def gloo_ring_s(x: StepInputs, size: float, ranks: int, ranks_per_node: int, concurrent: bool = True) -> float:
    """torch's all-reduce of `size` bytes in x.buckets DDP buckets, each a Gloo ring over `ranks`
    ranks (model/gloo_ring.py replays its segments, its two in flight and its receive notes):
    the nodes' links at the point's delay and rate, a node's loopback at the calibration's
    per-byte cost (as link_beta, per hop). DDP's own all-reduce (`concurrent`) runs the buckets
    GLOO_THREADS at a time, so their round trips overlap and the link carries their bytes
    together (measured, 2 x 2 ranks at 20 ms: 254 ms a step with two buckets, one ring's round
    trips); the hierarchical hook waits for each bucket's collectives in turn (the leaders'
    rings measured 169-170 and 214-217 ms at 20 ms and 100 Mbit/s, the replay 169.6 and 214.5)."""
    hop = x.beta_s_per_byte * x.workers / (2 * (x.workers - 1)) if x.workers > 1 else 0.0
    links = gloo_ring.Links(ranks=ranks, ranks_per_node=ranks_per_node, one_way_s=x.delay_s,
                            wire_s_per_byte=_wire(x), local_s_per_byte=hop)
    buckets = max(1, x.buckets)
    rounds = -(-buckets // GLOO_THREADS) if concurrent else buckets
    return rounds * gloo_ring.allreduce_s(size / rounds, links)


def ring_crossings(ranks: int, nodes: int) -> float:
    """Round trips on the nodes' links of one TensorFlow ring all-reduce over `ranks` ranks,
    node-major on `nodes` nodes: it passes each chunk hop after hop (a RecvBuf RPC each), so of
    its 2(W-1) transfers only the N/W that cross a node's link pay a round trip (measured here,
    2 nodes x 2 ranks at 20 ms: 134 ms a step, 3 round trips of 40 ms and the compute). Gloo's
    ring (torch) is replayed instead: gloo_ring_s."""
    if nodes < 2:
        return 0.0
    return 2 * (ranks - 1) * nodes / ranks


def allreduce_floor_s(size_bytes: float, workers: int, delay_s: float, rate_bps: float | None,
                      ring_delays_s: float | None = None) -> float:
    """The ring all-reduce's lower bound: 2(n-1)/n of the bytes through each node's link at the
    configured rate, and 2(n-1) one-way delays (each step of the ring crosses a link once; on a
    per-pair topology `ring_delays_s`, those of its slowest run of hops)."""
    n = workers
    if n < 2:
        return 0.0
    wire = 2 * (n - 1) / n * size_bytes * 8 / rate_bps if rate_bps else 0.0
    return wire + (2 * (n - 1) * delay_s if ring_delays_s is None else ring_delays_s)


def _message(x: StepInputs, size_bytes: float, through_one_link: float = 1.0) -> float:
    """One request-reply transfer of `size_bytes`, `through_one_link` times that many bytes
    crossing the busiest egress."""
    return x.overhead_s + 2 * x.delay_s + link_beta(x) * size_bytes * through_one_link


def _ps(x: StepInputs) -> float:
    """A worker's communication per step against P parameter servers (predict turns the
    workers' overlapping steps into the coordinator's completions, COMPLETIONS): the coordinator's dispatch (a round trip),
    the pull of the variables (each server's egress sends its 1/P to every worker at once) and
    the push of the gradients (the worker's egress sends all of them)."""
    shard = x.model_bytes / max(1, x.ps)
    return 2 * x.delay_s + _message(x, shard, x.workers) + _message(x, x.model_bytes)


# strategy -> seconds of communication per step (a step as its events count it)
PATTERNS: dict[str, Callable[[StepInputs], float]] = {
    "single": lambda x: 0.0,
    "allreduce": allreduce_s,
    "allreduce-accum": allreduce_s,  # one all-reduce per accum_steps batches: a step is one update
    "ps": _ps,
    # netbench's exchange protocol: every worker pushes and pulls each step (ps-ssp: up to S in
    # flight, ps-async: its pipeline, 0 unless set; predict: PIPELINED), easgd every `period` steps, gosgd a
    # push to one peer with probability `p`, adpsgd a model each way per step
    **exchange_model.PATTERNS,
}


# strategies whose step event is a completion at the coordinator, from whichever worker is free
# (jobs/harness/ps.py: duration = the time between completions): W workers overlap their steps
COMPLETIONS = frozenset({"ps"})
# strategies whose workers keep up to `window` exchanges in flight while they compute (ps-ssp: S,
# ps-async: its pipeline, 0 by default: one push in flight; jobs/harness/exchange_loop.py): a step is a round trip shared
# by window + 1 steps, never less than its computing with its own per-byte work or what its busier
# direction carries per step
# (exchange_model.pipelined_s: the egress, and a window per round trip on each connection)
PIPELINED = frozenset({"ps-ssp", "ps-async"})


def predict(x: StepInputs) -> Prediction | None:
    """The step's time, or None where the model does not apply (unknown strategy, no size).
    With a measured base step (the exchange strategies): that step plus what the point adds to
    the model's own unshaped step (its round trips, its bytes at the rate, its nodes' CPU
    limits and step delays), so the per-step work the parts miss is counted once, as measured."""
    if x.base_step_s is not None and x.strategy in exchange_model.STRATEGIES:
        here = predict(replace(x, base_step_s=None))
        unshaped = predict(replace(x, base_step_s=None, delay_s=0.0, rate_bps=None, ring_rtts_s=(),
                                   node_slowdown=(), node_delay_s=()))
        if here is None or unshaped is None:
            return here
        return replace(here, step_s=x.base_step_s + here.step_s - unshaped.step_s)
    pattern = PATTERNS.get(x.strategy)
    if pattern is None or x.compute_s <= 0 or (x.model_bytes <= 0 and x.strategy != "single"):
        return None
    batches = max(1, x.accum_steps) if x.strategy == "allreduce-accum" else 1
    comm = pattern(x)
    compute = node_compute_s(x, x.compute_s * batches, min(comm, cpu_comm_s(x)))
    floor = compute + (allreduce_floor_s(x.model_bytes, x.workers, x.delay_s, x.rate_bps, ring_round_trips_s(x) / 2)
                       if x.strategy.startswith("allreduce") else 0.0)
    if x.ranks_per_node > 1 and x.strategy.startswith("allreduce"):  # only the nodes' links bound it
        nodes = max(1, x.workers // x.ranks_per_node)
        floor = compute + ranks.internode_bytes(x.collective, nodes, x.ranks_per_node, x.model_bytes) * _wire(x)
    step = compute + comm
    if x.strategy in COMPLETIONS:  # W steps in flight; a server's egress sends its shard every step
        shard = x.model_bytes / max(1, x.ps)
        step = max(step / max(1, x.workers), link_beta(x) * shard)
        floor = shard * _wire(x)
    elif x.strategy in PIPELINED:
        depth = 1 + max(0.0, float(x.params.get("window", 0)))
        step = max(compute + exchange_model.worker_bytes_s(x), step / depth, exchange_model.pipelined_s(x))
        floor = compute + exchange_model.pipelined_floor_s(x)
    return Prediction(step_s=step, compute_s=compute, comm_s=comm, floor_s=floor)


# strategies whose every step waits for every worker's gradient: the slowest node bounds the step
SYNCHRONOUS = frozenset({"allreduce", "allreduce-accum", "ps-sync", "single"})


def cpu_comm_s(x: StepInputs) -> float:
    """The CPU work of a step's communication: its bytes at the per-byte cost measured on unshaped
    links (there the CPU, not the link, sets it): the all-reduce's slope, or the exchange
    protocol's for a model pushed and pulled. A node's CPU limit slows it as it slows compute."""
    if x.exchange_beta_s_per_byte is not None and x.strategy in exchange_model.PATTERNS:
        return x.exchange_beta_s_per_byte * 2 * x.model_bytes
    return x.beta_s_per_byte * x.model_bytes


def node_compute_s(x: StepInputs, compute_s: float, cpu_comm: float = 0.0) -> float:
    """A step's compute with unequal nodes: each worker's CPU work (`compute_s` and the
    communication's `cpu_comm`) times its slowdown, plus its step delay, less the `cpu_comm` the
    communication term already counts; the slowest worker's in a synchronous strategy (every step
    waits for it; ps-sync with B backup workers: the (W - B)-th fastest's, as a round closes on its
    first W - B gradients; ps-ssp: the slowest's too, its gate keeps every worker within S steps
    of it), worker 0's in the own-pace exchange strategies (job.OWN_PACE_STRATEGIES: the prediction
    is set beside the chief's measured steps; the cluster's images/sec is the sum of the workers'
    own rates, jobs/analysis.cluster_throughput), the mean in TF's ps (its coordinator counts
    every worker's completions)."""
    if not x.node_slowdown and not x.node_delay_s:
        return compute_s
    count = max(len(x.node_slowdown), len(x.node_delay_s))
    slow = tuple(x.node_slowdown) + (1.0,) * (count - len(x.node_slowdown))
    delay = tuple(x.node_delay_s) + (0.0,) * (count - len(x.node_delay_s))
    each = [(compute_s + cpu_comm) * s + d - cpu_comm for s, d in zip(slow, delay)]
    if x.strategy == "ps-sync" and 0 < x.backup_workers < len(each):
        return sorted(each)[len(each) - 1 - x.backup_workers]  # the round's last gradient it waits for
    if x.strategy in SYNCHRONOUS or x.strategy == "ps-ssp":  # ps-ssp: the gate holds all within S of the slowest
        return max(each)
    if x.strategy in OWN_PACE_STRATEGIES:
        return each[0]
    return sum(each) / len(each)  # TF's ps: the coordinator counts any worker's completions  # at its own pace: the chief's (worker 0's), whose steps the prediction is set beside


# what the model leaves out, each a results.csv `predicted_omits` entry: a point outside 25 %
# that carries one says why (docs/background/step-model.md, "Where it stops holding")
OMITS_LOSS = "loss: TCP's recovery and timeouts"
OMITS_JITTER = "jitter"
OMITS_QUOTA = "cpu quota: 1/c assumes the node kept a whole core busy unlimited"


def omitted(x: StepInputs, loss: float = 0.0, jitter_s: float = 0.0) -> tuple[str, ...]:
    """The terms of a point the model does not cover, in a fixed order: loss (TCP's recovery is
    not modelled), jitter (ignored), and a CPU quota on a worker's node (its slowdown is 1/c on
    the assumption that the node kept a whole core busy unlimited: one that kept less, as when
    more workers than cores share the machine, is slowed less; one whose threads kept more, more:
    ps-sync with n3 at 0.2 CPU measured 0.75 of the prediction at batch 64 and 1.15 at 1024)."""
    out = []
    if loss > 0:
        out.append(OMITS_LOSS)
    if jitter_s > 0:
        out.append(OMITS_JITTER)
    if any(s != 1.0 for s in x.node_slowdown):
        out.append(OMITS_QUOTA)
    return tuple(out)


def within(measured_s: float, predicted_s: float, tolerance: float = 0.25) -> bool:
    """Whether a measured step is within `tolerance` (relative) of the predicted one."""
    return predicted_s > 0 and abs(measured_s / predicted_s - 1) <= tolerance
